"""Against real slime (runs where slime imports): its loader, its Dataset, its SFT rollout, its generate_and_rm.

The SDFT mixture is read by slime's own ``Dataset`` through :class:`BalancedDataSource` and turned into
training samples by slime's ``sft_rollout`` (Qwen3 multi-turn loss mask); MOPD's reward plugin runs
inside slime's ``generate_and_rm`` on slime's real ``Sample``.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from aclarena_slime.distill.dumps import episode_from_record
from aclarena_slime.distill.sdft import MixtureSettings, build_mixture, write_mixture

pytestmark = pytest.mark.slime


def test_slime_loader_finds_the_plugins():
    from slime.utils.misc import load_function

    from aclarena_slime.slime_edge import data_source, mopd, path

    assert load_function(path("balanced_data_source")) is data_source.BalancedDataSource
    assert load_function(path("mopd_reward")) is mopd.teacher_log_probs_reward
    assert load_function(path("mopd_post_process")) is mopd.mopd_post_process


def _sft_args(ckpt, data):
    return SimpleNamespace(
        hf_checkpoint=str(ckpt),
        prompt_data=str(data),
        rollout_global_dataset=True,
        rollout_max_prompt_len=None,
        input_key="messages",
        multimodal_keys=None,
        label_key=None,
        metadata_key="metadata",
        tool_key="tools",
        apply_chat_template=False,
        apply_chat_template_kwargs={},
        rollout_seed=42,
        rollout_shuffle=True,
        n_samples_per_prompt=1,
        rollout_batch_size=6,
        loss_mask_type="qwen3",
        save=None,
        load=None,
    )


def test_mixture_through_slime_dataset_and_sft_rollout(tmp_path, tiny_checkpoint, tiny_tokenizer, make_sample):
    import slime.rollout.sft_rollout as sft_rollout

    from aclarena_slime.slime_edge.data_source import BalancedDataSource

    sizes = {"math": 9, "retail": 2, "search": 4}
    episodes = [
        episode_from_record(
            make_sample(d, f"{d} question {i}", f"final answer {i}", 1.0, tool_turn=d == "retail"), f"{d}:{i}"
        )
        for d, n in sizes.items()
        for i in range(n)
    ]
    records, _ = build_mixture(episodes, MixtureSettings(default_threshold=1.0))
    data = write_mixture(records, tmp_path / "mix.jsonl")

    args = _sft_args(tiny_checkpoint, data)
    source = BalancedDataSource(args)
    assert len(source) == 9 * 3
    samples = sft_rollout.generate_rollout(args, 0, source)
    assert Counter(g[0].metadata["domain"] for g in samples) == {"math": 2, "retail": 2, "search": 2}
    retail = next(g[0] for g in samples if g[0].metadata["domain"] == "retail")
    assert retail.metadata["tools"][0]["function"]["name"] == "get_order"  # lifted by slime's --tool-key
    trained = [t for t, m in zip(retail.tokens[-retail.response_length :], retail.loss_mask, strict=True) if m]
    text = tiny_tokenizer.decode(trained)
    assert "<tool_call>" in text and "final answer" in text  # both assistant turns are trained ...
    assert "delivered" not in text and "retail question" not in text  # ... the tool result and prompt are not


async def test_mopd_reward_inside_slime_generate_and_rm(tiny_checkpoint, tiny_tokenizer):
    from slime.rollout.sglang_rollout import generate_and_rm
    from slime.utils.types import Sample

    from aclarena_slime.slime_edge.mopd import mopd_post_process
    from aclarena_slime.testing.fake_sglang import FakeSGLang
    from aclarena_slime.testing.samples import make_slime_args

    from .test_mopd import FakeTeacher, teacher_logprob

    async with FakeSGLang(tiny_tokenizer, ["<guess>apple</guess>", "<guess>pear</guess>"]) as student:
        async with FakeTeacher(tiny_tokenizer, {None: 2.0}) as teacher:
            args = make_slime_args(
                tiny_checkpoint,
                student.host,
                student.port,
                custom_rm_path="aclarena_slime.slime_edge.mopd.teacher_log_probs_reward",
                aclarena_mopd={"teachers": {"mock": teacher.url}},
                advantage_estimator="grpo",
                rewards_normalization=True,
                grpo_std_normalization=True,
                n_samples_per_prompt=1,
            )
            sample = Sample(prompt="", label="pear", metadata={"env": "mock"}, group_index=0, index=0)
            out = await generate_and_rm(args, sample, {"temperature": 1.0, "max_new_tokens": 128})
    assert out.reward == 0.0 and out.status is Sample.Status.COMPLETED
    n = out.response_length
    assert len(out.teacher_log_probs) == n
    assert out.teacher_log_probs == [
        teacher_logprob(2.0, out.tokens[p], p) for p in range(len(out.tokens) - n, len(out.tokens))
    ]
    raw, rewards = mopd_post_process(args, [out])
    assert raw == [0.0] and rewards == [0.0] and not out.remove_sample
