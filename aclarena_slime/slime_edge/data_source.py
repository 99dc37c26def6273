"""``--data-source-path``: the domain-balanced data source (:mod:`aclarena_slime.distill.balanced_source`), and
slime's default data source made resumable for a LoRA stage.

Slime's data source saves its prompt position under ``--save`` and loads it from ``--load``
(slime/rollout/data_source.py); a LoRA stage's ``--load`` is the backbone's folder, so a resumed stage
restarted its prompt stream at offset 0, or took the backbone stage's offsets when the rollout ids
coincided. Both sources here read the position from :func:`state_dir` instead.

Slime constructs each as ``cls(args)``. Its prompts are built by slime's own ``Dataset`` from
``prompt_data`` (and, with replay, the earlier stages' prompt files), exactly as slime's default data
source builds them; the settings come from ``n_samples_per_prompt``, ``rollout_seed``,
``rollout_shuffle``, ``save`` / ``load`` and the custom config's ``aclarena_balance_key`` /
``aclarena_replay``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from aclarena_slime.distill.balanced_source import BalancedSource
from aclarena_slime.lora.checkpoint import adapter_checkpoint_root, latest_iteration
from aclarena_slime.slime_edge import custom


def state_dir(args: Any) -> str | None:
    """Where the data source's saved position is read from.

    A stage that resumes its adapter (a finished checkpoint under ``--save``) reads its own ``--save``; a LoRA
    stage that does not resume reads nothing (``--load`` is the backbone's folder, another stage's prompts);
    any other stage reads ``--load``, as slime does.
    """
    save = getattr(args, "save", None)
    if save and latest_iteration(adapter_checkpoint_root(save)) is not None:
        return save
    if getattr(args, "aclarena_lora", None) is not None:
        return None
    return getattr(args, "load", None)


class ResumableDataSource:
    """slime's ``RolloutDataSourceWithBuffer``, its position read from :func:`state_dir` (the compiler's default for
    a LoRA stage). ``make`` builds the wrapped source from ``args`` (slime's class unless given)."""

    def __init__(self, args: Any, make: Callable[[Any], Any] | None = None) -> None:
        if make is None:
            from slime.rollout.data_source import RolloutDataSourceWithBuffer as make
        own = copy.copy(args)  # slime's source reads the position from args.load: a copy pointing at ours
        own.load = state_dir(args)
        self.source = make(own)

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        return self.source.get_samples(num_samples)

    def add_samples(self, samples: list[list[Any]]) -> None:
        self.source.add_samples(samples)

    def save(self, rollout_id: int) -> None:
        self.source.save(rollout_id)

    def load(self, rollout_id: int | None = None) -> None:
        self.source.load(rollout_id)

    def __len__(self) -> int:
        return len(self.source)


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
            load_dir=state_dir(args),
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
