#!/usr/bin/env bash
# LoRA on one CUDA GPU: the layers with plain megatron-core (fp32 + bf16), three training steps with full
# recompute, DDP, the distributed optimizer and an adapter-only checkpoint (one JSON summary); then, where
# TransformerEngine imports (slime's image), the same on slime's TE layer spec with precision-aware Adam, the
# fused norm against TE's own and the logits against PEFT (tests/gpu/lora_te_check.py, one JSON summary).
# Under five minutes on an H200, most of it imports. Needs torch with CUDA and megatron-core 0.16.1
# importable (PYTHONPATH may point at a copy of it); no slime, no SGLang.
# Without a GPU: PYTHONPATH=. python tests/gpu/lora_train_check.py --device cpu (fp32, plain optimizer).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import megatron.core" 2>/dev/null; then
  echo "megatron-core is not importable: pip install megatron-core==0.16.1 (or set PYTHONPATH)" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" tests/gpu/lora_gpu_check.py
"$PYTHON" tests/gpu/lora_train_check.py "$@"
if "$PYTHON" -c "import transformer_engine" 2>/dev/null; then
  exec "$PYTHON" tests/gpu/lora_te_check.py
fi
echo "TransformerEngine is not importable: the TE-spec check (tests/gpu/lora_te_check.py) did not run" >&2
