"""aclarena-slime: agent continual learning on the Slime RL framework."""

__version__ = "0.1.0"
