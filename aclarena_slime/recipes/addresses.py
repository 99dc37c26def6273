"""The Ray head's address, how many nodes a recipe spans, and the proxy bypass list for the job.

Why this matters: slime tells every training rank to meet at the node IP Ray reports
(``slime.utils.misc.get_current_node_ip`` -> ``ray._private.services.get_node_ip_address``), and the
services the rollout calls live on the head. On one node loopback is right (nothing outside the
machine can reach Ray's job API); on several nodes the head must be started on an address the other
nodes can route to, or the second node's ranks wait at 127.0.0.1 forever.
"""

from __future__ import annotations

import ipaddress
import math
import socket
from collections.abc import Iterable
from typing import Any

LOOPBACK = "127.0.0.1"
# Ray (2.60, ray/_private/ray_constants.py ENABLE_RAY_CLUSTER) swaps a loopback --node-ip-address for
# the first interface's address unless this is 0; 0 also makes a worker refuse to join. So: 0 on a
# loopback head (stays loopback), 1 everywhere else.
RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# A destination for the routing-table look-up only: connecting a UDP socket sends nothing.
_ROUTE_PROBE = ("8.8.8.8", 80)


class AddressError(ValueError):
    """A multi-node recipe without an address the other nodes can reach; the message says how to set one."""


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def routable_ip(probe: tuple[str, int] = _ROUTE_PROBE) -> str | None:
    """This machine's address on its default route (what Ray picks itself), or None without one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(probe)
            address = sock.getsockname()[0]
    except OSError:
        return None
    return None if is_loopback(address) or address == "0.0.0.0" else address


def nodes_needed(cluster: Any) -> int:
    """Nodes the recipe's GPUs span: the actor's nodes, more when disaggregated rollout GPUs overflow them."""
    actor = cluster.actor_num_nodes * cluster.actor_num_gpus_per_node
    total = actor if cluster.colocate else actor + (cluster.rollout_num_gpus or 0)
    return max(cluster.actor_num_nodes, math.ceil(total / max(cluster.num_gpus_per_node, 1)))


def resolve_head_address(address: str | None, multi_node: bool, detect: Any = routable_ip) -> tuple[str | None, str]:
    """``(address, why)`` for ``cluster.ray.address``; None when a multi-node head has no routable address here.

    An explicit loopback address on several nodes is refused: the other nodes cannot reach it.
    """
    if address:
        if multi_node and is_loopback(address):
            raise AddressError(
                f"cluster.ray.address={address} is loopback, but this recipe spans several nodes: the other "
                "nodes' ranks would be told to meet at it. Set cluster.ray.address=HEAD_IP (this node's address "
                "on the network the nodes share, e.g. `hostname -I`)"
            )
        return address, "cluster.ray.address"
    if not multi_node:
        return LOOPBACK, "one node: loopback, so Ray's job API is not reachable from other machines"
    found = detect()
    if found is None:
        return None, "no routable address found on this machine"
    return found, "this machine's address on its default route (cluster.ray.address=... to choose another)"


def require_head_address(address: str | None, multi_node: bool) -> str:
    """The address a launch uses; raises :class:`AddressError` with the fix when there is none."""
    if address is None:
        raise AddressError(
            "this recipe spans several nodes and this machine has no routable address to start the Ray head "
            "on: set cluster.ray.address=HEAD_IP (the address the other nodes reach this one at)"
        )
    resolved, _ = resolve_head_address(address, multi_node)
    assert resolved is not None
    return resolved


def ray_cluster_env(address: str) -> dict[str, str]:
    """The environment of ``ray start`` (and the job) that keeps Ray from replacing the head's address."""
    return {RAY_CLUSTER_ENV: "0" if is_loopback(address) else "1"}


def no_proxy_value(hosts: Iterable[str | None], existing: str = "") -> str:
    """``existing`` plus loopback and ``hosts``, without repeats: what the job must reach without a proxy."""
    out: list[str] = []
    for item in [*existing.split(","), "localhost", LOOPBACK, *hosts]:
        item = (item or "").strip()
        if item and item not in out:
            out.append(item)
    return ",".join(out)
