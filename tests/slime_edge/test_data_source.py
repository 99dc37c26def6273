"""A resumed LoRA stage reads its own prompt position, never the backbone stage's (issue 27 item 5).

slime's data source saves under ``--save`` and loads from ``--load`` (slime/rollout/data_source.py at 624b824);
a LoRA stage's ``--load`` is the SDFT folder. ``SlimeRolloutSource`` mirrors slime's save / load for the CPU
tests; the ``slime`` test runs the same story on slime's own ``RolloutDataSourceWithBuffer``.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aclarena_slime.lora.checkpoint import adapter_checkpoint_root
from aclarena_slime.slime_edge.data_source import ResumableDataSource, state_dir


class SlimeRolloutSource:
    """slime's ``RolloutDataSource`` position bookkeeping, line for line: save under args.save, load from args.load."""

    def __init__(self, args):
        self.args, self.sample_offset = args, 0

    def get_samples(self, num_samples):
        self.sample_offset += num_samples
        return [[object()] for _ in range(num_samples)]

    def add_samples(self, samples):
        raise RuntimeError("read-only")

    def save(self, rollout_id):
        path = os.path.join(self.args.save, f"rollout/global_dataset_state_dict_{rollout_id}.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save({"sample_offset": self.sample_offset}, path)

    def load(self, rollout_id=None):
        if self.args.load is None:
            return
        path = os.path.join(self.args.load, f"rollout/global_dataset_state_dict_{rollout_id}.pt")
        if os.path.exists(path):
            self.sample_offset = torch.load(path).get("sample_offset", 0)

    def __len__(self):
        return 0


def _args(tmp_path: Path, **extra) -> SimpleNamespace:
    """A LoRA stage on the SDFT backbone; the backbone's own run left its data position at rollout 4."""
    sdft = tmp_path / "sdft"
    backbone = SlimeRolloutSource(SimpleNamespace(save=str(sdft)))
    backbone.sample_offset = 999
    backbone.save(4)
    values = dict(save=str(tmp_path / "mle"), load=str(sdft), aclarena_lora={"rank": 16}, rollout_global_dataset=True)
    return SimpleNamespace(**{**values, **extra})


def _adapter_checkpoint(save: str, iteration: int) -> None:
    """What aclarena_slime.lora.checkpoint leaves after a save: the iteration folder and the tracker."""
    root = adapter_checkpoint_root(save)
    (root / f"iter_{iteration:07d}").mkdir(parents=True)
    (root / "latest").write_text(f"{iteration}\n")


def _run_until_crash(args, make) -> None:
    """Rollouts 0..4 (8 prompts each), slime saving the position and the adapter at rollout 4, then the crash."""
    source = ResumableDataSource(args, make)
    source.load(-1)  # slime: rollout_manager.load(start_rollout_id - 1), start 0
    for _ in range(5):
        source.get_samples(8)
    source.save(4)
    _adapter_checkpoint(args.save, 4)


def test_slimes_own_source_adopts_the_backbones_position(tmp_path):
    """The defect, on the mirror of slime's class: a resumed stage loading rollout 4 takes the SDFT offsets."""
    args = _args(tmp_path)
    source = SlimeRolloutSource(args)
    source.load(4)
    assert source.sample_offset == 999


def test_a_resumed_lora_stage_reads_its_own_position(tmp_path):
    args = _args(tmp_path)
    _run_until_crash(args, SlimeRolloutSource)
    resumed = ResumableDataSource(args, SlimeRolloutSource)
    resumed.load(4)  # the adapter resumed at iteration 4: slime starts at 5 and loads 4
    assert resumed.source.sample_offset == 40
    assert args.load == str(tmp_path / "sdft")  # slime's args untouched: Megatron still loads the backbone


def test_a_fresh_lora_stage_never_reads_another_stages_position(tmp_path):
    args = _args(tmp_path)
    fresh = ResumableDataSource(args, SlimeRolloutSource)
    fresh.load(4)  # even where the ids coincide
    assert fresh.source.sample_offset == 0 and state_dir(args) is None


def test_a_full_fine_tuning_stage_keeps_slimes_rule(tmp_path):
    args = _args(tmp_path, aclarena_lora=None)
    assert state_dir(args) == args.load


@pytest.mark.slime
def test_on_slimes_rollout_data_source_with_buffer(tmp_path, tiny_checkpoint):
    import json

    from slime.rollout.data_source import RolloutDataSourceWithBuffer

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}", "label": str(i)}) + "\n" for i in range(100)))
    args = _args(
        tmp_path, prompt_data=str(prompts), hf_checkpoint=str(tiny_checkpoint), buffer_filter_path=None,
        n_samples_per_prompt=2, rollout_shuffle=False, dump_details=None, rollout_max_prompt_len=None,
        input_key="prompt", multimodal_keys=None, label_key="label", metadata_key="metadata", tool_key=None,
        apply_chat_template=False, apply_chat_template_kwargs={}, rollout_seed=42,
    )  # fmt: skip
    plain = RolloutDataSourceWithBuffer(args)
    plain.load(4)
    assert plain.sample_offset == 999  # slime alone: the backbone's offsets
    _run_until_crash(args, RolloutDataSourceWithBuffer)
    resumed = ResumableDataSource(args)
    assert isinstance(resumed.source, RolloutDataSourceWithBuffer)
    resumed.load(4)
    assert resumed.source.sample_offset == 40
    assert len(resumed.get_samples(1)[0]) == 2  # and it serves groups as slime's does
