"""A verifiers env's dataset as slime JSONL: ``aclarena data prepare verifiers --env-id MODULE ...``.

Each row of the env's dataset (its ``prompt`` messages, system prompt and few-shot included, its ``answer``,
``info`` and ``example_id``) becomes a record ``{"prompt": messages, "label": answer, "metadata": {"env":
"verifiers", "env_id", "example_id", "info"}}``; the env turns it back into verifiers' rollout input. The
same seed gives the same records (verifiers shuffles with it).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import write_jsonl_atomic

TAG = "verifiers"
EXTRA = "pip install -e '.[verifiers]'"


def load(env_id: str, env_args: Mapping[str, Any]) -> Any:
    """``verifiers.load_environment``: the env module's ``load_environment(**env_args)``."""
    try:
        import verifiers
    except ImportError as exc:
        raise ImportError(f"the verifiers env needs the verifiers package: {EXTRA}") from exc
    return verifiers.load_environment(env_id, **dict(env_args))


def _plain(message: Any) -> dict[str, Any]:
    """A dataset message without the null fields Arrow adds for the keys other messages have."""
    return {k: v for k, v in dict(message).items() if v is not None}


def records(vf_env: Any, n: int, seed: int = 0, split: str = "train", tag: str = TAG) -> list[dict[str, Any]]:
    """Up to ``n`` records from the env's ``train`` dataset (or ``eval``), shuffled with ``seed``."""
    rows = vf_env.get_dataset(n=n, seed=seed) if split == "train" else vf_env.get_eval_dataset(n=n, seed=seed)
    env_id = getattr(vf_env, "env_id", "") or ""
    out = []
    for i, row in enumerate(rows):
        prompt = row["prompt"]
        prompt = [_plain(m) for m in prompt] if isinstance(prompt, list) else str(prompt)
        metadata: dict[str, Any] = {"env": tag, "index": i, "env_id": env_id, "example_id": int(row.get("example_id", i))}
        info = row.get("info")
        if isinstance(info, str) and info:
            info = json.loads(info)
        if info:
            metadata["info"] = info
        answer = row.get("answer")
        out.append({"prompt": prompt, "label": None if answer is None else str(answer), "metadata": metadata})
    return out


def main(argv: list[str]) -> int:
    """``aclarena data prepare verifiers --env-id MODULE --output FILE [--env-args JSON] [--n N] [--seed S] [--split train|eval]``."""
    parser = argparse.ArgumentParser(prog="aclarena data prepare verifiers", description=main.__doc__)
    parser.add_argument("--env-id", required=True, help="the installed env module (its load_environment builds the env)")
    parser.add_argument("--env-args", type=json.loads, default={}, help="load_environment's keyword arguments, as JSON")
    parser.add_argument("--output", type=Path, required=True, help="slime JSONL to write")
    parser.add_argument("--n", type=int, default=-1, help="records to write (-1: the whole dataset)")
    parser.add_argument("--seed", type=int, default=0, help="verifiers shuffles the dataset with it")
    parser.add_argument("--split", choices=("train", "eval"), default="train")
    args = parser.parse_args(argv)
    written = write_jsonl_atomic(records(load(args.env_id, args.env_args), args.n, args.seed, args.split), args.output)
    print(json.dumps({"written": written, "output": str(args.output), "env_id": args.env_id}))
    return 0
