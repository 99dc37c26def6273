"""``bash launch/join.sh HEAD_IP [--port 6379] [--num-gpus N] [--node-ip-address IP]``: join this node to a Ray head.

HEAD_IP is the address ``launch/stage.sh`` printed as ``[ray] head address`` (``cluster.ray.address``).
"""

from __future__ import annotations

import argparse
import sys

from aclarena_slime.launcher.ray_job import RayError, join
from aclarena_slime.recipes.addresses import AddressError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launch/join.sh", description=__doc__.splitlines()[0])
    parser.add_argument("head_ip", help="address of the node that ran launch/stage.sh")
    parser.add_argument("--port", type=int, default=6379, help="the head's Ray port (cluster.ray.port)")
    parser.add_argument("--num-gpus", type=int, help="GPUs to offer (default: all Ray finds)")
    parser.add_argument(
        "--node-ip-address", help="this node's address on the network it shares with the head (default: Ray's choice)"
    )
    args = parser.parse_args(argv)
    try:
        return join(args.head_ip, args.port, args.num_gpus, args.node_ip_address)
    except (RayError, AddressError) as exc:
        print(f"join.sh: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
