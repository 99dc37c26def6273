#!/usr/bin/env bash
# Run one stage recipe on slime (GPUs + slime present) or on the local backend, saying which and why.
#   bash launch/stage.sh recipes/stage2_search.yaml                      # run it
#   bash launch/stage.sh recipes/stage2_search.yaml --dry-run            # print the exact slime command
#   bash launch/stage.sh recipes/stage1_math.yaml algorithm.lr=2e-6 cluster=single_8 backend=local
#   bash launch/stage.sh recipes/mle_search.yaml --preflight [--json]   # = aclarena doctor: check the cluster first
#   ACLARENA_PYTHON=SLIME_VENV/bin/python bash launch/stage.sh recipes/stage2_search.yaml --smoke
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/launch/_python.sh"
python="$(aclarena_python "$root")"

# --preflight: the pre-flight checks (aclarena doctor) with the same recipe and overrides, instead of a run.
if [[ " $* " == *" --preflight "* ]]; then
  args=()
  for arg in "$@"; do [ "$arg" = "--preflight" ] || args+=("$arg"); done
  exec "$python" -m aclarena_slime doctor "${args[@]}"
fi

# --smoke: slime's own train.py, rollout only, on this CPU against the local engine (needs slime importable).
for arg in "$@"; do
  if [ "$arg" = "--smoke" ]; then
    exec "$python" -m aclarena_slime.launcher.smoke "$@"
  fi
done

exec "$python" -m aclarena_slime.launcher.stage "$@"
