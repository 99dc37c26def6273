"""Publishing a trained adapter to the engine: the checksum the engine checks is the one of what was meant to be
written (the tensors in memory), so a file cut short on its way to disk is refused, never served."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from aclarena_slime.adapter_swap import AdapterSwapError, verify_checksum
from aclarena_slime.local import stage as stage_module
from aclarena_slime.local import trainer as trainer_module
from aclarena_slime.local.trainer import PolicyTrainer
from aclarena_slime.testing.local import LEARNABLE, local_session


def test_a_truncated_adapter_file_fails_the_checksum_the_engine_checks(tiny_model_dir, tmp_path, monkeypatch):
    session = local_session(tmp_path, *LEARNABLE, "++cluster.local.progress=false")
    policy = session.policy
    trainer = PolicyTrainer.build(tiny_model_dir, policy.train, policy.lora, seed=0)
    publish = trainer_module.publish_folder

    def truncating(written: Path, directory: Path) -> None:  # a short write: the disk keeps half the weights
        weights = written / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        publish(written, directory)

    monkeypatch.setattr(trainer_module, "publish_folder", truncating)
    monkeypatch.setattr(stage_module, "publish_folder", truncating, raising=False)
    sent: dict[str, str] = {}

    async def swap(clients, name, folder, *, checksum, **_):
        sent["checksum"] = checksum

    monkeypatch.setattr(stage_module, "swap_adapter", swap)
    context = SimpleNamespace(client=lambda: None, env_configs={"learnable": {}}, experts=None)
    served = SimpleNamespace(context=context)
    asyncio.run(stage_module.serve_policy(served, trainer, policy.name, session.paths.adapter_dir, loaded=False))
    with pytest.raises(AdapterSwapError, match="checksum"):
        verify_checksum(session.paths.adapter_dir, sent["checksum"])  # the engine's own check refuses the cut file


class _BaseTokenizer:
    """A base model's tokenizer: no chat end-of-turn token (``convert_tokens_to_ids`` gives None, as a fast
    tokenizer without an unknown token does), eos 7."""

    eos_token_id = 7

    def get_vocab(self) -> dict[str, int]:
        return {"a": 1, "</s>": 7}

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.get_vocab().get(token)


def test_one_end_of_turn_rule_closes_every_gold_demo_turn(tiny_model_dir):
    from transformers import AutoTokenizer

    from aclarena_slime.local.demos import DemoError, end_of_turn

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert end_of_turn(tokenizer) == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn(_BaseTokenizer()) == 7  # the arena's base once took int(None) here: a TypeError
    no_eos = _BaseTokenizer()
    no_eos.eos_token_id = None
    with pytest.raises(DemoError, match="eos"):
        end_of_turn(no_eos)


def test_the_engine_factory_serves_the_model_with_its_adapters(tiny_model_dir, adapter_dir):
    from aclarena_slime.local.engine import open_engine

    engine = open_engine(tiny_model_dir, served_name="tiny", adapters={"expert": adapter_dir})
    assert engine.served_name == "tiny" and engine.tokenizer is engine.chat.tokenizer
    state = {k: v.clone() for k, v in engine.model.base.state_dict().items()}
    first = next(iter(state))
    state[first].fill_(0.5)
    engine.update_weights(state)  # full fine-tuning's one way in
    assert bool((engine.model.base.state_dict()[first] == 0.5).all())
    assert "expert" in engine.model.adapters


def test_the_warm_start_key_holds_what_the_warm_start_reads(tmp_path):
    """A changed data file is a new warm start though no setting changed (the old key, every setting but a
    list of 32, reused the stale backbone); a setting only the RL phase reads keeps the cached one."""
    import json

    from aclarena_envs.learnable.env import LearnableEnvironment
    from aclarena_slime.plugin import registry

    registry.register("learnable", LearnableEnvironment)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"question {i}", "label": "a"}) + "\n" for i in range(12)))
    cfg = (*LEARNABLE, f"++cluster.local.data_path={data}", "++cluster.local.eval_size=0",
           "++cluster.local.warm_start_steps=2", "++cluster.local.warm_start_records=4",
           "++cluster.local.warm_start_demos=json.dumps", "++cluster.local.progress=false")  # fmt: skip
    session = local_session(tmp_path, *cfg)
    folder = session.paths.warm_start_dir
    records = asyncio.run(stage_module.offline_records(session.records, session.engine.served_name))
    key = stage_module.warm_start_key(session, records)
    folder.mkdir(parents=True)
    (folder / stage_module.WARM_START_RECORD).write_text(json.dumps({"key": key, "warm_start": {"x": 1}}))
    assert asyncio.run(stage_module.cached_warm_start(session)) == {"x": 1}
    rl_only = local_session(tmp_path, *cfg, "rollout.num_rollout=3", "algorithm.lr=5e-3", "algorithm.eps_clip_high=0.3")
    assert asyncio.run(stage_module.cached_warm_start(rl_only)) == {"x": 1}
    data.write_text("".join(json.dumps({"prompt": f"another {i}", "label": "b"}) + "\n" for i in range(12)))
    assert asyncio.run(stage_module.cached_warm_start(session)) is None


def test_a_published_adapter_is_the_peft_folder_a_chained_stage_continues(tiny_model_dir, tmp_path):
    import torch

    policy = local_session(tmp_path, *LEARNABLE, "++cluster.local.progress=false").policy
    trainer = PolicyTrainer.build(tiny_model_dir, policy.train, policy.lora, seed=0)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.add_(0.01)  # a trained expert: B is no longer 0
    stage_module.write_folder(tmp_path / "adapter", stage_module.adapter_files(trainer.model))
    chained = PolicyTrainer.build(tiny_model_dir, policy.train, policy.lora, tmp_path / "adapter", 1)
    mine = {n: p for n, p in trainer.model.named_parameters() if "lora" in n}
    theirs = {n: p for n, p in chained.model.named_parameters() if "lora" in n}
    assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_the_stage_reads_the_engines_count_through_its_http_api(tiny_model_dir, tmp_path):
    """The stage's metrics take the engine's generated tokens from ``/server_info``, as from SGLang, not from the
    engine object."""
    session = local_session(tmp_path, *LEARNABLE)

    async def run() -> tuple[int, int, int]:
        served = stage_module.served_stage(session.engine, tiny_model_dir, 0, lambda url, name: {"learnable": {}})
        async with served as stage:
            before = await stage.generated_tokens()
            params = {"max_new_tokens": 5, "ignore_eos": True, "temperature": 1.0}
            await stage.context.client().generate([5, 6, 7], params, return_logprob=False)
            return before, await stage.generated_tokens(), stage.engine.generated_tokens

    before, after, counted = asyncio.run(run())
    assert (before, after) == (0, 5) and after == counted
