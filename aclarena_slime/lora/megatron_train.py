"""A minimal Megatron training step for the LoRA checks (CPU tests, ``tests/gpu``): not used by slime runs.

Megatron's DDP, its optimizer (``get_megatron_optimizer``) and LR scheduler, as slime builds them, on a
LoRA-injected megatron-core model. On a machine without CUDA, :func:`megatron_training_on_cpu` lets
Megatron's optimizer and dist-checkpointing run: they create a few bookkeeping tensors with
``device='cuda'`` and synchronise the device. The distributed optimizer and gradient clipping insist on
CUDA tensors, so on CPU only the plain optimizer without clipping runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F

from .selftest import megatron_logits, megatron_on_cpu

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full")


def _on_cpu(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def create(*args: Any, **kwargs: Any) -> torch.Tensor:
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return create


@contextmanager
def megatron_training_on_cpu() -> Iterator[None]:
    """:func:`megatron_on_cpu`, plus tensors that Megatron's optimizer creates on ``cuda`` made on CPU."""
    with ExitStack() as stack:
        stack.enter_context(megatron_on_cpu())
        if not torch.cuda.is_available():
            for name in _FACTORIES:
                stack.enter_context(mock.patch.object(torch, name, _on_cpu(getattr(torch, name))))
            # dist-checkpointing waits for the device before it writes: nothing to wait for on CPU.
            stack.enter_context(mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None))
        yield


def build_training(
    model: torch.nn.Module, *, lr: float = 1e-2, distributed_optimizer: bool = False, clip_grad: float = 0.0
) -> tuple[Any, Any, Any]:
    """Megatron DDP around ``model``, its optimizer over the trainable (adapter) parameters, and a scheduler.

    Call inside :func:`megatron_training_on_cpu` (or on CUDA).
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=distributed_optimizer, grad_reduce_in_fp32=True
    )
    ddp = DistributedDataParallel(model.config, ddp_config, model)
    optimizer_config = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        min_lr=0.0,
        weight_decay=0.0,
        use_distributed_optimizer=distributed_optimizer,
        clip_grad=clip_grad,
        bf16=model.config.bf16,
        params_dtype=model.config.params_dtype,
    )
    optimizer = get_megatron_optimizer(optimizer_config, [ddp])
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=lr,
        max_lr=lr,
        min_lr=0.0,
        lr_warmup_steps=0,
        lr_decay_steps=100,
        lr_decay_style="cosine",
        start_wd=0.0,
        end_wd=0.0,
        wd_incr_steps=100,
        wd_incr_style="constant",
    )
    return ddp, optimizer, scheduler


def train_step(
    ddp: Any,
    optimizer: Any,
    scheduler: Any,
    input_ids: torch.Tensor,
    on_grads: Callable[[Any], None] | None = None,
) -> tuple[float, float]:
    """One next-token step, Megatron's way (grad buffers, grad sync, optimizer, scheduler). Returns (loss, grad norm).

    ``on_grads(ddp)`` runs after the gradient sync, before the optimizer step (``param.main_grad`` is set then).
    """
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    logits = megatron_logits(ddp, input_ids)
    vocab = logits.shape[-1]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), input_ids[:, 1:].reshape(-1))
    loss.backward()
    ddp.finish_grad_sync()
    if on_grads is not None:
        on_grads(ddp)
    ok, grad_norm, _ = optimizer.step()
    if not ok:
        raise RuntimeError("the optimizer skipped its step (overflow)")
    scheduler.step(increment=1)
    return loss.item(), float(grad_norm or 0.0)
