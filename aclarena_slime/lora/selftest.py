"""End-to-end check of the LoRA path on CPU: Megatron model + adapter -> HF + PEFT -> same logits.

Builds a tiny Qwen3-shaped megatron-core GPT (GQA, explicit head_dim, q/k norms, SwiGLU) with
random adapter weights, exports the backbone as a Hugging Face checkpoint and the adapter as a PEFT
directory, reloads both with transformers + PEFT and compares logits. ``aclarena lora selftest``
runs it; the tests run it too.
"""

from __future__ import annotations

import os
import socket
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from .config import LoraConfig
from .export import AttentionShape, export_peft, split_qkv_rows
from .layers import inject_lora, randomize_adapters


@dataclass(frozen=True)
class TinyQwen3:
    """Shape of the self-test model; head_dim * heads != hidden on purpose, as in real Qwen3."""

    vocab_size: int = 128
    hidden_size: int = 64
    ffn_hidden_size: int = 96
    num_layers: int = 2
    num_attention_heads: int = 4
    num_query_groups: int = 2
    head_dim: int = 24
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6
    max_positions: int = 64


class _CpuRngTracker:
    """Stands in for megatron's CUDA RNG tracker on a machine without CUDA (dropout is off anyway)."""

    @contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        yield

    def get_states(self) -> dict:
        return {}

    def set_states(self, states: dict) -> None:
        pass


@contextmanager
def megatron_on_cpu():
    """Let megatron-core run forward/backward without CUDA: the two CUDA calls it makes get CPU stand-ins."""
    with ExitStack() as stack:
        if not torch.cuda.is_available():
            from megatron.core import tensor_parallel

            tracker = _CpuRngTracker()
            stack.enter_context(mock.patch("torch.cuda.current_device", lambda: "cpu"))
            stack.enter_context(mock.patch.object(tensor_parallel, "get_cuda_rng_tracker", lambda: tracker))
            stack.enter_context(mock.patch.object(tensor_parallel.random, "get_cuda_rng_tracker", lambda: tracker))
            # Activation recompute saves and restores the CUDA RNG state around each checkpointed block.
            cpu_state = torch.empty(0, dtype=torch.uint8)
            stack.enter_context(mock.patch.object(tensor_parallel.random, "_get_cuda_rng_state", lambda **_: cpu_state))
            stack.enter_context(mock.patch.object(tensor_parallel.random, "_set_cuda_rng_state", lambda *a, **k: None))
        yield


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def model_parallel(tp_rank: int = 0, tp_size: int = 1, port: int | None = None):
    """A gloo process group (one process per TP rank) with megatron's parallel state, torn down after."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port or free_port())
        torch.distributed.init_process_group(backend, rank=tp_rank, world_size=tp_size)
    parallel_state.initialize_model_parallel(tp_size, 1)
    if torch.cuda.is_available():
        model_parallel_cuda_manual_seed(1234)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def build_tiny_gpt(
    shape: TinyQwen3,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    recompute: str | None = None,
):
    """A megatron-core GPTModel with the local (non-TE) Qwen3-style spec; needs ``model_parallel()``.

    ``recompute="full"`` turns on full uniform activation recompute (one layer per checkpoint), the
    setting of the paper's cluster profile; ``"selective"`` recomputes the core attention only.
    """
    recompute_kwargs: dict = {}
    if recompute == "full":
        recompute_kwargs = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    elif recompute == "selective":
        recompute_kwargs = {"recompute_granularity": "selective"}
    elif recompute is not None:
        raise ValueError(f"recompute must be None, 'full' or 'selective', got {recompute!r}")
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=shape.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        qk_layernorm=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        use_cpu_initialization=True,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        **recompute_kwargs,
    )
    torch.manual_seed(seed)  # use_cpu_initialization: full weights from this RNG, then split per TP rank
    with megatron_on_cpu():
        model = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"),
            vocab_size=shape.vocab_size,
            max_sequence_length=shape.max_positions,
            parallel_output=False,
            share_embeddings_and_output_weights=False,
            position_embedding_type="rope",
            rotary_base=int(shape.rope_theta),
        )
    return model.to(device)


def megatron_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits [batch, seq, vocab] of a causal forward."""
    batch, seq = input_ids.shape
    position_ids = torch.arange(seq, device=input_ids.device).expand(batch, seq)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=input_ids.device), diagonal=1)[None, None]
    with megatron_on_cpu():
        return model(input_ids, position_ids, mask)


def backbone_to_hf(state: dict[str, torch.Tensor], shape: TinyQwen3) -> dict[str, torch.Tensor]:
    """A TP=1 megatron-core (local spec) backbone state dict -> transformers Qwen3 names."""
    attn = AttentionShape(shape.num_attention_heads, shape.num_query_groups, shape.head_dim)
    hf = {
        "model.embed_tokens.weight": state["embedding.word_embeddings.weight"],
        "model.norm.weight": state["decoder.final_layernorm.weight"],
        "lm_head.weight": state["output_layer.weight"],
    }
    for i in range(shape.num_layers):
        src, dst = f"decoder.layers.{i}", f"model.layers.{i}"
        q, k, v = split_qkv_rows(state[f"{src}.self_attention.linear_qkv.weight"], attn)
        gate, up = state[f"{src}.mlp.linear_fc1.weight"].chunk(2, dim=0)
        hf.update(
            {
                f"{dst}.input_layernorm.weight": state[f"{src}.input_layernorm.weight"],
                f"{dst}.post_attention_layernorm.weight": state[f"{src}.pre_mlp_layernorm.weight"],
                f"{dst}.self_attn.q_proj.weight": q,
                f"{dst}.self_attn.k_proj.weight": k,
                f"{dst}.self_attn.v_proj.weight": v,
                f"{dst}.self_attn.q_norm.weight": state[f"{src}.self_attention.q_layernorm.weight"],
                f"{dst}.self_attn.k_norm.weight": state[f"{src}.self_attention.k_layernorm.weight"],
                f"{dst}.self_attn.o_proj.weight": state[f"{src}.self_attention.linear_proj.weight"],
                f"{dst}.mlp.gate_proj.weight": gate,
                f"{dst}.mlp.up_proj.weight": up,
                f"{dst}.mlp.down_proj.weight": state[f"{src}.mlp.linear_fc2.weight"],
            }
        )
    return {k: v.detach().contiguous().clone() for k, v in hf.items()}


def save_hf_backbone(model, shape: TinyQwen3, out_dir: Path) -> Path:
    """Write the (TP=1) backbone as a transformers Qwen3 checkpoint."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v for k, v in model.state_dict().items() if "lora_" not in k and "_extra_state" not in k}
    save_file(backbone_to_hf(state, shape), str(out_dir / "model.safetensors"))
    Qwen3Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.ffn_hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_query_groups,
        head_dim=shape.head_dim,
        rms_norm_eps=shape.norm_eps,
        rope_theta=shape.rope_theta,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=False,
        attention_bias=False,
        torch_dtype="float32",
    ).save_pretrained(out_dir)
    return out_dir


def hf_peft_logits(backbone_dir: Path, adapter_dir: Path, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits of transformers' Qwen3 with the PEFT adapter loaded on top."""
    from peft import PeftModel
    from transformers import Qwen3ForCausalLM

    base = Qwen3ForCausalLM.from_pretrained(backbone_dir, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        return model(input_ids=input_ids).logits


def run_selftest(out_dir: str | os.PathLike, *, seed: int = 0, rank: int = 8, tolerance: float = 1e-4) -> dict:
    """Build, export, reload, compare. Returns a report; ``report["ok"]`` is the verdict."""
    out = Path(out_dir)
    shape = TinyQwen3()
    config = LoraConfig(rank=rank, alpha=2.0 * rank, adapter_name="selftest")
    input_ids = torch.randint(0, shape.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))
    with model_parallel():
        model = build_tiny_gpt(shape, seed=seed)
        model.eval()
        with torch.no_grad():
            backbone = megatron_logits(model, input_ids)
            inject_lora(model, config)
            init_diff = (megatron_logits(model, input_ids) - backbone).abs().max().item()
            randomize_adapters(model, seed=seed + 1, std=0.2)
            adapted = megatron_logits(model, input_ids)
        save_hf_backbone(model, shape, out / "backbone")
        tensors = export_peft(model, out / "adapter", config, base_model=str(out / "backbone"))
    reloaded = hf_peft_logits(out / "backbone", out / "adapter", input_ids)
    max_diff = (adapted.float() - reloaded.float()).abs().max().item()
    return {
        "ok": max_diff <= tolerance and init_diff == 0.0,
        "max_abs_logit_diff": max_diff,
        "tolerance": tolerance,
        "init_equals_backbone": init_diff == 0.0,
        "adapter_effect": (adapted - backbone).abs().max().item(),
        "adapter_tensors": len(tensors),
        "adapter_params": sum(t.numel() for t in tensors.values()),
        "backbone_dir": str(out / "backbone"),
        "adapter_dir": str(out / "adapter"),
    }
