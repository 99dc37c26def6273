"""Pre-flight checks that need the Ray cluster: nodes and GPUs against the recipe, and, from a Ray task
on every node, the services, the LoRA sync folder and, on several nodes, the stage's folders (what
slime's actors will need wherever Ray places them).

A stage on several nodes writes Megatron shards from every rank into ``--save`` and reads ``--load``,
``--ref-load``, the HF export and the data on each node. On node-local disks each node sees its own
folder under the same path: the save holds part of its shards and the run fails only at the next stage.
So from every node the doctor checks that the save folder is the one the head writes to (a token file
written here, read there, and a file written beside it) and that every input exists and looks the same
(a file's size, a folder's entries) as here.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from aclarena_slime.launcher.preflight import Check
from aclarena_slime.recipes.addresses import nodes_needed
from aclarena_slime.recipes.schema import StageRecipe

GCS_PROBE_TIMEOUT_S = 3.0  # a head on the network answers a TCP connect in milliseconds
CONNECT_TIMEOUT_S = 45.0  # ray.init to a live head takes seconds; the doctor never waits a minute without a word


def probe_url(url: str, timeout_s: float = 5.0) -> str | None:
    """None when ``url`` answers (any status below 500); otherwise why not. Runs on each node, directly:
    the job's no_proxy (compiler.runtime_env) keeps the rollout's own calls off any proxy too."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(url, timeout=timeout_s) as resp:
            return None if resp.status < 500 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return None if exc.code < 500 else f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return str(getattr(exc, "reason", exc))


def probe_folder(folder: str, token: str) -> str | None:
    """None when ``folder`` holds the head's ``token`` file and this node can write beside it. Runs on each node."""
    path = Path(folder)
    try:
        if (path / f".aclarena-doctor-{token}").read_text() != token:
            return "the head's test file has other contents"
        mine = path / f".aclarena-doctor-{token}-{socket.gethostname()}-{os.getpid()}"
        mine.write_text(token)
        mine.unlink()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def probe_inputs(paths: list[str]) -> dict[str, str | None]:
    """Per path, what this node sees: None when it is missing, else a fingerprint (a file's size, a folder's
    entries). Runs on each node."""
    out: dict[str, str | None] = {}
    for item in paths:
        path = Path(item)
        try:
            if path.is_dir():
                out[item] = "folder: " + ", ".join(sorted(p.name for p in path.iterdir() if not p.name.startswith(".")))
            elif path.is_file():
                out[item] = f"file of {path.stat().st_size} bytes"
            else:
                out[item] = None
        except OSError as exc:
            out[item] = f"unreadable: {type(exc).__name__}: {exc}"
    return out


def _on_every_node(ray: Any, fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)`` once on each alive node (pinned by node id), by node address."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0)(fn)
    refs = {}
    for node in ray.nodes():
        if node.get("Alive"):
            strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
            refs[node["NodeManagerAddress"]] = remote.options(scheduling_strategy=strategy).remote(*args)
    return {address: ray.get(ref, timeout=120) for address, ref in refs.items()}


def check_nodes(ray: Any, recipe: StageRecipe) -> list[Check]:
    cluster = recipe.cluster
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    want_nodes = nodes_needed(cluster)
    gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in nodes)
    want_gpus = cluster.actor_num_nodes * cluster.actor_num_gpus_per_node + (
        0 if cluster.colocate else cluster.rollout_num_gpus or 0
    )
    join = f"on each missing node: bash launch/join.sh {cluster.ray.address} --port {cluster.ray.port}"
    return [
        Check("ray nodes", "ok" if len(nodes) >= want_nodes else "fail",
              f"{len(nodes)} alive, the recipe needs {want_nodes}", "" if len(nodes) >= want_nodes else join),
        Check("ray GPUs", "ok" if gpus >= want_gpus else "fail", f"{gpus:g} in the cluster, the recipe needs {want_gpus}",
              "" if gpus >= want_gpus else f"{join} (each offering {cluster.num_gpus_per_node} GPUs)"),
    ]  # fmt: skip


def check_services(ray: Any, recipe: StageRecipe) -> list[Check]:
    out = []
    for name, service in recipe.services.items():
        url = service.url.rstrip("/") + service.ready_path
        answers = _on_every_node(ray, probe_url, url)
        bad = {node: why for node, why in answers.items() if why is not None}
        if not bad:
            out.append(Check(f"service {name}", "ok", f"{url} answers from {len(answers)} node(s)"))
        else:
            where = "; ".join(f"{node}: {why}" for node, why in sorted(bad.items()))
            out.append(Check(f"service {name}", "fail", f"{url} not reachable from {where}",
                             f"start it (launch/stage.sh does, on {service.host}) and open port {service.port} to the nodes"))  # fmt: skip
    return out


def check_shared_folder(ray: Any, name: str, folder: str, setting: str) -> list[Check]:
    """``folder`` writable here and the same folder (a shared filesystem) on every node; ``setting`` is the
    recipe key that moves it."""
    token = uuid.uuid4().hex
    path = Path(folder)
    probe = path / f".aclarena-doctor-{token}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
    except OSError as exc:
        return [Check(name, "fail", f"{folder} not writable here: {exc}", f"{setting}=A_WRITABLE_SHARED_FOLDER")]
    try:
        answers = _on_every_node(ray, probe_folder, folder, token)
    finally:
        probe.unlink(missing_ok=True)
    bad = {node: why for node, why in answers.items() if why is not None}
    if bad:
        where = "; ".join(f"{node}: {why}" for node, why in sorted(bad.items()))
        return [Check(name, "fail", f"{folder} not shared: {where}",
                      f"{setting}=A_FOLDER_ON_A_FILESYSTEM_EVERY_NODE_MOUNTS (paths.root on one, for all)")]  # fmt: skip
    return [Check(name, "ok", f"{folder} writable and visible from {len(answers)} node(s)")]


def check_sync_dir(ray: Any, sync_dir: str) -> list[Check]:
    """The LoRA sync folder: the trainer's rank 0 writes it, every engine reads it."""
    return check_shared_folder(ray, "lora sync_dir", sync_dir, "lora.sync_dir")


def stage_inputs(recipe: StageRecipe) -> dict[str, str]:
    """What every node of a stage reads, by recipe key: checkpoints, the HF weights, the data."""
    inputs = {
        "checkpoint.load": recipe.checkpoint.load,
        "checkpoint.ref_load": recipe.checkpoint.ref_load,
        "model.hf_checkpoint": recipe.model.hf_checkpoint,
        "data.prompt_data": recipe.data.prompt_data,
    }
    inputs.update({f"data.eval_prompt_data.{k}": v for k, v in recipe.data.eval_prompt_data.items()})
    return inputs


def check_inputs(ray: Any, recipe: StageRecipe) -> list[Check]:
    """Every input exists on every node and looks as it does here. One missing here is another check's
    failure; an HF export the launcher makes first (``checkpoint.ckpt_step``) lands in a folder that must be
    shared instead."""
    inputs = stage_inputs(recipe)
    out: list[Check] = []
    export = recipe.model.hf_checkpoint
    if not Path(export).exists() and recipe.checkpoint.ckpt_step is not None:
        del inputs["model.hf_checkpoint"]
        out += check_shared_folder(ray, "hf export folder", str(Path(export).parent), "model.hf_checkpoint")
    here = probe_inputs(list(dict.fromkeys(inputs.values())))
    present = [path for path, seen in here.items() if seen is not None]
    answers = _on_every_node(ray, probe_inputs, present)
    for key, path in inputs.items():
        if here[path] is None:
            continue
        bad = {node: seen.get(path) for node, seen in answers.items() if seen.get(path) != here[path]}
        if bad:
            where = "; ".join(f"{node}: {'missing' if why is None else why}" for node, why in sorted(bad.items()))
            out.append(Check(f"input {key}", "fail", f"{path} differs from this node's ({here[path]}) on {where}",
                             "put it on a filesystem every node mounts (paths.root), or copy it whole to each node"))  # fmt: skip
        else:
            out.append(Check(f"input {key}", "ok", f"{path} the same on {len(answers)} node(s)"))
    return out


def check_proxy(ray: Any, no_proxy: str) -> list[Check]:
    """With a proxy configured, every node's address must bypass it (SGLang engines and the router live there)."""
    if not (os.environ.get("http_proxy") or os.environ.get("HTTP_PROXY")):
        return [Check("no_proxy", "ok", "no HTTP proxy configured")]
    entries = {item.strip() for item in no_proxy.split(",")}
    missing = [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive") and n["NodeManagerAddress"] not in entries]
    if missing:
        return [Check("no_proxy", "warn", f"an HTTP proxy is set and no_proxy lacks {', '.join(missing)}",
                      "cluster.no_proxy=[the nodes' subnet, e.g. 10.0.0.0/8]")]  # fmt: skip
    return [Check("no_proxy", "ok", "every node bypasses the proxy")]


def probe_port(host: str, port: int, timeout_s: float = GCS_PROBE_TIMEOUT_S) -> str | None:
    """None when something accepts a TCP connection at ``host:port`` within ``timeout_s``; otherwise why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def _within(fn: Any, timeout_s: float) -> Any:
    """``fn()``'s result, or TimeoutError after ``timeout_s``: ``ray.init`` retries for minutes when something other
    than a Ray head holds the port (its thread is a daemon, left behind when the doctor exits)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="doctor-ray-connect")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"ray.init did not connect within {timeout_s:g} s (is that port a Ray head's GCS?)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def cluster_checks(
    recipe: StageRecipe,
    runtime_env: dict[str, Any],
    connect: Any = None,
    probe: Any = probe_port,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> list[Check]:
    """Connect to the recipe's Ray head and run the per-node checks; ``connect`` returns the ``ray`` module.

    The head's GCS port is probed first: ``ray.init`` against an address nobody listens on retries for minutes and
    ignores SIGTERM, so no head is reported in seconds instead.
    """
    ray_config = recipe.cluster.ray
    address = f"{ray_config.address}:{ray_config.port}"
    fix = ("start the head (launch/stage.sh and launch/curriculum.sh start it; or ray start --head "
           f"--node-ip-address={ray_config.address} --port={ray_config.port}) and join the other nodes first")  # fmt: skip
    why = "cluster.ray.address is not set" if ray_config.address is None else probe(ray_config.address, ray_config.port)
    if why is not None:
        return [Check("ray cluster", "fail", f"no Ray head at {address} ({why})", fix)]
    print(f"[doctor] connecting to the Ray head at {address} (at most {connect_timeout_s:g} s) ...", file=sys.stderr,
          flush=True)  # fmt: skip
    try:
        ray = _within(connect or (lambda: _connect(recipe)), connect_timeout_s)
    except Exception as exc:  # noqa: BLE001 - not installed, or no head there
        return [Check("ray cluster", "fail", f"no Ray head at {address}: {type(exc).__name__}: {exc}", fix)]
    out = [Check("ray cluster", "ok", f"connected to {recipe.cluster.ray.address}:{recipe.cluster.ray.port}")]
    out += check_nodes(ray, recipe)
    out += check_services(ray, recipe)
    if nodes_needed(recipe.cluster) > 1:
        out += check_shared_folder(ray, "checkpoint.save", recipe.checkpoint.save, "checkpoint.save")
        out += check_inputs(ray, recipe)
    if recipe.lora.enabled and recipe.lora.sync_mode == "disk":
        out += check_sync_dir(ray, recipe.lora.sync_dir or f"{recipe.checkpoint.save}/adapters")
    out += check_proxy(ray, runtime_env.get("env_vars", {}).get("no_proxy", ""))
    return out


def _connect(recipe: StageRecipe) -> Any:
    import ray

    if not ray.is_initialized():
        ray.init(address=f"{recipe.cluster.ray.address}:{recipe.cluster.ray.port}", log_to_driver=False)
    return ray
