"""Regenerate ``known_flags.txt``: every long flag slime's ``train.py`` accepts, from real checkouts.

Why: Megatron parses slime's command line with unknown arguments ignored, so a misspelled flag is
silently dropped. The compiler checks each emitted flag against this list instead.

Usage (nothing fetched here; point it at checkouts you have)::

    python -m aclarena_slime.recipes.regenerate_flags \\
        --slime /path/to/slime --megatron /path/to/Megatron-LM --sglang /path/to/site-packages-with-sglang

The three parsers are built exactly as slime builds them: Megatron's ``add_megatron_arguments``,
slime's ``get_slime_extra_args_provider()``, and SGLang's ``ServerArgs.add_cli_args`` behind slime's
``--sglang-`` prefix wrapper. Modules only needed at run time (triton, transformer_engine, CUDA
kernels, ...) are replaced by inert stubs while the parsers are built; only flag names are read.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

OUTPUT = Path(__file__).with_name("known_flags.txt")
# Packages whose real code we need; a missing module anywhere else gets a stub.
REAL_PACKAGES = ("megatron", "slime", "sglang")


class _Anything(type):
    """A class that answers every attribute, call, subscription and base-class use."""

    def __getattr__(cls, name: str) -> type:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _anything(name)

    def __getitem__(cls, _item: object) -> type:
        return cls

    def __call__(cls, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _DecoratorFactoryResult()

    def __or__(cls, _other: object) -> type:
        return cls

    __ror__ = __or__


class _DecoratorFactoryResult:
    """What calling a stub returns: usable as a decorator, with no attributes (so probes fail cleanly)."""

    def __call__(self, fn: object) -> object:
        return fn


def _anything(name: str) -> type:
    return _Anything(name, (), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _anything(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self.stubbed: set[str] = set()

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in self.stubbed:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "999.0.0"  # passes any "newer than" gate on the stubbed package
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _import_with_stubs(name: str, finder: _StubFinder, attempts: int = 60) -> types.ModuleType:
    """Import ``name``, stubbing each missing third-party module it needs, one at a time."""
    for _ in range(attempts):
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            missing = (getattr(exc, "name", None) or "").split(".")[0]
            if not missing or missing in REAL_PACKAGES or missing in finder.stubbed:
                # A name missing *inside* a real package (e.g. a symbol): stub the module that lacks it.
                missing = _module_lacking_symbol(exc) or missing
                if not missing or missing in finder.stubbed:
                    raise
            finder.stubbed.add(missing)
            for loaded in [m for m in sys.modules if m.split(".")[0] in (*REAL_PACKAGES, missing)]:
                del sys.modules[loaded]
    raise RuntimeError(f"gave up importing {name}; stubbed {sorted(finder.stubbed)}")


def _module_lacking_symbol(exc: ImportError) -> str | None:
    # "cannot import name 'X' from 'pkg.mod'" -> the top-level package, if it is not one of ours.
    text = str(exc)
    if "from '" not in text:
        return None
    top = text.split("from '")[1].split("'")[0].split(".")[0]
    return None if top in REAL_PACKAGES else top


def _tolerate_config_reregistration() -> None:
    # SGLang registers configs (e.g. qwen3_asr) that newer transformers already ship; keep the first.
    from transformers.models.auto import configuration_auto

    mapping = type(configuration_auto.CONFIG_MAPPING)
    original = mapping.register

    def register(self: object, key: str, value: object, exist_ok: bool = False) -> None:
        original(self, key, value, exist_ok=True)

    mapping.register = register


def _long_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")}


def collect(slime: Path, megatron: Path, sglang: Path) -> dict[str, set[str]]:
    """Build the three parsers and return their long flags by source."""
    sys.path[:0] = [str(megatron), str(slime), str(sglang)]
    finder = _StubFinder()
    sys.meta_path.append(finder)

    mega = _import_with_stubs("megatron.training.arguments", finder)
    megatron_parser = argparse.ArgumentParser(allow_abbrev=False)
    mega.add_megatron_arguments(megatron_parser)

    _tolerate_config_reregistration()
    slime_args = _import_with_stubs("slime.utils.arguments", finder)  # imports SGLang's ServerArgs too
    slime_parser = argparse.ArgumentParser(allow_abbrev=False, conflict_handler="resolve")
    slime_args.get_slime_extra_args_provider()(slime_parser)
    # slime pre-parses these in _pre_parse_mode and removes them from the main parser.
    pre_parsed = {"--train-backend", "--debug-rollout-only", "--debug-train-only", "--load-debug-rollout-data"}

    sglang_args = _import_with_stubs("slime.backends.sglang_utils.arguments", finder)
    sglang_parser = argparse.ArgumentParser(allow_abbrev=False, conflict_handler="resolve")
    sglang_args.add_sglang_arguments(sglang_parser)

    return {
        "megatron": _long_flags(megatron_parser),
        "slime": _long_flags(slime_parser) | pre_parsed,
        "sglang": {f for f in _long_flags(sglang_parser) if f.startswith("--sglang-")} | {"--prefill-num-servers"},
        "stubbed": finder.stubbed,
    }


def write(found: dict[str, set[str]], header: list[str], output: Path = OUTPUT) -> int:
    flags = sorted(found["megatron"] | found["slime"] | found["sglang"])
    lines = [f"# {line}" for line in header]
    lines += [
        f"# counts: megatron {len(found['megatron'])}, slime {len(found['slime'])}, sglang {len(found['sglang'])}"
    ]
    lines += [f"# stubbed while building the parsers: {', '.join(sorted(found['stubbed'])) or 'none'}", ""]
    output.write_text("\n".join(lines + flags) + "\n", encoding="utf-8")
    return len(flags)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slime", type=Path, required=True, help="slime checkout (the folder holding slime/)")
    parser.add_argument("--megatron", type=Path, required=True, help="Megatron-LM checkout (holding megatron/)")
    parser.add_argument("--sglang", type=Path, required=True, help="folder holding the sglang package")
    parser.add_argument("--note", action="append", default=[], help="provenance line for the header (repeatable)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    found = collect(args.slime, args.megatron, args.sglang)
    header = [
        "Long flags accepted by slime's train.py (slime + Megatron-LM + --sglang-* server flags).",
        "Generated by: python -m aclarena_slime.recipes.regenerate_flags (do not edit by hand).",
        *args.note,
    ]
    count = write(found, header, args.output)
    print(f"wrote {count} flags to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
