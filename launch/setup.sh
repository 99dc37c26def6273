#!/usr/bin/env bash
# Set up (or refresh) the project's virtualenv in .venv: CPU torch 2.13.0 and the package with its dev extra.
#   bash launch/setup.sh            # idempotent; reinstalls only when pyproject.toml or setup.py changed
# On a GPU cluster use slime's Docker image instead and `pip install -e . --no-deps` inside it.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin="${PYTHON:-python3}"
venv=".venv"
stamp="$venv/.aclarena-setup"
want="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv with $("$python_bin" --version 2>&1)" >&2
  "$python_bin" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# The CPU build of torch, pinned: an unpinned torch would pull a multi-GB CUDA build.
"$venv/bin/python" -m pip install --quiet "torch==2.13.0"
"$venv/bin/python" -m pip install --quiet -e ".[dev]"
echo "$want" > "$stamp"
echo "[setup] ready: $venv ($("$venv/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))" >&2
