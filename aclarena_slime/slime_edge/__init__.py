"""The one slime edge: every function slime loads by dotted path, and the table of them.

Each hook is a thin adapter with slime's exact signature (read against THUDM/slime 624b824): it pulls
what it needs out of ``args`` (slime's flags, and the custom config's typed sections through
:mod:`~aclarena_slime.slime_edge.custom`) and calls plain functions where the concern lives (the agent
loop, group rewards, MOPD, LoRA, TIS). No other module imports slime for training: outside this
package only the launcher's checks do, to read what the installed slime accepts
(``launcher/preflight``: its argument parsers; ``launcher/smoke_report``: its loader and ``Sample``,
replaying dumped samples), plus the ``slime`` test marker's probe (``testing/pytest_plugin``).

:data:`HOOKS` is the one list of dotted paths: the recipe compiler, the schema's defaults, slime's
eval config and the "every hook resolves with slime's signature" test all read it. This module imports
nothing heavy, so reading the table costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

_EDGE = __name__  # "aclarena_slime.slime_edge"


@dataclass(frozen=True)
class Hook:
    """One function slime loads: our dotted path, the flag that names it, and how slime calls it.

    ``reference`` is slime's own function (or class) for the same flag, whose signature ours must
    accept; ``calls`` are the argument shapes slime uses (positional names, keyword names), checked
    against our signature without slime.
    """

    name: str
    flag: str
    path: str
    reference: str | None
    calls: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]


# slime/backends/megatron_utils/loss.py policy_loss_function: tis_func(**tis_kwargs)
_TIS_CALLS = (
    (
        (),
        ("args", "pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks", "total_lengths", "response_lengths"),
    ),
)

HOOKS: tuple[Hook, ...] = (
    Hook(
        "generate",
        "--custom-generate-function-path",
        f"{_EDGE}.rollout.generate",
        "slime.rollout.sglang_rollout.generate",
        # slime/rollout/sglang_rollout.py generate_and_rm: evaluation= only when the signature has it
        ((("args", "sample", "sampling_params"), ()), (("args", "sample", "sampling_params"), ("evaluation",))),
    ),
    Hook(
        "reward",
        "--custom-rm-path",
        f"{_EDGE}.rollout.reward",
        "slime.rollout.rm_hub.async_rm",
        ((("args", "sample"), ()),),
    ),
    Hook(
        "reward_post_process",
        "--custom-reward-post-process-path",
        f"{_EDGE}.rollout.reward_post_process",
        None,  # slime's default is a RolloutManager method (slime/ray/rollout.py _post_process_rewards)
        ((("args", "samples"), ()),),
    ),
    Hook(
        "drop_no_tool",
        "--dynamic-sampling-filter-path",
        f"{_EDGE}.rollout.drop_no_tool",
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        ((("args", "samples"), ()),),
    ),
    Hook(
        "reward_nonzero_std",
        "--dynamic-sampling-filter-path",
        f"{_EDGE}.rollout.reward_nonzero_std",
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        ((("args", "samples"), ()),),
    ),
    Hook(
        "task_reward_nonzero_std",
        "--dynamic-sampling-filter-path",
        f"{_EDGE}.rollout.task_reward_nonzero_std",
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        ((("args", "samples"), ()),),
    ),
    Hook(
        "mopd_reward",
        "--custom-rm-path",
        f"{_EDGE}.mopd.teacher_log_probs_reward",
        "slime.rollout.rm_hub.async_rm",
        ((("args", "sample"), ()),),
    ),
    Hook(
        "mopd_post_process",
        "--custom-reward-post-process-path",
        f"{_EDGE}.mopd.mopd_post_process",
        None,
        ((("args", "samples"), ()),),
    ),
    Hook(
        "balanced_data_source",
        "--data-source-path",
        f"{_EDGE}.data_source.BalancedDataSource",
        "slime.rollout.data_source.RolloutDataSourceWithBuffer",
        ((("args",), ()),),  # slime/ray/rollout.py: data_source_cls(args)
    ),
    Hook(
        "resumable_data_source",
        "--data-source-path",
        f"{_EDGE}.data_source.ResumableDataSource",
        "slime.rollout.data_source.RolloutDataSourceWithBuffer",
        ((("args",), ()),),  # slime/ray/rollout.py: data_source_cls(args)
    ),
    Hook(
        "lora_model_provider",
        "--custom-model-provider-path",
        f"{_EDGE}.lora.model_provider",
        None,  # slime's default is a closure over args (model_provider.py _get_model_provider_func)
        ((("pre_process", "post_process"), ()), ((), ("pre_process", "post_process", "vp_stage"))),
    ),
    Hook(
        "lora_megatron_init",
        "--custom-megatron-init-path",
        f"{_EDGE}.lora.megatron_init",
        None,  # no default: slime/backends/megatron_utils/initialize.py calls custom_init(args)
        ((("args",), ()),),
    ),
    Hook(
        "rollout_log",
        "--custom-rollout-log-function-path",
        f"{_EDGE}.rollout.rollout_log",
        "slime.observability.rollout_metrics.log_rollout_data",
        # slime/observability/rollout_metrics.py log_rollout_data:
        # custom_log_func(rollout_id, args, samples, rollout_extra_metrics, rollout_time)
        ((("rollout_id", "args", "samples", "rollout_extra_metrics", "rollout_time"), ()),),
    ),
    Hook(
        "monitor_eval_log",
        "--custom-eval-rollout-log-function-path",
        f"{_EDGE}.monitor.log_eval",
        "slime.observability.rollout_metrics.log_eval_rollout_data",
        # slime/observability/rollout_metrics.py log_eval_rollout_data: custom_log_func(rollout_id, args, data, extra_metrics)
        ((("rollout_id", "args", "data", "extra_metrics"), ()),),
    ),
    Hook(
        "tis",
        "--custom-tis-function-path",
        f"{_EDGE}.tis.mismatch_tis",
        "slime.backends.megatron_utils.loss.vanilla_tis_function",
        _TIS_CALLS,
    ),
    Hook(
        "parity_in_loss",
        "--custom-tis-function-path",
        f"{_EDGE}.parity.check_in_loss",
        "slime.backends.megatron_utils.loss.vanilla_tis_function",
        _TIS_CALLS,
    ),
    Hook(
        "parity",
        "--rollout-data-postprocess-path",
        f"{_EDGE}.parity.on_rollout",
        None,  # no default: slime/backends/megatron_utils/actor.py calls it when the flag is set
        ((("args", "rollout_id", "rollout_data"), ()),),
    ),
)

_BY_NAME = {hook.name: hook for hook in HOOKS}


def hook(name: str) -> Hook:
    """The hook named ``name``; a KeyError lists the known names."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no slime hook named {name!r}; known: {', '.join(_BY_NAME)}") from None


def path(name: str) -> str:
    """The dotted path slime loads for hook ``name``."""
    return hook(name).path
