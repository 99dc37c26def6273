"""The HF export SGLang serves for a stage on an earlier iteration of another (the MLE experts on an SDFT iteration).

Megatron pads the vocabulary to a multiple of 128 x TP (151,936 -> 152,064 at TP 2); slime's
``tools/convert_torch_dist_to_hf.py`` strips the padding only when given ``--vocab-size``, and SGLang asserts
that the embedding has exactly the config's rows, so an export without it never starts an engine.
:func:`ensure_export` makes the export (once, atomically) before the job is submitted, with the vocabulary
size of the recipe's model config, and checks the rows of what it serves.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

from aclarena_slime.recipes.lineage import iteration_dir
from aclarena_slime.recipes.schema import StageRecipe

# HF names of the tensors whose first dimension is the vocabulary (Qwen3 / Llama layout).
VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


class ExportError(RuntimeError):
    pass


def vocab_size(recipe: StageRecipe) -> int:
    """The unpadded vocabulary: the model's ``--vocab-size`` (recipes/model/*.yaml)."""
    size = recipe.model.architecture.get("vocab_size")
    if not size:
        raise ExportError(f"model.architecture.vocab_size is not set for {recipe.model.name}: the export needs it")
    return int(size)


def origin_dir(recipe: StageRecipe) -> Path:
    """The base model's HF folder (tokenizer and config the export copies): ``<paths.models>/<model.name>``."""
    return Path(recipe.paths.models) / recipe.model.name


def export_argv(recipe: StageRecipe, output: str | Path) -> list[str]:
    """slime's converter for ``checkpoint.load``'s iteration ``checkpoint.ckpt_step`` into ``output``."""
    step = recipe.checkpoint.ckpt_step
    if step is None:
        raise ExportError(f"{recipe.name}: checkpoint.ckpt_step is not set: no iteration to export")
    return [
        "python3", f"{recipe.paths.slime}/tools/convert_torch_dist_to_hf.py",
        "--input-dir", str(iteration_dir(recipe.checkpoint.load, step)), "--output-dir", str(output),
        "--origin-hf-dir", str(origin_dir(recipe)), "--vocab-size", str(vocab_size(recipe)), "--force",
    ]  # fmt: skip


def safetensors_shapes(folder: str | Path) -> dict[str, list[int]]:
    """Tensor name -> shape from the headers of every ``*.safetensors`` in ``folder`` (no tensor is read)."""
    shapes: dict[str, list[int]] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        with file.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        shapes.update({name: entry["shape"] for name, entry in header.items() if name != "__metadata__"})
    return shapes


def vocab_mismatch(folder: str | Path, expected: int | None = None) -> str | None:
    """Why ``folder`` is not an export SGLang starts on (rows of the vocabulary tensors != the config's), or None."""
    folder = Path(folder)
    config = folder / "config.json"
    if not config.is_file():
        return f"{config} is missing"
    want = json.loads(config.read_text())["vocab_size"] if expected is None else expected
    shapes = safetensors_shapes(folder)
    if not shapes:
        return f"{folder} holds no *.safetensors"
    bad = [f"{name} has {shapes[name][0]} rows" for name in VOCAB_TENSORS if name in shapes and shapes[name][0] != want]
    if bad:
        return f"{folder}: {', '.join(bad)}, the config's vocab_size is {want} (exported without --vocab-size?)"
    if not any(name in shapes for name in VOCAB_TENSORS):
        return f"{folder} has none of {', '.join(VOCAB_TENSORS)}"
    return None


Runner = Callable[[list[str], dict[str, str]], int]


def _run(argv: list[str], env: dict[str, str]) -> int:
    return subprocess.run(argv, check=False, env={**os.environ, **env}).returncode


def ensure_export(recipe: StageRecipe, run: Runner = _run) -> str | None:
    """For a stage on ``checkpoint.ckpt_step`` of another: make ``model.hf_checkpoint`` when it is missing, and check
    its vocabulary rows either way. Returns what was done (None: nothing to do); raises :class:`ExportError`."""
    if recipe.checkpoint.ckpt_step is None:
        return None
    target, want = Path(recipe.model.hf_checkpoint), vocab_size(recipe)
    made = None
    if not target.exists():
        source = iteration_dir(recipe.checkpoint.load, recipe.checkpoint.ckpt_step)
        if not source.is_dir():
            raise ExportError(f"{source} does not exist: the stage it comes from has not written that iteration")
        partial = target.with_name(f".{target.name}.partial")
        argv = export_argv(recipe, partial)
        print(f"[export] {' '.join(argv)}")
        env = {"PYTHONPATH": f"{recipe.paths.slime}:{recipe.paths.megatron}"}
        if run(argv, env) != 0:
            raise ExportError(f"the conversion of {source} failed (see above)")
        why = vocab_mismatch(partial, want)
        if why is not None:
            raise ExportError(why)
        os.replace(partial, target)
        made = f"exported {source} to {target}"
    why = vocab_mismatch(target, want)
    if why is not None:
        raise ExportError(f"{why}; remove it and rerun: the launcher exports with --vocab-size {want}")
    return made or f"{target}: vocabulary rows match {want}"
