"""Ray head start/reuse, worker join and job submission for the slime backend (the ``ray`` CLI)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from aclarena_slime.recipes.schema import RayConfig


class RayError(RuntimeError):
    pass


def _ray() -> str:
    path = shutil.which("ray")
    if path is None:
        raise RayError("the 'ray' command is not on PATH (slime's image has it: pip install 'ray[default]')")
    return path


def head_running(ray: RayConfig) -> bool:
    done = subprocess.run([_ray(), "status", f"--address={ray.address}:{ray.port}"], capture_output=True, check=False)
    return done.returncode == 0


def ensure_head(ray: RayConfig, num_gpus: int) -> bool:
    """Start a Ray head unless one answers; returns whether this call started it (only then stop it)."""
    if head_running(ray):
        print(f"[ray] reusing the head at {ray.address}:{ray.port}")
        return False
    argv = [
        _ray(), "start", "--head", f"--node-ip-address={ray.address}", f"--port={ray.port}",
        f"--num-gpus={num_gpus}", "--disable-usage-stats", "--dashboard-host=0.0.0.0",
        f"--dashboard-port={ray.dashboard_port}",
    ]  # fmt: skip
    if ray.temp_dir:
        argv.append(f"--temp-dir={ray.temp_dir}")
    print(f"[ray] starting the head: {' '.join(argv)}")
    if subprocess.run(argv, check=False).returncode != 0:
        raise RayError("ray start --head failed (see above)")
    return True


def stop_head() -> None:
    """Stop the Ray processes of this node; called only when :func:`ensure_head` started them."""
    subprocess.run([_ray(), "stop"], check=False)


def submit(argv: Sequence[str]) -> int:
    """Run ``ray job submit ...``: it streams the job's logs and exits with the job's status."""
    return subprocess.run([_ray(), *argv[1:]], check=False).returncode


def join(head_ip: str, port: int, num_gpus: int | None) -> int:
    argv = [_ray(), "start", f"--address={head_ip}:{port}", "--disable-usage-stats", "--block"]
    if num_gpus is not None:
        argv.append(f"--num-gpus={num_gpus}")
    print(f"[ray] joining {head_ip}:{port}: {' '.join(argv)}")
    return subprocess.run(argv, check=False).returncode
