"""Pre-flight checks of a recipe against this machine, before a job spends GPU hours (``aclarena doctor``).

Each check returns :class:`Check` results: ``ok``, ``warn`` (runs, but not as supported) or ``fail``
(the run would crash or train nothing), each failure with the fix. The checks that need the Ray
cluster (nodes, GPUs, services and the LoRA sync folder seen from every node; on several nodes the save
folder and every input too) are in
:mod:`aclarena_slime.launcher.preflight_cluster`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import json
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aclarena_slime.dotted import load_dotted
from aclarena_slime.launcher.hf_export import origin_dir, vocab_mismatch, vocab_size
from aclarena_slime.recipes.addresses import is_loopback, nodes_needed
from aclarena_slime.recipes.compiler import SlimeCommand, is_megatron_checkpoint
from aclarena_slime.recipes.flags import DEPRECATED_SGLANG_FLAGS
from aclarena_slime.recipes.lineage import iteration_dir
from aclarena_slime.recipes.schema import StageRecipe

# What slime's image at slime 624b824 pins (docker/Dockerfile; the shared notes on slime): name ->
# (distribution, import name, supported version prefix, how to get it).
SUPPORTED = {
    "slime": ("slime", "slime.rollout", None, "install THUDM/slime from its repository (pip install -e . --no-deps)"),
    "SGLang": ("sglang", "sglang", "0.5.15", "use slime's image (SGLang 0.5.15.post1)"),
    "Megatron-LM": (None, "megatron.training", None, "put Megatron-LM on PYTHONPATH (paths.megatron; slime's image: /root/Megatron-LM)"),
    "TransformerEngine": ("transformer_engine", "transformer_engine", "2.16", "use slime's image (TransformerEngine 2.16.1)"),
    "torch": ("torch", "torch", "2.11", "use slime's image (torch 2.11, CUDA)"),
}  # fmt: skip
STATUSES = ("ok", "warn", "fail")
# The commits slime's image builds from (slime docker/Dockerfile at 624b824; notes/slime.md).
SUPPORTED_COMMITS = {"slime": "624b824", "megatron": "1dcf0daf"}


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"[{self.status:>4}] {self.name}: {self.detail}"
        return text + (f"\n       fix: {self.fix}" if self.fix else "")


def _installed(dist: str | None, module: str) -> tuple[bool, str | None]:
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return False, None
    try:
        return True, importlib.metadata.version(dist) if dist else None
    except importlib.metadata.PackageNotFoundError:
        return True, None


def check_versions(installed: Callable[[str | None, str], tuple[bool, str | None]] = _installed) -> list[Check]:
    """Each part of the GPU stack: present, and at the version slime's image pins."""
    out = []
    for name, (dist, module, want, how) in SUPPORTED.items():
        present, version = installed(dist, module)
        if not present:
            out.append(Check(f"version {name}", "fail", f"not installed ({module} does not import)", how))
        elif want and version and not version.startswith(want):
            out.append(Check(f"version {name}", "warn", f"{version}; supported {want}.x", how))
        else:
            out.append(Check(f"version {name}", "ok", version or "importable"))
    return out


def _git_head(folder: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def check_paths(recipe: StageRecipe) -> list[Check]:
    """The job runs ``python3 <paths.slime>/train.py`` with ``<paths.megatron>`` on PYTHONPATH: both must be
    there, at the commits slime's image builds from (a warning otherwise)."""
    out = []
    for name, folder, inside in (
        ("slime", recipe.paths.slime, "train.py"),
        ("megatron", recipe.paths.megatron, "megatron/training"),
    ):
        path = Path(folder)
        if not (path / inside).exists():
            out.append(Check(f"paths.{name}", "fail", f"{path / inside} does not exist", f"paths.{name}=WHERE_IT_IS"))
            continue
        head, want = _git_head(path), SUPPORTED_COMMITS[name]
        if head is None:
            out.append(Check(f"paths.{name}", "ok", f"{folder} (not a git checkout: commit unknown)"))
        elif head.startswith(want):
            out.append(Check(f"paths.{name}", "ok", f"{folder} at {head[:12]}"))
        else:
            out.append(
                Check(f"paths.{name}", "warn", f"{folder} at {head[:12]}; supported {want}", "use slime's image")
            )
    return out


def installed_parsers() -> list[argparse.ArgumentParser]:
    """slime's command line as the installed slime, Megatron-LM and SGLang define it (ImportError without them):
    Megatron's parser with slime's arguments, and slime's separate ``--sglang-*`` parser
    (slime/utils/arguments.py ``parse_args``)."""
    from megatron.training.arguments import add_megatron_arguments
    from slime.backends.sglang_utils.arguments import add_sglang_arguments
    from slime.utils.arguments import get_slime_extra_args_provider

    main = argparse.ArgumentParser(allow_abbrev=False, conflict_handler="resolve")
    add_megatron_arguments(main)
    get_slime_extra_args_provider()(main)
    sglang = argparse.ArgumentParser(allow_abbrev=False, conflict_handler="resolve")
    add_sglang_arguments(sglang)
    return [main, sglang]


def check_flags(argv: list[str], build: Callable[[], list[argparse.ArgumentParser]] = installed_parsers) -> list[Check]:
    """Every flag of the compiled command known to the installed parsers (Megatron drops unknown ones silently)."""
    try:
        parsers = build()
    except ImportError as exc:
        return [Check("flags", "fail", f"not installed: cannot build slime's parser ({exc})",
                      "run doctor where slime, Megatron-LM and SGLang import (slime's image)")]  # fmt: skip
    # slime pre-parses these before building the parser (slime/utils/arguments.py _pre_parse_mode).
    known = {opt for parser in parsers for action in parser._actions for opt in action.option_strings}
    known |= {"--train-backend", "--debug-rollout-only", "--debug-train-only", "--load-debug-rollout-data"}
    flags = [arg for arg in argv if arg.startswith("--")]
    unknown = [flag for flag in flags if flag not in known]
    deprecated = [flag for flag in flags if flag in DEPRECATED_SGLANG_FLAGS]
    if unknown:
        return [Check("flags", "fail", f"the installed slime does not know {', '.join(unknown)}",
                      "align the recipe with the installed versions, or install the supported ones")]  # fmt: skip
    if deprecated:
        return [Check("flags", "fail", f"deprecated: {', '.join(deprecated)}",
                      "; ".join(f"{f} -> {DEPRECATED_SGLANG_FLAGS[f]}" for f in deprecated))]  # fmt: skip
    for parser in parsers:  # values too: a wrong type or choice fails here, not after the job started
        parser.exit_on_error = False
        try:
            parser.parse_known_args(argv)
        except argparse.ArgumentError as exc:
            return [Check("flags", "fail", f"the installed parser rejects a value: {exc}", "fix the recipe's value")]
        except SystemExit:  # errors argparse reports itself (on stderr, above)
            return [Check("flags", "fail", "the installed parser rejects the command (see stderr)", "fix the recipe")]
    return [Check("flags", "ok", f"{len(flags)} flags known to the installed slime / Megatron-LM / SGLang")]


def hook_paths(argv: list[str]) -> list[tuple[str, str]]:
    """``(flag, dotted path)`` for each function slime loads by path."""
    hooks = []
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag.endswith("-path") and flag != "--custom-config-path" and not value.startswith("--"):
            hooks.append((flag, value))
    return hooks


def load_hook(path: str) -> Any:
    """What ``slime.utils.misc.load_function`` does (module.attr), without needing slime to say why not."""
    return load_dotted(path, colon=False)


def check_hooks(argv: list[str]) -> list[Check]:
    out = []
    for flag, path in hook_paths(argv):
        try:
            load_hook(path)
        except Exception as exc:  # noqa: BLE001 - any failure is what slime would hit at start
            missing = getattr(exc, "name", None)
            fix = f"install {missing}" if isinstance(exc, ModuleNotFoundError) and missing else "fix the path"
            out.append(Check(f"hook {flag}", "fail", f"{path} does not import: {type(exc).__name__}: {exc}", fix))
        else:
            out.append(Check(f"hook {flag}", "ok", path))
    return out


def check_checkpoint(recipe: StageRecipe) -> list[Check]:
    """``--load`` / ``--ref-load`` exist; a LoRA stage needs a Megatron checkpoint (slime's HF loader
    raises KeyError on the adapters)."""
    out = []
    for name, path in (
        ("checkpoint.load", recipe.checkpoint.load),
        ("checkpoint.ref_load", recipe.checkpoint.ref_load),
    ):
        folder = Path(path)
        if not folder.is_dir() or not any(folder.iterdir()):
            out.append(
                Check(name, "fail", f"{path} is missing or empty", "train the stage it comes from, or fix the path")
            )
        elif is_megatron_checkpoint(folder):
            out.append(Check(name, "ok", f"{path}: Megatron checkpoint"))
        elif recipe.lora.enabled:
            out.append(Check(name, "fail", f"{path}: Hugging Face weights, which a LoRA stage cannot load",
                             "convert with slime's tools/convert_hf_to_torch_dist.py and point at the result"))  # fmt: skip
        else:
            out.append(Check(name, "ok", f"{path}: Hugging Face weights (slime converts them at load)"))
    return out


def check_iteration(recipe: StageRecipe) -> list[Check]:
    """``checkpoint.ckpt_step``'s folder exists: Megatron raises FileNotFoundError at actor init otherwise, after the
    engines started (slime writes iteration = 0-based rollout id: iter_0000499 after the 500th rollout)."""
    step = recipe.checkpoint.ckpt_step
    if step is None:
        return []
    folder = iteration_dir(recipe.checkpoint.load, step)
    if folder.is_dir():
        return [Check("checkpoint.ckpt_step", "ok", str(folder))]
    there = sorted(p.name for p in Path(recipe.checkpoint.load).glob("iter_*"))
    return [Check("checkpoint.ckpt_step", "fail", f"{folder} does not exist (there: {', '.join(there) or 'none'})",
                  "checkpoint.ckpt_step=ONE_OF_THOSE (slime saves after rollout N as iter_{N-1})")]  # fmt: skip


def check_export(recipe: StageRecipe) -> list[Check]:
    """The HF weights SGLang serves have the config's vocabulary rows (an export without --vocab-size keeps
    Megatron's padding and SGLang refuses it). A missing export of ``ckpt_step`` is made by the launcher."""
    folder = Path(recipe.model.hf_checkpoint)
    if not folder.is_dir():
        if recipe.checkpoint.ckpt_step is not None:
            return [Check("hf export", "ok", f"{folder} missing: the launcher makes it first (--dry-run shows how)")]
        return []  # the tokenizer check reports it
    if not any(folder.glob("*.safetensors")):
        return [Check("hf export", "warn", f"{folder} holds no *.safetensors: vocabulary rows not checked")]
    why = vocab_mismatch(folder)
    if why is not None:
        fix = f"remove it; the launcher exports it again with --vocab-size {vocab_size(recipe)}"
        return [Check("hf export", "fail", why, fix)]
    return [Check("hf export", "ok", f"{folder}: vocabulary rows match its config")]


def check_tokenizer(recipe: StageRecipe) -> list[Check]:
    folder = recipe.model.hf_checkpoint
    if not Path(folder).is_dir() and recipe.checkpoint.ckpt_step is not None:
        folder = str(origin_dir(recipe))  # the export the launcher makes copies its tokenizer from there
    if not Path(folder).is_dir():
        return [Check("tokenizer", "fail", f"{folder} does not exist",
                      "set model.hf_checkpoint to an HF folder with the tokenizer files")]  # fmt: skip
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # noqa: BLE001 - reported, with the path
        return [Check("tokenizer", "fail", f"{folder}: {type(exc).__name__}: {exc}",
                      "set model.hf_checkpoint to an HF folder with the tokenizer files")]  # fmt: skip
    return [Check("tokenizer", "ok", f"{type(tokenizer).__name__}, {len(tokenizer)} tokens")]


def _first_records(path: Path, n: int) -> list[dict[str, Any]]:
    records = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                records.append(json.loads(line))
            if len(records) == n:
                break
    return records


async def _start_records(recipe: StageRecipe, records: list[dict[str, Any]]) -> None:
    from aclarena_slime.plugin.contract import Task
    from aclarena_slime.plugin.registry import get_environment

    data = recipe.data
    allowed = {data.env, *(recipe.lora.experts or ())}  # parallel MLE: a record of any expert's env
    envs: dict[str, Any] = {}
    try:
        for record in records:
            metadata = dict(record.get(data.metadata_key) or {})
            tag = metadata.get("env", data.env)
            if tag not in allowed:
                raise ValueError(f"a record's metadata.env is {tag!r}, the recipe's data.env {data.env!r}")
            if tag not in envs:
                envs[tag] = get_environment(tag, recipe.env_config.get(tag))
            label = record.get(data.label_key) if data.label_key else None
            episode = await envs[tag].start(Task(prompt=record[data.input_key], label=label, metadata=metadata))
            await episode.close()
        _check_labels(recipe, envs)
    finally:
        for env in envs.values():
            await env.aclose()


def _check_labels(recipe: StageRecipe, envs: dict[str, Any]) -> None:
    """Every record's label through its env's ``check_label``: a bad one fails now, naming ``file:line``."""
    from aclarena_slime.jsonl import iter_jsonl
    from aclarena_slime.plugin.contract import Task
    from aclarena_slime.plugin.registry import get_environment

    data = recipe.data
    if not data.label_key:
        return
    allowed = {data.env, *(recipe.lora.experts or ())}
    for number, record in iter_jsonl(data.prompt_data):
        tag = dict(record.get(data.metadata_key) or {}).get("env", data.env)
        if tag not in allowed:
            raise ValueError(f"{data.prompt_data}:{number}: metadata.env is {tag!r}, the recipe's data.env {data.env!r}")
        if tag not in envs:  # the caller closes every env built here
            envs[tag] = get_environment(tag, recipe.env_config.get(tag))
        env = envs[tag]
        try:
            env.check_label(Task(prompt="", label=record.get(data.label_key)).label_value)
        except ValueError as exc:
            raise ValueError(f"{data.prompt_data}:{number}: bad label for env {env.tag!r}: {exc}") from None


def check_data(recipe: StageRecipe, n: int = 3, timeout_s: float = 60.0) -> list[Check]:
    """Every data file exists; the first records of the training data go through the env's ``start``, and every
    record's label through its ``check_label``."""
    files = {"data.prompt_data": recipe.data.prompt_data}
    files.update({f"data.eval_prompt_data.{k}": v for k, v in recipe.data.eval_prompt_data.items()})
    out = []
    for name, path in files.items():
        if not Path(path).is_file():
            out.append(Check(name, "fail", f"{path} does not exist", f"aclarena data prepare {recipe.data.env} ..."))
        else:
            out.append(Check(name, "ok", path))
    if recipe.kind == "sft" or not Path(recipe.data.prompt_data).is_file():
        return out
    try:
        records = _first_records(Path(recipe.data.prompt_data), n)
        asyncio.run(asyncio.wait_for(_start_records(recipe, records), timeout_s))
    except Exception as exc:  # noqa: BLE001 - the env's own error, reported
        out.append(Check("data through env.start", "fail", f"{type(exc).__name__}: {exc}",
                         "check the records against the env's README (prompt, label, metadata.env)"))  # fmt: skip
    else:
        out.append(Check("data through env.start", "ok", f"first {len(records)} records of {recipe.data.env}"))
    return out


def check_lora(recipe: StageRecipe, argv: list[str]) -> list[Check]:
    """The combinations that crash or silently train nothing on a cluster (issue 15)."""
    if not recipe.lora.enabled:
        return [Check("lora", "ok", "full fine-tuning stage")]
    out = []
    if recipe.cluster.colocate:
        backed = "--sglang-enable-weights-cpu-backup" in argv
        out.append(Check("lora colocate", "ok" if backed else "fail",
                         "SGLang keeps a CPU copy of the backbone" if backed else "SGLang would lose the backbone",
                         "" if backed else "pass --sglang-enable-weights-cpu-backup (the compiler adds it)"))  # fmt: skip
    sp = "--sequence-parallel" in argv
    out.append(Check("lora sequence parallel", "fail" if sp else "ok", "on" if sp else "off",
                     "cluster.perf.sequence_parallel=false" if sp else ""))  # fmt: skip
    granularity = recipe.cluster.perf.get("recompute_granularity")
    out.append(Check("lora recompute", "ok", f"recompute {granularity or 'off'}"))
    if recipe.lora.experts:
        out += check_parallel_experts(recipe, argv)
    return out


def check_parallel_experts(recipe: StageRecipe, argv: list[str]) -> list[Check]:
    """Parallel MLE (``lora.experts``): every expert's env configured and present in the training data, the
    prompts drawn domain-balanced, and no slime setting that breaks the per-sample adapter index."""
    from aclarena_slime.distill.balanced_source import domain_of

    experts = list(recipe.lora.experts or ())
    out = [Check("lora experts", "ok", f"{len(experts)} experts side by side: {', '.join(experts)}")]
    balanced = "aclarena_slime.slime_edge.data_source.BalancedDataSource"
    source = argv[argv.index("--data-source-path") + 1] if "--data-source-path" in argv else None
    out.append(Check("lora experts data source", "ok" if source == balanced else "fail", str(source),
                     "" if source == balanced else f"plugins.data_source_path={balanced}"))  # fmt: skip
    if "--allgather-cp" in argv:
        out.append(Check("lora experts context parallel", "fail", "--allgather-cp is set",
                         "drop it: the adapter index follows slime's per-sample context-parallel split"))  # fmt: skip
    path = Path(recipe.data.prompt_data)
    if path.is_file():
        seen = {domain_of(r.get("metadata"), None) for r in _first_records(path, 10_000)}
        missing = [tag for tag in experts if tag not in seen]
        out.append(Check("lora experts in the data", "fail" if missing else "ok",
                         f"no records of {missing} in the first 10000 of {path}" if missing else f"every expert in {path}",
                         "mix every expert's training file into data.prompt_data" if missing else ""))  # fmt: skip
    return out


def check_addresses(recipe: StageRecipe) -> list[Check]:
    ray, nodes = recipe.cluster.ray, nodes_needed(recipe.cluster)
    if ray.address is None:
        return [Check("ray head address", "fail", f"{nodes} nodes and no routable address here",
                      "cluster.ray.address=HEAD_IP")]  # fmt: skip
    if nodes > 1 and is_loopback(ray.address):
        return [
            Check(
                "ray head address", "fail", f"{ray.address} is loopback on {nodes} nodes", "cluster.ray.address=HEAD_IP"
            )
        ]
    return [Check("ray head address", "ok", f"{ray.address} ({nodes} node{'s' if nodes > 1 else ''})")]


def recipe_checks(recipe: StageRecipe, command: SlimeCommand) -> list[Check]:
    """Everything that needs no Ray cluster."""
    argv = command.train_args
    return [
        *check_versions(), *check_paths(recipe), *check_flags(argv), *check_hooks(argv), *check_addresses(recipe),
        *check_checkpoint(recipe), *check_iteration(recipe), *check_export(recipe), *check_tokenizer(recipe),
        *check_data(recipe), *check_lora(recipe, argv),
    ]  # fmt: skip


def failed(checks: Iterable[Check]) -> bool:
    return any(check.status == "fail" for check in checks)


def as_json(checks: list[Check]) -> str:
    return json.dumps({"ok": not failed(checks), "checks": [asdict(c) for c in checks]}, indent=2)
