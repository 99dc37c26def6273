"""``bash launch/stage.sh RECIPE --smoke [overrides]``: slime's own ``train.py``, rollout only, on a CPU.

What it is for: checking a recipe, and a new env, against real slime before GPU hours are spent —
slime's RolloutManager, router, data source, eval config and sample dumps, with our hooks inside.
Where slime (with SGLang's Python package and sglang-router) is importable, it:

1. composes and compiles the recipe as ``launch/stage.sh`` would, then shrinks the command to
   :data:`ROLLOUTS` rollouts of :data:`PROMPTS` prompts x :data:`SAMPLES` samples on the local
   profile's model and the env's demo records (or ``--smoke-data TRAIN[,EVAL]``);
2. turns off what cannot run or would not end here, and says so: the dynamic-sampling filter (with
   a model whose rewards never vary it asks for more prompts forever), over-sampling, the KL loss
   (slime then wants ``--ref-load``), checkpoint loading and saving;
3. starts the local engine as an SGLang server (``aclarena local serve-engine``), the recipe's
   services on free ports (a service reading files under ``paths.data`` is given ``--demo``
   instead), and a private Ray head on loopback with a logical GPU, its own temp dir and ports;
4. submits ``train.py --debug-rollout-only --rollout-external-engine-addrs`` with
   ``--save-debug-rollout-data``, and an eval after every rollout when the recipe has eval data;
5. reads slime's dumped samples back and prints the per-env report
   (:mod:`aclarena_slime.launcher.smoke_report`), then stops everything it started, by PID.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aclarena_slime.launcher.services import ServiceWatch, start_service, stop_service
from aclarena_slime.launcher.stage import normalise_overrides
from aclarena_slime.recipes.compiler import SlimeCommand, compile_recipe
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.recipes.schema import ServiceConfig, StageRecipe

if TYPE_CHECKING:
    from aclarena_slime.local.session import LocalSession

ROLLOUTS, PROMPTS, SAMPLES, EVAL_PROMPTS = 2, 2, 2, 2
MAX_RESPONSE_LEN = 48
BOOTSTRAP = Path(__file__).resolve().parent / "smoke_bootstrap"
STANDINS = BOOTSTRAP / "standins"
# Flags the smoke removes, each with the reason it prints.
DROPPED = {
    "--dynamic-sampling-filter-path": "dynamic sampling off: with rewards that never vary it would ask for prompts forever",
    "--over-sampling-batch-size": "no over-sampling (it only feeds the dynamic-sampling filter)",
    "--use-kl-loss": "no KL loss (slime would require --ref-load, and no training step runs)",
    "--kl-loss-coef": None,
    "--kl-loss-type": None,
    "--load": "no checkpoint to load (rollout only; the engine serves the local profile's model)",
    "--ref-load": None,
    "--save": "nothing saved (rollout only)",
    "--save-interval": None,
    "--save-hf": None,
    "--colocate": "engine external, not colocated",
    "--sequence-parallel": None,
}


class SmokeError(RuntimeError):
    """The smoke cannot run here or failed; the message says what to do."""


@dataclasses.dataclass
class SmokeSettings:
    recipe: str
    overrides: list[str]
    data: tuple[str, str | None] | None = None  # the user's TRAIN[,EVAL] JSONL instead of demo records
    work_dir: Path | None = None
    timeout_s: float = 1800.0


def missing_slime() -> str | None:
    """What this interpreter lacks for slime's ``train.py`` (None when nothing)."""
    needs = {"slime.rollout": "slime (THUDM/slime)", "sglang": "sglang", "sglang_router": "sglang-router"}
    lacking = []
    for module, what in needs.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            lacking.append(what)
    if not lacking:
        return None
    return (
        f"{sys.executable} cannot import {', '.join(lacking)}; --smoke runs slime's own train.py. Install slime "
        "from its repository (pip install -e SLIME --no-deps, with sglang and sglang-router) and point "
        "ACLARENA_PYTHON at that interpreter"
    )


def train_script(recipe: StageRecipe) -> Path:
    """slime's ``train.py``: ``paths.slime`` when it has one, else beside an editable install of slime."""
    candidates = [Path(recipe.paths.slime) / "train.py"]
    spec = importlib.util.find_spec("slime")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).resolve().parents[1] / "train.py")
    for path in candidates:
        if path.is_file():
            return path
    raise SmokeError(f"slime's train.py not found in {[str(c) for c in candidates]}; set paths.slime=SLIME_CHECKOUT")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_range(size: int, rng: random.Random) -> int:
    """The first port of ``size`` consecutive free loopback ports (Ray's worker ports)."""
    for _ in range(50):
        base = rng.randrange(30_000, 60_000 - size)
        if all(_port_free(p) for p in range(base, base + size)):
            return base
    raise SmokeError(f"no {size} consecutive free ports found for Ray's workers")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def edit_flags(argv: list[str], drop: set[str], values: dict[str, list[str] | None]) -> list[str]:
    """``argv`` without the ``drop`` flags (and their values), with ``values`` set (None: a bare switch)."""
    out: list[str] = []
    skipping = False
    for item in argv:
        if item.startswith("--"):
            skipping = item in drop or item in values
            if not skipping:
                out.append(item)
        elif not skipping:
            out.append(item)
    for flag, value in values.items():
        out.append(flag)
        out.extend(value or [])
    return out


def _flag_values(argv: list[str], flag: str) -> list[str] | None:
    if flag not in argv:
        return None
    start = argv.index(flag) + 1
    end = start
    while end < len(argv) and not argv[end].startswith("--"):
        end += 1
    return argv[start:end]


def smoke_argv(command: SlimeCommand, *, model_dir: Path, data: tuple[Path, Path | None], engine: str,
               dump: Path, custom_config: Path) -> tuple[list[str], list[str]]:  # fmt: skip
    """The recipe's train.py flags shrunk for the smoke; also the lines saying what was turned off."""
    argv = command.train_args
    notes = [f"  - {why}" for flag, why in DROPPED.items() if why and flag in argv]
    values: dict[str, list[str] | None] = {
        "--actor-num-nodes": ["1"],
        "--actor-num-gpus-per-node": ["1"],
        "--num-gpus-per-node": ["1"],
        "--rollout-num-gpus-per-engine": ["1"],
        "--tensor-model-parallel-size": ["1"],
        "--pipeline-model-parallel-size": ["1"],
        "--context-parallel-size": ["1"],
        "--hf-checkpoint": [str(model_dir)],
        "--prompt-data": [str(data[0])],
        "--num-rollout": [str(ROLLOUTS)],
        "--rollout-batch-size": [str(PROMPTS)],
        "--n-samples-per-prompt": [str(SAMPLES)],
        "--global-batch-size": [str(PROMPTS * SAMPLES)],
        "--rollout-max-response-len": [str(MAX_RESPONSE_LEN)],
        "--custom-config-path": [str(custom_config)],
        "--debug-rollout-only": None,
        "--rollout-external-engine-addrs": [engine],
        "--save-debug-rollout-data": [str(dump / "{rollout_id}.pt")],
        "--seed": ["1234"],
    }
    evals = _flag_values(argv, "--eval-prompt-data")
    if evals and data[1] is not None:
        values["--eval-prompt-data"] = [evals[0], str(data[1])]
        values["--eval-interval"] = ["1"]
        values["--n-samples-per-eval-prompt"] = ["1"]
        values["--eval-max-response-len"] = [str(MAX_RESPONSE_LEN)]
    else:
        drop_eval = {"--eval-prompt-data", "--eval-interval", "--eval-config"}
        argv = edit_flags(argv, drop_eval, {})
        notes.append("  - no eval (the recipe has no eval data)" if not evals else "  - no eval data given")
    return edit_flags(argv, set(DROPPED), values), notes


# --- the pieces it starts ------------------------------------------------------------------------------


def service_for_smoke(service: Any, roots: Sequence[str], demo: bool, port: int) -> ServiceConfig:
    """The recipe's service on ``port``; with demo data, options that read under ``roots`` (the recipe's data
    and model folders: a corpus, an index, its encoder) become one ``--demo``."""
    command = [str(part) for part in service.command]
    prefixes = tuple(root.rstrip("/") + "/" for root in roots)
    if demo:
        kept: list[str] = []
        replaced = False
        for part in command:
            if part.startswith(prefixes) and kept and kept[-1].startswith("--"):
                kept.pop()
                replaced = True
            else:
                kept.append(part)
        command = [*kept, "--demo"] if replaced else kept
    return ServiceConfig(
        command=command,
        host="127.0.0.1",
        port=port,
        ready_path=service.ready_path,
        ready_timeout_s=min(service.ready_timeout_s, 300.0),
        url=f"http://127.0.0.1:{port}",
        env=dict(service.env),  # the retriever's thread caps
        max_restarts=service.max_restarts,  # watched as on a cluster (services.ServiceWatch)
        check_interval_s=min(service.check_interval_s, 2.0),
        unready_timeout_s=min(service.unready_timeout_s, 30.0),
    )


def served_llm(service: Any) -> str | None:
    """The OpenAI model name of a service that is an SGLang server (a user simulator), else None: the smoke
    has no such model on a CPU, and its local engine speaks the same API under that name."""
    command = [str(part) for part in service.command]
    if "sglang.launch_server" not in command:
        return None
    names = _flag_values(command, "--served-model-name")
    return names[0] if names else "default"


def rebind_urls(value: Any, moved: dict[str, str]) -> Any:
    """``value`` (env config) with every service URL of the recipe replaced by where the smoke runs it."""
    if isinstance(value, str):
        for old, new in moved.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {k: rebind_urls(v, moved) for k, v in value.items()}
    if isinstance(value, list):
        return [rebind_urls(v, moved) for v in value]
    return value


@dataclasses.dataclass
class RayHead:
    """A private Ray head: loopback, a logical GPU, its own temp dir and ports; stopped by PID."""

    process: subprocess.Popen
    temp_dir: Path
    dashboard: str
    log_path: Path
    auth_env: dict[str, str]  # this head's own auth token (not ~/.ray's), loopback addresses

    @classmethod
    def start(cls, python: str, work: Path, env: dict[str, str], rng: random.Random) -> RayHead:
        temp_dir = Path(tempfile.mkdtemp(prefix="acl-ray-", dir="/tmp"))  # short: Ray's socket paths
        ports = {name: free_port() for name in ("port", "dashboard-port", "node-manager-port", "object-manager-port",
                 "ray-client-server-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                 "metrics-export-port", "runtime-env-agent-port")}  # fmt: skip
        workers = free_range(100, rng)
        argv = [
            python, "-m", "ray.scripts.scripts", "start", "--head", "--block",
            "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", "--include-dashboard=true",
            "--num-gpus=1", "--num-cpus=8", "--object-store-memory=300000000", "--disable-usage-stats",
            f"--temp-dir={temp_dir}", f"--min-worker-port={workers}", f"--max-worker-port={workers + 99}",
            *(f"--{name}={port}" for name, port in ports.items()),
        ]  # fmt: skip
        log_path = work / "ray-head.log"
        token = temp_dir / "auth_token"
        token.write_text(secrets.token_hex(32), encoding="utf-8")
        token.chmod(0o600)
        # Ray 2.60 swaps a loopback node IP for the first interface's address unless told this is a
        # single-machine cluster; then every address it hands out is 127.0.0.1.
        auth_env = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        }
        print(f"[smoke] Ray head: {' '.join(argv[1:])}", file=sys.stderr)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**env, **auth_env},
                                       start_new_session=True)  # fmt: skip
        head = cls(process, temp_dir, f"http://127.0.0.1:{ports['dashboard-port']}", log_path, auth_env)
        try:
            head.wait_ready(240.0)
        except BaseException:
            head.stop()
            raise
        return head

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SmokeError(f"the Ray head exited with status {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.dashboard}/api/version", timeout=5):  # noqa: S310
                    return
            except urllib.error.HTTPError:
                return  # it answers (401 when Ray's token auth is on: the ray CLI brings the token)
            except (OSError, ValueError):
                pass
            time.sleep(2)
        raise SmokeError(f"the Ray head's job server did not answer at {self.dashboard}; see {self.log_path}")

    def pids(self) -> list[int]:
        """Every process of this head: its own group, plus any whose command line names its temp dir."""
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                pgid = os.getpgid(int(entry.name))
            except (OSError, ProcessLookupError):
                continue
            if pgid == self.process.pid or str(self.temp_dir) in cmdline:
                out.append(int(entry.name))
        return out

    def stop(self, grace_s: float = 15.0) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while pids and time.monotonic() < deadline and any(_alive(p) for p in pids):
                time.sleep(0.5)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=1)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        if (Path("/proc") / str(pid) / "stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False  # a zombie: dead, waiting for its parent
    return True


def job_env(recipe_env: dict[str, str]) -> dict[str, str]:
    """The job's environment: the recipe's runtime env plus the bootstrap (and the torchvision stand-in)."""
    env = dict(recipe_env)
    inherited = os.environ.get("PYTHONPATH", "").split(":")  # what the caller's interpreter sees, the job sees
    path = [p for p in [*env.get("PYTHONPATH", "").split(":"), *inherited] if p and Path(p).exists()]
    path = list(dict.fromkeys(path))
    if not _imports("torchvision.io"):
        path.append(str(STANDINS))
    env["PYTHONPATH"] = ":".join(path)
    env["MUSA_PATCH_PATH"] = str(BOOTSTRAP)
    # The smoke's private head is on loopback whatever the recipe's cluster profile says (paper_2x8 hands a
    # multi-node job the routable address and lets Ray swap loopback for it): keep every address 127.0.0.1.
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["no_proxy"] = env["NO_PROXY"] = "localhost,127.0.0.1"
    return env


def _imports(module: str, pythonpath: str | None = None) -> bool:
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath is not None else None
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False, env=env)
    return done.returncode == 0


def submit(python: str, head: RayHead, env: dict[str, str], argv: list[str], log_path: Path, timeout_s: float) -> int:
    """``ray job submit`` (blocking), its output streamed here and kept in ``log_path``; the job's status."""
    cmd = [
        python, "-m", "ray.scripts.scripts", "job", "submit", f"--address={head.dashboard}",
        f"--runtime-env-json={json.dumps({'env_vars': env})}", "--", *argv,
    ]  # fmt: skip
    print(f"[smoke] submitting: {' '.join(argv)}", file=sys.stderr)
    expired = threading.Event()
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, **head.auth_env}, start_new_session=True)  # fmt: skip

        def expire() -> None:  # a job that never ends (or never prints) ends with its head
            expired.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            head.stop()

        watchdog = threading.Timer(timeout_s, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                sys.stderr.write(line)
            status = process.wait()
        finally:
            watchdog.cancel()
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
                process.wait()
    if expired.is_set():
        raise SmokeError(f"the job ran past {timeout_s:.0f}s (--smoke-timeout) and was stopped; see {log_path}")
    return status


# --- the run -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _started(stack: list[Any]) -> Iterator[list[Any]]:
    try:
        yield stack
    finally:
        for item in reversed(stack):
            with contextlib.suppress(Exception):
                item.stop() if isinstance(item, RayHead) else stop_service(item)


def run_smoke(settings: SmokeSettings) -> int:
    """The whole smoke; returns the exit status (0: the job succeeded and every invariant holds)."""
    from aclarena_slime.launcher import smoke_report

    lacking = missing_slime()
    if lacking:
        raise SmokeError(lacking)
    started = time.monotonic()
    recipe = load_recipe(settings.recipe, normalise_overrides(settings.overrides))
    if recipe.kind != "rl":
        raise SmokeError(f"--smoke runs RL stages (slime's rollout side); {recipe.name} is kind {recipe.kind!r}")
    command = compile_recipe(recipe)
    work = settings.work_dir or Path.cwd() / "runs" / "smoke" / f"{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"[smoke] recipe {recipe.name}, env {recipe.data.env}; outputs in {work}", file=sys.stderr)
    env = job_env(command.runtime_env.get("env_vars", {}))
    if not _imports("megatron.training", env["PYTHONPATH"]):
        raise SmokeError(
            "slime's argument parser needs Megatron-LM (megatron.training), not found on the job's PYTHONPATH "
            f"{env['PYTHONPATH']!r}; set paths.megatron=MEGATRON_LM_CHECKOUT"
        )
    script = train_script(recipe)
    local = _local_session(settings)
    model_dir = _model(local, work)
    data = _data(settings, recipe, local.records.env_config, work)
    python = sys.executable
    rng = random.Random()
    dump = work / "dumps"
    llms = {name: s for name, s in recipe.services.items() if served_llm(s) is not None}
    served_names = sorted({served_llm(s) for s in llms.values()} - {None})
    if len(served_names) > 1:
        raise SmokeError(f"the smoke's one engine stands in for one served LLM; the recipe has {served_names}")
    with _started([]) as stack:
        engine_port = free_port()
        engine = ServiceConfig(
            command=[python, "-m", "aclarena_slime", "local", "serve-engine", "--model", str(model_dir),
                     "--host", "127.0.0.1", "--port", str(engine_port),
                     *(["--served-name", served_names[0]] if served_names else [])],
            host="127.0.0.1", port=engine_port, ready_path="/health", ready_timeout_s=300.0,
            url=f"http://127.0.0.1:{engine_port}",
        )  # fmt: skip
        engine_run = start_service("engine", engine, work)
        stack.append(engine_run)
        moved: dict[str, str] = {s.url: engine.url for s in llms.values()}  # the local engine serves them too
        for name in llms:
            print(f"[smoke] service {name}: an LLM server; the smoke's engine answers in its place", file=sys.stderr)
        for name, service in recipe.services.items():
            if name in llms:
                continue
            smoke_service = service_for_smoke(
                service, (recipe.paths.data, recipe.paths.models), settings.data is None, free_port()
            )
            stack.append(start_service(name, smoke_service, work))
            moved[service.url] = smoke_service.url
        custom = rebind_urls(command.custom_config, moved)
        if custom.get("aclarena_lora"):
            custom = serve_first_adapter(custom, model_dir, work / "adapters", engine.url)
        command.custom_config_path = work / "custom_config.yaml"
        command.custom_config = custom
        command.write_custom_config()
        argv, notes = smoke_argv(command, model_dir=model_dir, data=data, engine=f"127.0.0.1:{engine_port}",
                                 dump=dump, custom_config=command.custom_config_path)  # fmt: skip
        print("[smoke] shrunk to {} rollouts of {} prompts x {} samples; turned off:\n{}".format(
            ROLLOUTS, PROMPTS, SAMPLES, "\n".join(notes) or "  (nothing)"), file=sys.stderr)  # fmt: skip
        head_env = {**os.environ, **env}
        head = RayHead.start(python, work, head_env, rng)
        stack.append(head)
        engine_offset = engine_run.log_path.stat().st_size  # what came before is the launcher's own polling
        watched = [item for item in stack if not isinstance(item, RayHead) and item is not engine_run]
        # a recipe service that dies past its restarts ends the job with the smoke's private head
        with ServiceWatch(watched, lambda why: head.stop()) as watch:
            status = submit(python, head, env, [python, str(script), *argv], work / "job.log",
                            settings.timeout_s)  # fmt: skip
        if watch.failure is not None:
            raise SmokeError(f"the job was stopped: {watch.failure}")
    report = smoke_report.build_report(
        dump=dump,
        job_log=work / "job.log",
        engine_log=(engine_run.log_path, engine_offset),
        settings={"rollouts": ROLLOUTS, "prompts": PROMPTS, "samples": SAMPLES, "max_response_len": MAX_RESPONSE_LEN},
        job_status=status,
        seconds=time.monotonic() - started,
        post_process=_flag_values(argv, "--custom-reward-post-process-path"),
        n_samples_per_prompt=SAMPLES,
        leftovers=_leftovers(stack),
    )
    (work / "report.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    print(smoke_report.report_text(report))
    print(f"[smoke] report: {work / 'report.json'}", file=sys.stderr)
    return 0 if report["ok"] else 1


def serve_first_adapter(custom: dict[str, Any], model_dir: Path, sync_dir: Path, engine_url: str) -> dict[str, Any]:
    """A LoRA stage's first sync, which slime skips with --debug-rollout-only: a fresh adapter (B = 0) on the
    smoke's model goes to the engine through the stage's own sync (versioned when the recipe says so), so the
    rollout requests the adapter it would train. Returns the custom config with ``sync_dir`` moved here."""
    import asyncio

    import peft
    from transformers import AutoModelForCausalLM

    from aclarena_slime.lora.config import LoraConfig
    from aclarena_slime.lora.export import peft_adapter_config
    from aclarena_slime.lora.sync import sync_adapter

    lora = {**custom["aclarena_lora"], "sync_dir": str(sync_dir)}
    config = LoraConfig.from_mapping(lora)
    adapter_config = peft_adapter_config(config, str(model_dir))
    model = peft.get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir), peft.LoraConfig(**{**adapter_config, "inference_mode": False})
    )
    tensors = {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(model).items()}
    versioned = config.staleness_budget is not None
    result = asyncio.run(
        sync_adapter(
            [engine_url], str(config.adapter_name), tensors, adapter_config, sync_dir=str(sync_dir),
            version=0 if versioned else None, staleness_budget=config.staleness_budget or 0,
        )
    )  # fmt: skip
    print(f"[smoke] adapter {result.served} served (the first sync slime skips in rollout-only mode)", file=sys.stderr)
    return {**custom, "aclarena_lora": lora}


def _leftovers(started: list[Any]) -> list[int]:
    """PIDs of anything the smoke started that still runs after it stopped everything (should be none)."""
    out: list[int] = []
    for item in started:
        if isinstance(item, RayHead):
            out += [pid for pid in item.pids() if _alive(pid)]
        elif item.process is not None and item.process.poll() is None:
            out.append(item.process.pid)
    return out


def _local_session(settings: SmokeSettings) -> LocalSession:
    """The recipe's local profile (model, env config for demo records): what the local backend would use."""
    from aclarena_slime.local.session import open_session

    overrides = [o for o in settings.overrides if not o.startswith("cluster=")]
    return open_session(load_recipe(settings.recipe, ["cluster=local", *overrides]))


def _model(local: LocalSession, work: Path) -> Path:
    from aclarena_slime.local.stage import LocalStageError, prepare_model

    try:
        return prepare_model(local.model.source, work, local.seed)
    except LocalStageError as exc:
        raise SmokeError(str(exc)) from exc


def _data(
    settings: SmokeSettings, recipe: StageRecipe, env_config: Mapping[str, Any], work: Path
) -> tuple[Path, Path | None]:
    """The user's JSONL, or the env's demo records (the env built with ``env_config``, the local backend's settings
    of it) written as slime JSONL (prompt, label, metadata)."""
    if settings.data is not None:
        train, evaluation = settings.data
        return Path(train).resolve(), Path(evaluation).resolve() if evaluation else None
    from aclarena_slime.evaluation.suite import HELD_OUT_SEED
    from aclarena_slime.jsonl import write_jsonl_atomic
    from aclarena_slime.local.records import RecordError, demo_records
    from aclarena_slime.plugin.registry import get_environment

    env = get_environment(recipe.data.env, dict(env_config))
    try:
        train = demo_records(env, PROMPTS * ROLLOUTS, seed=0)
        evaluation = demo_records(env, EVAL_PROMPTS, HELD_OUT_SEED)  # the prompts every evaluation holds out
    except RecordError as exc:
        raise SmokeError(f"{exc} (or give --smoke-data TRAIN.jsonl[,EVAL.jsonl])") from exc
    out = work / "data"
    write_jsonl_atomic(train, out / "train.jsonl")
    write_jsonl_atomic(evaluation, out / "eval.jsonl")
    return out / "train.jsonl", out / "eval.jsonl"


def main(argv: list[str]) -> int:
    """``launch/stage.sh RECIPE --smoke [overrides] [--smoke-data TRAIN[,EVAL]] [--smoke-dir DIR]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="launch/stage.sh RECIPE --smoke", description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--smoke", action="store_true", help="(the switch that brought you here)")
    parser.add_argument("--smoke-data", default=None, metavar="TRAIN[,EVAL]", help="JSONL instead of demo records")
    parser.add_argument("--smoke-dir", default=None, type=Path, help="output folder (default runs/smoke/NAME-TIME)")
    parser.add_argument("--smoke-timeout", default=1800.0, type=float, help="seconds before the job is stopped")
    args = parser.parse_intermixed_args(argv)
    data = None
    if args.smoke_data:
        train, _, evaluation = args.smoke_data.partition(",")
        data = (train, evaluation or None)
    settings = SmokeSettings(args.recipe, list(args.overrides), data, args.smoke_dir, args.smoke_timeout)
    try:
        return run_smoke(settings)
    except (SmokeError, RecipeError) as exc:
        print(f"stage.sh --smoke: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
