#!/usr/bin/env bash
# Run a curriculum's stages in order, with checkpoint lineage, a manifest, resume and per-stage evaluation.
#   bash launch/curriculum.sh recipes/curriculum/sequential.yaml
#   bash launch/curriculum.sh recipes/curriculum/mle.yaml output_dir=/runs/mle   # rerun the same line to resume
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/launch/_python.sh"
python="$(aclarena_python "$root")"
exec "$python" -m aclarena_slime.arena "$@"  # an arena file, or one curriculum
