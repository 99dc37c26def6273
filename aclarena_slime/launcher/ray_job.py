"""Ray head start/reuse, worker join and job submission for the slime backend (the ``ray`` CLI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from aclarena_slime.recipes.addresses import AddressError, is_loopback, ray_cluster_env
from aclarena_slime.recipes.schema import ClusterConfig, RayConfig, StageRecipe

GPU_WAIT_S = 120.0  # how long a launch waits for joining nodes' GPUs before it fails naming the missing ones


class RayError(RuntimeError):
    pass


def _ray() -> str:
    path = shutil.which("ray")
    if path is None:
        raise RayError("the 'ray' command is not on PATH (slime's image has it: pip install 'ray[default]')")
    return path


def _env(address: str) -> dict[str, str]:
    return {**os.environ, **ray_cluster_env(address)}


def head_running(ray: RayConfig) -> bool:
    done = subprocess.run(
        [_ray(), "status", f"--address={ray.address}:{ray.port}"], capture_output=True, check=False, env=_env(ray.address)
    )
    return done.returncode == 0


def head_argv(ray: RayConfig, num_gpus: int) -> list[str]:
    """``ray start --head`` on the recipe's address, the dashboard (and its job API, which runs arbitrary
    code without authentication) bound to that address only, never to all interfaces."""
    argv = [
        _ray(), "start", "--head", f"--node-ip-address={ray.address}", f"--port={ray.port}",
        f"--num-gpus={num_gpus}", "--disable-usage-stats", f"--dashboard-host={ray.address}",
        f"--dashboard-port={ray.dashboard_port}",
    ]  # fmt: skip
    if ray.temp_dir:
        argv.append(f"--temp-dir={ray.temp_dir}")
    return argv


def ensure_head(ray: RayConfig, num_gpus: int) -> bool:
    """Start a Ray head unless one answers; returns whether this call started it (only then stop it)."""
    if not ray.address:
        raise AddressError("cluster.ray.address is not set (see aclarena_slime.recipes.addresses)")
    print(f"[ray] head address: {ray.address} (slime's training ranks meet at it; other nodes: "
          f"bash launch/join.sh {ray.address} --port {ray.port})")  # fmt: skip
    if head_running(ray):
        print(f"[ray] reusing the head at {ray.address}:{ray.port}")
        return False
    argv = head_argv(ray, num_gpus)
    env = ray_cluster_env(ray.address)
    print(f"[ray] starting the head: {' '.join(f'{k}={v}' for k, v in env.items())} {' '.join(argv)}")
    if subprocess.run(argv, check=False, env=_env(ray.address)).returncode != 0:
        raise RayError("ray start --head failed (see above)")
    return True


def stop_head() -> None:
    """Stop the Ray processes of this node; called only when :func:`ensure_head` started them."""
    subprocess.run([_ray(), "stop"], check=False)


@contextmanager
def held_head(ray: RayConfig, num_gpus: int) -> Iterator[bool]:
    """One Ray head across several stages (a curriculum): started here unless one answers, stopped here only if
    started here. Stages inside find it running, reuse it and leave it up, so joined nodes stay joined."""
    started = ensure_head(ray, num_gpus)
    try:
        yield started
    finally:
        if started:
            stop_head()



def slime_head(recipes: Sequence[StageRecipe]) -> Any:
    """The head a curriculum's slime stages share (a context manager; a null one without slime stages)."""
    from contextlib import nullcontext

    heads = {(r.cluster.ray.address, r.cluster.ray.port) for r in recipes}
    if not recipes:
        return nullcontext(False)
    if len(heads) > 1:
        raise RayError(f"the slime stages name different Ray heads {sorted(heads, key=str)}: a curriculum has one")
    first = recipes[0].cluster
    return held_head(first.ray, first.num_gpus_per_node)


def gpus_needed(cluster: ClusterConfig, engines: bool = True) -> int:
    """GPUs slime's placement group asks for (slime/ray/placement_group.py ``_get_placement_group_layout``)."""
    actor = cluster.actor_num_nodes * cluster.actor_num_gpus_per_node
    return actor if cluster.colocate or not engines else actor + (cluster.rollout_num_gpus or 0)


def cluster_gpus(ray: RayConfig) -> float:
    """GPUs the head's cluster offers now (Ray's Python API on the head's address)."""
    import ray as ray_api

    ray_api.init(address=f"{ray.address}:{ray.port}", log_to_driver=False)
    try:
        return float(ray_api.cluster_resources().get("GPU", 0))
    finally:
        ray_api.shutdown()


def require_gpus(
    ray: RayConfig,
    want: int,
    count: Callable[[RayConfig], float] | None = None,
    wait_s: float = GPU_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Wait up to ``wait_s`` for the cluster to offer ``want`` GPUs, else fail naming what is missing: slime's
    placement group for more GPUs than the cluster has waits forever without a word. ``count``: :func:`cluster_gpus`."""
    deadline = time.monotonic() + wait_s
    while True:
        have = (count or cluster_gpus)(ray)
        if have >= want:
            return have
        if time.monotonic() >= deadline:
            raise RayError(
                f"the Ray cluster at {ray.address}:{ray.port} offers {have:g} GPUs, the recipe needs {want} "
                f"({want - have:g} missing): on each missing node run bash launch/join.sh {ray.address} --port {ray.port}"
            )
        print(f"[ray] {have:g}/{want} GPUs in the cluster; waiting for nodes to join ...")
        sleep(5.0)


STOP_TIMEOUT_S = 120.0  # how long ``ray job stop`` may take (it waits for the job to end) before we give up on it


def submission_id(name: str) -> str:
    """A fresh Ray submission id for a stage's job, so the launcher can stop exactly that job."""
    return f"aclarena-{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def submit(argv: Sequence[str], submission: str | None = None) -> int:
    """Run ``ray job submit ...``: it streams the job's logs and exits with the job's status. With
    ``submission`` the job gets that id (``--submission-id``), which :func:`stop_job` takes."""
    rest = list(argv[1:])
    if submission is not None:
        rest.insert(rest.index("submit") + 1, f"--submission-id={submission}")
    return subprocess.run([_ray(), *rest], check=False).returncode


def stop_job(dashboard: str, submission: str, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """``ray job stop`` the job ``submission`` on the head whose job API is ``dashboard`` (``http://IP:PORT``):
    Ray stops its driver (SIGTERM, then SIGKILL), so ``ray job submit`` returns. Whether the stop was accepted;
    never hangs past ``timeout_s``. Called when a service the job needs cannot be kept alive."""
    argv = [_ray(), "job", "stop", f"--address={dashboard}", submission]
    print(f"[ray] stopping job {submission}: {' '.join(argv)}", file=sys.stderr)
    try:
        done = subprocess.run(argv, check=False, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"[ray] ray job stop {submission} did not return in {timeout_s:.0f}s", file=sys.stderr)
        return False
    return done.returncode == 0


def join_argv(head_ip: str, port: int, num_gpus: int | None, node_ip: str | None) -> list[str]:
    """``ray start`` for a worker; a loopback head cannot be joined from another node."""
    if is_loopback(head_ip):
        raise AddressError(
            f"head address {head_ip} is loopback: give the address launch/stage.sh printed as '[ray] head address'"
        )
    argv = [_ray(), "start", f"--address={head_ip}:{port}", "--disable-usage-stats", "--block"]
    if num_gpus is not None:
        argv.append(f"--num-gpus={num_gpus}")
    if node_ip is not None:
        argv.append(f"--node-ip-address={node_ip}")
    return argv


def join(head_ip: str, port: int, num_gpus: int | None, node_ip: str | None = None) -> int:
    argv = join_argv(head_ip, port, num_gpus, node_ip)
    print(f"[ray] joining {head_ip}:{port} as {node_ip or 'the address Ray routes to the head from'}: {' '.join(argv)}")
    return subprocess.run(argv, check=False, env=_env(head_ip)).returncode
