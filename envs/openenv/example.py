"""A small OpenEnv environment server to try the bridge with: guess a number from 1 to 50, told higher or lower.

A real OpenEnv server (``openenv.core.env_server.create_app``; the ``openenv`` extra), served by uvicorn:
``python -m uvicorn aclarena_envs.openenv.example:app --port 8010`` (``recipes/service/openenv.yaml`` starts
it for a stage). Reward: 1.0 on the step that guesses right (the episode ends there), 0.0 otherwise. The
secret comes from ``reset(seed=...)``. Sessions are independent, so the server takes up to 64 at once.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

HIGHEST = 50


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    feedback: str = ""


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.secret, self._state = 0, State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> GuessObservation:
        self.secret = random.Random(seed).randint(1, HIGHEST)
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        return GuessObservation(feedback=f"I picked a number from 1 to {HIGHEST}. Reply with your guess, a number.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **_: Any) -> GuessObservation:
        self._state.step_count += 1
        text = action.message.strip()
        if not text.isdigit() or len(text) > 3:
            return GuessObservation(feedback="That is not a number from 1 to 50.", reward=0.0)
        guess = int(text)
        if guess == self.secret:
            return GuessObservation(feedback="Right!", reward=1.0, done=True)
        return GuessObservation(feedback="Higher." if guess < self.secret else "Lower.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
