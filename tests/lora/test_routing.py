"""The per-sample adapter index on slime's path: the rollout tags a sample, the model's pre-hook expands it
over slime's packed stream and sets it on every stacked LoRA layer (parallel MLE)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from aclarena_slime.lora import LoraConfig, inject_lora, routing
from aclarena_slime.lora.config import LoraConfigError
from aclarena_slime.lora.layers import lora_modules


def test_per_token_index_follows_the_packed_segments():
    # Three samples of 3, 2 and 4 tokens, then 3 tokens of padding (slime's trailing pad segment).
    cu = torch.tensor([0, 3, 5, 9, 12])
    index = routing.per_token_index(torch.tensor([1, 0, 2]), cu)
    assert index.squeeze(1).tolist() == [1, 1, 1, 0, 0, 2, 2, 2, 2, 0, 0, 0]
    # Context parallelism 2: cu_seqlens are scaled by cp, each rank holds half of every sample.
    half = routing.per_token_index(torch.tensor([1, 0]), torch.tensor([0, 4, 8]), cp_size=2)
    assert half.squeeze(1).tolist() == [1, 1, 0, 0]
    with pytest.raises(ValueError, match="one per sample"):
        routing.per_token_index(torch.tensor([1]), cu)


def test_the_rollout_tags_each_sample_with_its_expert():
    sample = SimpleNamespace(multimodal_train_inputs=None, metadata={"env": "search"})
    routing.tag_sample(sample, ["math", "search"], "search")
    assert sample.multimodal_train_inputs[routing.ADAPTER_INDEX_KEY].tolist() == [1]
    with pytest.raises(LoraConfigError, match="retail"):
        routing.tag_sample(sample, ["math", "search"], "retail")


def test_the_model_hook_sets_the_index_on_every_layer(tiny_model):
    inject_lora(tiny_model, LoraConfig(rank=2, alpha=4, experts=["math", "search"]))
    packed = SimpleNamespace(cu_seqlens_q=torch.tensor([0, 2, 5]))
    kwargs = {"input_ids": None, "packed_seq_params": packed, routing.ADAPTER_INDEX_KEY: torch.tensor([1, 0])}
    _, left = routing._pre_forward(tiny_model, (), kwargs)
    assert routing.ADAPTER_INDEX_KEY not in left  # megatron's forward never sees it
    for module in lora_modules(tiny_model):
        assert module.lora_adapter_index.squeeze(1).tolist() == [1, 1, 0, 0, 0]


def test_slimes_generate_tags_training_samples_not_eval_ones(monkeypatch):
    """The generate hook's wiring: with ``aclarena_lora.experts`` a training sample leaves with its index."""
    import asyncio

    from aclarena_slime.slime_edge import rollout as edge

    async def rolled(context, sample, params, evaluation=False):  # the episode itself is tested elsewhere
        return sample

    async def context(args):
        return None

    monkeypatch.setattr(edge, "run_sample", rolled)
    monkeypatch.setattr(edge, "rollout_context", context)
    args = SimpleNamespace(aclarena_lora={"experts": ["math", "ifeval"]})
    train = SimpleNamespace(multimodal_train_inputs=None, metadata={"env": "ifeval"})
    evaluated = SimpleNamespace(multimodal_train_inputs=None, metadata={"env": "ifeval"})
    asyncio.run(edge.generate(args, train, {}))
    asyncio.run(edge.generate(args, evaluated, {}, evaluation=True))
    assert train.multimodal_train_inputs[routing.ADAPTER_INDEX_KEY].tolist() == [1]
    assert evaluated.multimodal_train_inputs is None
