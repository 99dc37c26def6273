"""TP=1 and TP=2 (two gloo processes on CPU) give the same logits, the same exported adapter, the
same adapter after a training step (also gathered from a CPU copy, as the updater does), and TP=2
checkpoints (full, and adapter-only) resume into TP=1 with the adapter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aclarena_slime.lora import LoraConfig, inject_lora
from aclarena_slime.lora.layers import lora_modules
from aclarena_slime.lora.selftest import build_tiny_gpt, free_port, model_parallel

pytestmark = pytest.mark.slow  # two processes and a checkpoint round trip: ~40 s on 2 cores

WORKER = Path(__file__).with_name("tp_worker.py")
sys.path.insert(0, str(WORKER.parent))
import tp_worker  # noqa: E402


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tp")
    with model_parallel():
        model = build_tiny_gpt(tp_worker.SHAPE, seed=0)
        torch.save({k: v.detach().clone() for k, v in model.named_parameters()}, workdir / "backbone.pt")
        tp1 = tp_worker.adapted_run(model, 0, 1, workdir / "tp1")
    port = str(free_port())
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(r), "2", port, str(workdir)], stderr=subprocess.PIPE)
        for r in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err.decode()[-3000:]
    return workdir, tp1, [torch.load(workdir / f"rank{r}.pt") for r in range(2)]


def test_same_logits(tp_runs):
    _, tp1, ranks = tp_runs
    for result in ranks:
        torch.testing.assert_close(result["logits"], tp1["logits"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("which", ["peft", "peft_after_step", "peft_from_copy"])
def test_same_exported_adapter(tp_runs, which):
    """``peft_from_copy``: the updater's gather from slime's CPU copy, with the live adapter NaN."""
    _, tp1, ranks = tp_runs
    expected = tp1["peft_after_step" if which == "peft_from_copy" else which]
    for result in ranks:
        assert result[which].keys() == expected.keys()
        for key, tensor in expected.items():
            torch.testing.assert_close(result[which][key], tensor, atol=1e-6, rtol=1e-5, msg=key)
    changed = any(not torch.equal(tp1["peft"][k], tp1["peft_after_step"][k]) for k in tp1["peft"])
    assert changed, "the training step did not move the adapter"


def test_written_adapter_matches(tp_runs):
    from safetensors.torch import load_file

    workdir, tp1, _ = tp_runs
    written = load_file(workdir / "adapter" / "adapter_model.safetensors")
    assert written.keys() == tp1["peft"].keys()
    assert all(torch.allclose(written[k], v, atol=1e-6) for k, v in tp1["peft"].items())


def test_tp2_checkpoint_resumes_at_tp1(tp_runs):
    from megatron.core import dist_checkpointing

    workdir, tp1, _ = tp_runs
    with model_parallel():
        model = build_tiny_gpt(tp_worker.SHAPE, seed=99)  # different backbone: everything must come from disk
        inject_lora(model, LoraConfig(rank=4, alpha=8))
        with tp_worker.no_cuda_sync():
            state = dist_checkpointing.load(model.sharded_state_dict(), str(workdir / "ckpt_tp2"))
        model.load_state_dict(state)
        from aclarena_slime.lora.export import AttentionShape, gather_adapter, to_peft_state_dict

        resumed = to_peft_state_dict(gather_adapter(model), AttentionShape.from_megatron(model.config))
        assert next(lora_modules(model)).lora_B.weight.abs().sum() > 0
    for key, tensor in tp1["peft_after_step"].items():
        torch.testing.assert_close(resumed[key], tensor, atol=1e-6, rtol=1e-5, msg=key)


def test_tp2_adapter_only_checkpoint_resumes_at_tp1(tp_runs):
    from aclarena_slime.lora.checkpoint import load_adapter_checkpoint
    from aclarena_slime.lora.export import AttentionShape, gather_adapter, to_peft_state_dict

    workdir, tp1, _ = tp_runs
    with model_parallel():
        model = build_tiny_gpt(tp_worker.SHAPE, seed=0)
        inject_lora(model, LoraConfig(rank=4, alpha=8))
        with tp_worker.no_cuda_sync():
            assert load_adapter_checkpoint(workdir / "adapter_ckpt_tp2", [model], None) == 5
        resumed = to_peft_state_dict(gather_adapter(model), AttentionShape.from_megatron(model.config))
    for key, tensor in tp1["peft_after_step"].items():
        torch.testing.assert_close(resumed[key], tensor, atol=1e-6, rtol=1e-5, msg=key)
