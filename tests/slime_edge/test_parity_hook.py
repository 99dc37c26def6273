"""The train-side parity hooks on slime's shapes: the TIS call every LoRA recipe compiles (the loss's own
forward, one optimiser step per rollout) and the rollout-data hook (slime's separate recompute; slime's CP
slicer stood in at CP 1). With real slime, ``policy_loss_function`` itself calls the compiled hook."""

from __future__ import annotations

import importlib
import sys
import types
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from aclarena_slime import parity
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import load_recipe
from aclarena_slime.slime_edge import parity as hook

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(hook, "_state", hook._State())


@pytest.fixture
def cp_slicer(monkeypatch):
    # slime.backends.megatron_utils.cp_utils.slice_log_prob_with_cp returns its input at CP size 1.
    cp_utils = types.ModuleType("slime.backends.megatron_utils.cp_utils")
    cp_utils.slice_log_prob_with_cp = lambda values, total, response: values
    for name in ("slime", "slime.backends", "slime.backends.megatron_utils"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, cp_utils.__name__, cp_utils)


def _data(gap: float) -> dict:
    engine = [torch.tensor([-0.5, 0.0, -1.25]), torch.tensor([-2.0])]
    return {
        "rollout_log_probs": engine,
        "log_probs": [engine[0] + gap, engine[1] + gap],
        "loss_masks": [torch.tensor([1, 0, 1], dtype=torch.int), torch.tensor([1], dtype=torch.int)],
        "total_lengths": [7, 5],
        "response_lengths": [3, 1],
    }


def _tis_call(function, args: Namespace, gap: float):
    """What slime's policy_loss_function passes its TIS function (loss.py: tis_func(**tis_kwargs))."""
    data = _data(gap)
    pg_loss = torch.tensor([0.3, -0.1, 0.7, 0.2])
    out = function(
        args=args,
        pg_loss=pg_loss,
        train_log_probs=data["log_probs"],
        rollout_log_probs=data["rollout_log_probs"],
        loss_masks=data["loss_masks"],
        total_lengths=data["total_lengths"],
        response_lengths=data["response_lengths"],
    )
    return pg_loss, data["loss_masks"], out


def _compiled_tis_function(tmp_path: Path, recipe: str):
    """The compiled recipe's TIS function, loaded by its dotted path as slime's load_function does."""
    args = compile_recipe(load_recipe(RECIPES / recipe, [f"paths.root={tmp_path}"])).train_args
    assert "--use-tis" in args, "slime calls the TIS function only with --use-tis"
    module, _, name = args[args.index("--custom-tis-function-path") + 1].rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("recipe", ["mle_math.yaml", "mle_parallel.yaml", "mle_retail_async.yaml"])
def test_a_compiled_lora_recipe_stops_before_the_update_on_a_mismatch(tmp_path: Path, recipe: str):
    """mle_math and mle_parallel take one optimiser step per rollout with GRPO: slime reuses the loss's forward,
    and the TIS call is the one place that sees it before the update."""
    function = _compiled_tis_function(tmp_path, recipe)
    with pytest.raises(parity.ParityError, match="3 tokens"):
        _tis_call(function, Namespace(context_parallel_size=1), 0.2)  # CP 1: no slime here


def test_the_in_loss_check_returns_the_loss_unweighted_and_checks_once_a_rollout(capsys):
    args = Namespace(context_parallel_size=1)
    pg_loss, masks, (out_loss, out_masks, metrics) = _tis_call(hook.check_in_loss, args, 0.01)
    assert out_loss is pg_loss and out_masks is masks and metrics == {}
    assert "the loss's own forward: log-prob parity ok" in capsys.readouterr().out
    _tis_call(hook.check_in_loss, args, 5.0)  # once a rollout: later micro-batches train on
    hook._state = hook._State()
    empty = [torch.zeros(3, dtype=torch.int), torch.zeros(1, dtype=torch.int)]  # samples slime removed
    hook.check_in_loss(args, pg_loss=torch.zeros(4), train_log_probs=_data(5.0)["log_probs"],
                       rollout_log_probs=_data(0.0)["rollout_log_probs"], loss_masks=empty,
                       total_lengths=[7, 5], response_lengths=[3, 1])  # fmt: skip
    assert hook._state.checked == hook._UNSEEN, "nothing to compare: the next micro-batch is checked"
    hook._state = hook._State()
    _tis_call(hook.check_in_loss, Namespace(aclarena_parity={"ceiling": 0.25}), 0.2)


def test_every_rollout_is_checked_against_the_limit_its_first_calibrated(capsys):
    """Rollout 0 (B = 0) only calibrates, up to the ceiling; later rollouts stay under ratio x its gap."""
    args = Namespace(context_parallel_size=1, aclarena_parity={"ratio": 4.0, "floor": 0.002})
    hook.on_rollout(args, 0, {})
    _tis_call(hook.check_in_loss, args, 0.01)
    hook.on_rollout(args, 1, {})
    _tis_call(hook.check_in_loss, args, 0.03)  # within 4 x 0.01
    hook.on_rollout(args, 2, {})
    with pytest.raises(parity.ParityError, match=r"rollout 2.*tolerance 0.04.*calibrated on 0.01"):
        _tis_call(hook.check_in_loss, args, 0.045)  # under the old fixed 0.05, above the calibrated 0.04
    out = capsys.readouterr().out
    assert "rollout 0" in out and "[calibrating]" in out and "rollout 1" in out and "[calibrated]" in out


def test_with_enforce_off_every_gap_is_logged_and_nothing_stops(capsys):
    args = Namespace(context_parallel_size=1, aclarena_parity={"enforce": False})
    for rollout, gap in enumerate((0.01, 5.0, 7.0)):
        hook.on_rollout(args, rollout, {})
        _tis_call(hook.check_in_loss, args, gap)
    assert capsys.readouterr().out.count("FAILED") == 2


def test_parallel_experts_are_calibrated_and_stopped_apart(monkeypatch):
    """One expert's bad sync stops the job naming that expert, though the batch's mean gap is small."""
    from aclarena_slime.lora import routing

    args = Namespace(context_parallel_size=1, aclarena_lora={"experts": ["math", "search"]})
    monkeypatch.setitem(routing._last, "index", [0, 1])  # the forward's samples: math, then search
    hook.on_rollout(args, 0, {})
    _tis_call(hook.check_in_loss, args, 0.001)
    hook.on_rollout(args, 1, {})
    data = _data(0.001)
    data["log_probs"][1] = data["rollout_log_probs"][1] + 0.04  # search's one token
    with pytest.raises(parity.ParityError, match="expert search"):
        hook.check_in_loss(args, pg_loss=torch.zeros(4), train_log_probs=data["log_probs"],
                           rollout_log_probs=data["rollout_log_probs"], loss_masks=data["loss_masks"],
                           total_lengths=[7, 5], response_lengths=[3, 1])  # fmt: skip
    assert [line.split(":")[0] for line in hook._state.lines] == [
        "rollout 0, first micro-batch, the loss's own forward, expert math",
        "rollout 0, first micro-batch, the loss's own forward, expert search",
        "rollout 1, first micro-batch, the loss's own forward, expert math",
    ]


def test_parallel_experts_without_an_index_are_refused(monkeypatch):
    from aclarena_slime.lora import routing

    monkeypatch.setitem(routing._last, "index", None)  # no routing hook ran: experts cannot be told apart
    args = Namespace(context_parallel_size=1, aclarena_lora={"experts": ["math", "search"]})
    with pytest.raises(parity.ParityError, match="no adapter index per sample"):
        _tis_call(hook.check_in_loss, args, 0.0)


def test_first_batch_within_tolerance_passes_and_the_rollout_is_not_rechecked(capsys, cp_slicer):
    args = types.SimpleNamespace()
    hook.on_rollout(args, 0, _data(0.01))
    assert "rollout 0: log-prob parity ok" in capsys.readouterr().out
    _tis_call(hook.check_in_loss, Namespace(context_parallel_size=1), 5.0)  # rollout 0 was checked above


def test_a_gap_above_the_tolerance_stops_the_job(cp_slicer):
    with pytest.raises(parity.ParityError, match="3 tokens"):
        hook.on_rollout(types.SimpleNamespace(), 0, _data(0.2))
    ok = types.SimpleNamespace(aclarena_parity={"ceiling": 0.25})
    hook._state = hook._State()
    hook.on_rollout(ok, 0, _data(0.2))


def test_the_separate_recompute_is_compared_per_expert(cp_slicer):
    from aclarena_slime.lora.routing import ADAPTER_INDEX_KEY

    args = types.SimpleNamespace(aclarena_lora={"experts": ["math", "search"]})
    data = {**_data(0.01), "multimodal_train_inputs": [{ADAPTER_INDEX_KEY: torch.tensor([1])},
                                                        {ADAPTER_INDEX_KEY: torch.tensor([0])}]}  # fmt: skip
    hook.on_rollout(args, 0, data)
    assert [line.split(": ")[0] for line in hook._state.lines] == ["rollout 0, expert search", "rollout 0, expert math"]


def test_without_a_recompute_the_rollout_waits_for_the_loss_call():
    data = _data(0.0)
    del data["log_probs"]  # slime reused the loss's forward (one optimiser step per rollout)
    hook.on_rollout(types.SimpleNamespace(), 3, data)
    assert hook._state.rollout == 3 and hook._state.checked == hook._UNSEEN and not hook._state.lines


def test_a_lora_recipe_with_tis_keeps_its_correction_and_checks_the_recompute(tmp_path: Path):
    recipe = load_recipe(RECIPES / "mle_math.yaml", [f"paths.root={tmp_path}", "++algorithm.use_tis=true"])
    args = compile_recipe(recipe).train_args
    assert args[args.index("--rollout-data-postprocess-path") + 1] == "aclarena_slime.slime_edge.parity.on_rollout"
    assert (
        "--custom-tis-function-path" not in args or "parity" not in args[args.index("--custom-tis-function-path") + 1]
    )


@pytest.fixture
def megatron_single_rank():
    """A one-process gloo group with Megatron's parallel state: what slime's loss reads on CPU."""
    import os

    import torch.distributed as dist
    from megatron.core import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29547")
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.mark.slime
def test_inside_real_slime_policy_loss_the_check_reads_the_loss_forward_and_leaves_the_loss_alone(megatron_single_rank):
    """slime's own policy_loss_function with no separate recompute (``log_probs`` None: it reuses the loss's
    forward, one optimiser step per rollout) calls the compiled TIS hook before any backward."""
    from slime.backends.megatron_utils.cp_utils import get_sum_of_sample_mean
    from slime.backends.megatron_utils.loss import policy_loss_function

    from aclarena_slime.slime_edge import path as hook_path

    def args(use_tis: bool) -> Namespace:
        return Namespace(
            use_opsm=False, advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=None,
            get_mismatch_metrics=False, use_tis=use_tis, custom_tis_function_path=hook_path("parity_in_loss"),
            calculate_per_token_loss=False, custom_pg_loss_reducer_function_path=None, entropy_coef=0.0,
            use_kl_loss=False, use_unbiased_kl=False, kl_loss_type="low_var_kl", kl_loss_coef=0.0,
            use_rollout_logprobs=False, rollout_temperature=1.0, allgather_cp=False, log_probs_chunk_size=-1,
            rollout_top_p=1.0, context_parallel_size=1,
        )  # fmt: skip

    vocab, total, response = 11, [7, 9], [4, 5]
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, vocab, (n,), generator=gen) for n in total]
    logits = torch.randn(1, sum(total), vocab, generator=gen)
    engine, offset = [], 0  # the engine's log-probs of each response token: here, what the trainer computes
    for seq, n, r in zip(tokens, total, response, strict=True):
        rows = torch.log_softmax(logits[0, offset + n - r - 1 : offset + n - 1], dim=-1)
        engine.append(rows.gather(-1, seq[n - r :].unsqueeze(-1)).squeeze(-1))
        offset += n
    masks = [torch.tensor([1, 1, 0, 1]), torch.ones(5, dtype=torch.long)]

    def loss(use_tis: bool, served: list[torch.Tensor]) -> torch.Tensor:
        batch = dict(
            advantages=[torch.ones(4), -torch.ones(5)], log_probs=None, rollout_log_probs=served,
            unconcat_tokens=tokens, response_lengths=response, total_lengths=total, loss_masks=masks,
            rollout_mask_sums=[m.sum() for m in masks],
        )  # fmt: skip
        return policy_loss_function(args(use_tis), batch, logits, get_sum_of_sample_mean(total, response, masks))[0]

    with pytest.raises(parity.ParityError, match="8 tokens"):
        loss(True, [e + 0.2 for e in engine])  # the engine served other weights: stop before any update
    hook._state = hook._State()
    assert torch.equal(loss(True, engine), loss(False, engine)), "the check must leave slime's policy loss as it is"


def test_every_lora_recipe_compiles_the_rollout_hook_and_its_parity_settings(tmp_path: Path):
    from aclarena_slime.recipes.compose import RecipeError

    command = compile_recipe(load_recipe(RECIPES / "mle_math.yaml", [f"paths.root={tmp_path}", "+parity.ratio=3"]))
    args = command.train_args
    assert args[args.index("--rollout-data-postprocess-path") + 1] == "aclarena_slime.slime_edge.parity.on_rollout"
    assert command.custom_config["aclarena_parity"] == {
        "ceiling": 0.05, "ratio": 3.0, "floor": 0.002, "calibration_rollouts": 1, "enforce": True,
    }  # fmt: skip
    with pytest.raises(RecipeError, match="parity.ratio must be >= 1"):
        load_recipe(RECIPES / "mle_math.yaml", [f"paths.root={tmp_path}", "+parity.ratio=0.5"])
