#!/usr/bin/env bash
# Join this node to the Ray head started by launch/stage.sh on another node (multi-node runs).
#   bash launch/join.sh HEAD_IP [--port 6379] [--num-gpus 8] [--node-ip-address THIS_NODE_IP]
# HEAD_IP: the address launch/stage.sh printed as "[ray] head address" (never loopback).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/launch/_python.sh"
python="$(aclarena_python "$root")"
exec "$python" -m aclarena_slime.launcher.join "$@"
