"""``--data-source-path``: the domain-balanced data source (:mod:`aclarena_slime.distill.balanced_source`).

Slime constructs it as ``cls(args)``. Its prompts are built by slime's own ``Dataset`` from
``prompt_data`` (and, with replay, the earlier stages' prompt files), exactly as slime's default data
source builds them; the settings come from ``n_samples_per_prompt``, ``rollout_seed``,
``rollout_shuffle``, ``save`` / ``load`` and the custom config's ``aclarena_balance_key`` /
``aclarena_replay``.
"""

from __future__ import annotations

from typing import Any

from aclarena_slime.distill.balanced_source import BalancedSource
from aclarena_slime.slime_edge import custom


class BalancedDataSource(BalancedSource):
    """slime's ``DataSource`` interface, every batch drawing equally (or by the replay shares) from every domain."""

    def __init__(self, args: Any) -> None:
        replay = custom.replay(args)
        samples = slime_prompts(args, args.prompt_data)
        for path in (replay.data.values() if replay is not None else ()):
            samples += slime_prompts(args, path)
        super().__init__(
            samples,
            samples_per_prompt=int(getattr(args, "n_samples_per_prompt", 1) or 1),
            seed=int(getattr(args, "rollout_seed", 0) or 0),
            shuffle=bool(getattr(args, "rollout_shuffle", True)),
            balance_key=custom.balance_key(args),
            replay=replay,
            save_dir=getattr(args, "save", None),
            load_dir=getattr(args, "load", None),
            source_name=str(args.prompt_data),
        )


def slime_prompts(args: Any, path: str) -> list[Any]:
    """The prompt samples of ``path`` exactly as slime's own data source builds them."""
    from slime.utils.data import Dataset
    from slime.utils.processing_utils import load_processor, load_tokenizer

    if not getattr(args, "rollout_global_dataset", True) or args.prompt_data is None:
        raise ValueError("BalancedDataSource needs the global dataset (no --disable-rollout-global-dataset) and --prompt-data")
    dataset = Dataset(
        path,
        tokenizer=load_tokenizer(args.hf_checkpoint, trust_remote_code=True),
        processor=load_processor(args.hf_checkpoint, trust_remote_code=True),
        max_length=args.rollout_max_prompt_len,
        prompt_key=args.input_key,
        multimodal_keys=args.multimodal_keys,
        label_key=args.label_key,
        metadata_key=args.metadata_key,
        tool_key=args.tool_key,
        apply_chat_template=args.apply_chat_template,
        apply_chat_template_kwargs=args.apply_chat_template_kwargs,
        seed=args.rollout_seed,
    )
    return list(dataset.origin_samples)
