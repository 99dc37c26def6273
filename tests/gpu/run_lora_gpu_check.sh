#!/usr/bin/env bash
# LoRA layers on one CUDA GPU with plain megatron-core (fp32 + bf16); under a minute on an H200.
# Needs torch with CUDA and megatron-core 0.16.1 importable (PYTHONPATH may point at a copy of it).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import megatron.core" 2>/dev/null; then
  echo "megatron-core is not importable: pip install megatron-core==0.16.1 (or set PYTHONPATH)" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" tests/gpu/lora_gpu_check.py "$@"
