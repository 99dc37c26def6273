"""The known-flags list: generated from slime + Megatron-LM + SGLang, with provenance, and used as a gate."""

from __future__ import annotations

import pytest

from aclarena_slime.recipes.flags import KNOWN_FLAGS_FILE, UnknownFlagError, check_flags, known_flags


def test_list_says_where_it_came_from_and_holds_each_source():
    header = [line for line in KNOWN_FLAGS_FILE.read_text().splitlines() if line.startswith("#")]
    assert any("regenerate_flags" in line for line in header)
    assert any("Megatron-LM 1dcf0daf" in line for line in header)
    flags = known_flags()
    assert {"--lr", "--num-layers", "--tensor-model-parallel-size"} <= flags  # Megatron-LM
    assert {
        "--custom-config-path",
        "--custom-generate-function-path",
        "--only-train-params-name-list",
    } <= flags  # slime
    assert {"--sglang-enable-lora", "--sglang-mem-fraction-static"} <= flags  # SGLang via slime's prefix
    assert len(flags) > 1000


def test_a_misspelt_flag_is_rejected_with_a_suggestion():
    check_flags([("--kl-loss-coef", "algorithm.kl_loss_coef")])
    with pytest.raises(UnknownFlagError, match=r"algorithm.x: --kl-los-coef .* did you mean --kl-loss-coef"):
        check_flags([("--kl-los-coef", "algorithm.x")])
