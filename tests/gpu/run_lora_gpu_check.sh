#!/usr/bin/env bash
# LoRA on one CUDA GPU with plain megatron-core: the layers (fp32 + bf16), then three training steps with
# full recompute, DDP, the distributed optimizer and an adapter-only checkpoint (one JSON summary).
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
exec "$PYTHON" tests/gpu/lora_train_check.py "$@"
