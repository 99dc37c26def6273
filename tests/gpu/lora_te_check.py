"""LoRA on slime's TransformerEngine layer spec, with the distributed optimizer and precision-aware Adam: one JSON summary.

What the CPU tests cannot run (TransformerEngine needs CUDA), on one GPU in well under five minutes:

1. the model is built with the spec slime builds (``get_gpt_layer_with_transformer_engine_spec`` with slime's
   arguments, slime/backends/megatron_utils/model_provider.py): ``linear_qkv`` / ``linear_fc1`` are
   ``TELayerNormColumnParallelLinear``, their fused norms holding non-trivial weights;
2. the norm the adapter recomputes equals the one TE's fused kernel feeds the GEMM (TE's own
   ``return_layernorm_output``), with and without ``zero_centered_gamma``;
3. the adapted TE model's logits equal the same backbone and adapter through transformers + PEFT (fp32);
4. three bf16 steps with full recompute, Megatron's DDP, the distributed optimizer and precision-aware Adam
   (bf16 moments, fp32 master weights): the loss falls, every adapter tensor gets a gradient, the backbone is
   bit-identical; the adapter-only checkpoint (``aclarena_slime.lora.checkpoint``; the optimizer state in
   Megatron's default ``fully_sharded_model_space`` layout) reloads into a fresh model and optimizer, and the
   step after the reload gives the loss the original run gives.

Needs torch with CUDA, TransformerEngine and megatron-core (slime's image has them); no slime, no SGLang.
``bash tests/gpu/run_lora_gpu_check.sh`` runs it after the plain-layer checks. Exit 1 on any failed check.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from aclarena_slime.lora import LoraConfig, inject_lora
from aclarena_slime.lora import checkpoint as ckpt
from aclarena_slime.lora.export import export_peft
from aclarena_slime.lora.layers import lora_modules, randomize_adapters
from aclarena_slime.lora.megatron_train import train_step
from aclarena_slime.lora.selftest import TinyQwen3, hf_peft_logits, megatron_logits, model_parallel, save_hf_backbone

SHAPE = TinyQwen3(
    vocab_size=1024, hidden_size=256, ffn_hidden_size=768, num_layers=4, num_attention_heads=8,
    num_query_groups=2, head_dim=64, max_positions=256,
)  # fmt: skip
STEPS = 3
# TE's fused names -> the local spec's, which selftest.backbone_to_hf maps to transformers' Qwen3.
TE_TO_LOCAL = {
    ".self_attention.linear_qkv.layer_norm_weight": ".input_layernorm.weight",
    ".mlp.linear_fc1.layer_norm_weight": ".pre_mlp_layernorm.weight",
}


def build_te_gpt(dtype: torch.dtype, zero_centered_gamma: bool = False, recompute: bool = False):
    """A Qwen3-shaped GPTModel on slime's TE layer spec, its fused norm weights randomised (seeded)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    extra = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    config = TransformerConfig(
        num_layers=SHAPE.num_layers, hidden_size=SHAPE.hidden_size, ffn_hidden_size=SHAPE.ffn_hidden_size,
        num_attention_heads=SHAPE.num_attention_heads, num_query_groups=SHAPE.num_query_groups,
        kv_channels=SHAPE.head_dim, normalization="RMSNorm", layernorm_epsilon=SHAPE.norm_eps,
        layernorm_zero_centered_gamma=zero_centered_gamma, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, qk_layernorm=True, hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, params_dtype=dtype, bf16=dtype == torch.bfloat16,
        gradient_accumulation_fusion=False, **(extra if recompute else {}),
    )  # fmt: skip
    spec = get_gpt_layer_with_transformer_engine_spec(
        num_experts=None, moe_grouped_gemm=False, qk_layernorm=True, multi_latent_attention=False,
        moe_use_legacy_grouped_gemm=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=SHAPE.vocab_size,
        max_sequence_length=SHAPE.max_positions, parallel_output=False,
        share_embeddings_and_output_weights=False, position_embedding_type="rope", rotary_base=int(SHAPE.rope_theta),
    ).cuda()  # fmt: skip
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layer_norm_weight"):
                param.add_((0.2 * torch.randn(param.shape, generator=generator)).to(param))
    return model


def fused_layers(model) -> list:
    return [m for m in model.modules() if type(m).__name__ == "TELayerNormColumnParallelLinear"]


def norm_agreement(zero_centered_gamma: bool) -> float:
    """Max |adapter's norm - TE's own layernorm output| over the fused layers of a fresh model (fp32)."""
    from transformer_engine.pytorch import LayerNormLinear

    model = build_te_gpt(torch.float32, zero_centered_gamma)
    inject_lora(model, LoraConfig(rank=16, alpha=32))
    x = 3.0 * torch.randn(32, 2, SHAPE.hidden_size, device="cuda") + 0.5
    worst = 0.0
    with torch.no_grad():
        for layer in lora_modules(model):
            if not hasattr(layer, "layer_norm_weight"):
                continue
            layer.return_layernorm_output = True
            try:
                _, ln_out = LayerNormLinear.forward(layer, x)  # TE's forward: (out, normalised input)
            finally:
                layer.return_layernorm_output = False
            worst = max(worst, (layer._lora_input(x).float() - ln_out.float()).abs().max().item())
    return worst


def peft_agreement(out: Path) -> dict:
    """The adapted TE model's logits against transformers + PEFT on the same weights (fp32)."""
    model = build_te_gpt(torch.float32)
    is_te = len(fused_layers(model)) == 2 * SHAPE.num_layers
    config = LoraConfig(rank=16, alpha=32, adapter_name="te_check")
    inject_lora(model, config)
    randomize_adapters(model, seed=1, std=0.05)
    ids = torch.randint(0, SHAPE.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        ours = megatron_logits(model, ids.cuda()).float().cpu()
    state = {}
    for key, value in model.state_dict().items():
        if "lora_" in key or "_extra_state" in key or not torch.is_tensor(value):
            continue
        for te_name, local_name in TE_TO_LOCAL.items():
            key = key.replace(te_name, local_name)
        state[key] = value.detach().float().cpu()
    save_hf_backbone(SimpleNamespace(state_dict=lambda: state), SHAPE, out / "backbone")
    export_peft(model, out / "adapter", config, base_model=str(out / "backbone"))
    theirs = hf_peft_logits(out / "backbone", out / "adapter", ids).float()
    return {
        "te_spec": is_te,
        "max_abs_logit_diff": (ours - theirs).abs().max().item(),
        "logit_scale": ours.abs().max().item(),
    }


def build_training(model):
    """Megatron DDP, the distributed optimizer with precision-aware Adam (bf16 moments, fp32 main weights), a scheduler."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    ddp = DistributedDataParallel(
        model.config, DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True), model
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=2e-3,
            min_lr=0.0,
            weight_decay=0.0,
            use_distributed_optimizer=True,
            clip_grad=1.0,
            bf16=True,
            params_dtype=torch.bfloat16,
            use_precision_aware_optimizer=True,
            main_params_dtype=torch.float32,
            main_grads_dtype=torch.float32,
            exp_avg_dtype=torch.bfloat16,
            exp_avg_sq_dtype=torch.bfloat16,
        ),  # fmt: skip
        [ddp],
    )
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=2e-3, max_lr=2e-3, min_lr=0.0, lr_warmup_steps=0, lr_decay_steps=100,
        lr_decay_style="cosine", start_wd=0.0, end_wd=0.0, wd_incr_steps=100, wd_incr_style="constant",
    )  # fmt: skip
    return ddp, optimizer, scheduler


def fresh_trainer():
    model = build_te_gpt(torch.bfloat16, recompute=True)
    inject_lora(model, LoraConfig(rank=16, alpha=32))
    return build_training(model)


def adapter_of(ddp) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in ddp.named_parameters() if ".lora_" in n}


def training(out: Path) -> dict:
    """Three steps, the adapter checkpoint, a reload into a fresh trainer, the step after it."""
    ids = torch.randint(0, SHAPE.vocab_size, (4, 128), generator=torch.Generator().manual_seed(0)).cuda()
    ddp, optimizer, scheduler = fresh_trainer()
    backbone = {n: p.detach().clone() for n, p in ddp.named_parameters() if ".lora_" not in n}
    grad_max = dict.fromkeys(adapter_of(ddp), 0.0)

    def record(model) -> None:
        for name, param in model.named_parameters():
            grad = getattr(param, "main_grad", None)
            if name in grad_max and grad is not None:
                grad_max[name] = max(grad_max[name], grad.abs().max().item())

    losses = [train_step(ddp, optimizer, scheduler, ids, on_grads=record)[0] for _ in range(STEPS)]
    changed = [n for n, p in ddp.named_parameters() if ".lora_" not in n and not torch.equal(p, backbone[n])]
    path = ckpt.save_adapter_checkpoint(out / "lora_adapter", STEPS, [ddp], optimizer, scheduler)
    from megatron.core.dist_checkpointing import load_tensors_metadata

    keys = set(load_tensors_metadata(str(path)))
    saved = adapter_of(ddp)
    next_loss = train_step(ddp, optimizer, scheduler, ids)[0]
    ddp2, optimizer2, scheduler2 = fresh_trainer()
    resumed = ckpt.load_adapter_checkpoint(out / "lora_adapter", [ddp2], optimizer2, scheduler2)
    reloaded = adapter_of(ddp2)
    resumed_loss = train_step(ddp2, optimizer2, scheduler2, ids)[0]
    return {
        "losses": losses,
        "loss_falls": all(b < a for a, b in zip(losses, losses[1:], strict=False)),
        "adapter_tensors_without_gradient": [n for n, v in grad_max.items() if v == 0],
        "backbone_tensors_changed": changed,
        "checkpoint_keys_not_adapter": sorted(k for k in keys if ".lora_" not in k and not k.startswith("optimizer.")),
        "resumed_iteration": resumed,
        "adapter_reloads_equal": all(torch.equal(reloaded[k], v) for k, v in saved.items()),
        "loss_after_reload": resumed_loss,
        "loss_without_reload": next_loss,
    }


def run(out: Path) -> dict:
    summary: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    try:
        import transformer_engine

        summary["transformer_engine"] = transformer_engine.__version__
    except ImportError as exc:
        return {**summary, "ok": False, "error": f"TransformerEngine does not import: {exc}"}
    checks: dict[str, bool] = {}
    for name, part in (
        ("norm", lambda: {"max_abs_diff": {str(z): norm_agreement(z) for z in (False, True)}}),
        ("peft", lambda: peft_agreement(out)),
        ("train", lambda: training(out)),
    ):
        start = time.perf_counter()
        try:
            summary[name] = part()
        except Exception:  # noqa: BLE001 - one part failing still reports the others
            summary[name] = {"error": traceback.format_exc(limit=8)}
        summary[name]["seconds"] = round(time.perf_counter() - start, 2)
    norm, peft, train = summary["norm"], summary["peft"], summary["train"]
    checks["branch_sees_tes_norm"] = "error" not in norm and max(norm["max_abs_diff"].values()) <= 1e-4
    checks["te_spec_built"] = peft.get("te_spec", False)
    checks["logits_match_peft"] = "error" not in peft and peft["max_abs_logit_diff"] <= 2e-3 * max(
        1.0, peft["logit_scale"]
    )
    if "error" in train:
        checks["train"] = False
    else:
        checks["loss_falls"] = train["loss_falls"]
        checks["every_adapter_has_a_gradient"] = not train["adapter_tensors_without_gradient"]
        checks["backbone_bit_identical"] = not train["backbone_tensors_changed"]
        checks["checkpoint_holds_only_the_adapter"] = not train["checkpoint_keys_not_adapter"]
        checks["checkpoint_reloads"] = train["resumed_iteration"] == STEPS and train["adapter_reloads_equal"]
        gap = abs(train["loss_after_reload"] - train["loss_without_reload"])
        checks["step_after_reload_matches"] = gap <= 1e-3 * max(1.0, abs(train["loss_without_reload"]))
    return {"ok": all(checks.values()), "checks": checks, **summary}


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "no CUDA device: TransformerEngine needs one"}))
        return 2
    with tempfile.TemporaryDirectory() as tmp, model_parallel():
        summary = run(Path(tmp))
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":  # dist-checkpointing starts helper processes: keep the guard
    sys.exit(main())
