"""OpenEnv environment servers as aclarena envs (the client speaks their protocol; the ``openenv`` extra serves one)."""
