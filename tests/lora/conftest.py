"""Fixtures for the LoRA tests: a tiny megatron-core GPT on CPU inside a one-rank gloo group."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core", reason="megatron-core (the 'megatron' extra) is not installed")

from aclarena_slime.lora.selftest import TinyQwen3, build_tiny_gpt, model_parallel  # noqa: E402


@pytest.fixture
def tp1():
    with model_parallel():
        yield


@pytest.fixture
def tiny_shape() -> TinyQwen3:
    return TinyQwen3(num_layers=2)


@pytest.fixture
def tiny_model(tp1, tiny_shape):
    return build_tiny_gpt(tiny_shape, seed=0)
