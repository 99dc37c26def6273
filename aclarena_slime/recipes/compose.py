"""Recipe file + Hydra overrides -> a typed, validated :class:`StageRecipe`.

Composition uses Hydra's compose API on the recipe's own folder (the one holding the config groups
``model/``, ``cluster/``, ``algorithm/``, ``lora/``, ``data/``), then merges the result into the
structured schema, so a key the schema lacks fails with a message naming it.

A cluster profile may name a backend profile (``cluster.profile``, e.g. ``local``): recipe settings that
backend runs with, in ``profile/<name>.yaml``, then the stage env's own in ``env/<name>/<tag>.yaml`` (when
there is one), both ``# @package _global_``. They are composed after the recipe and before the
command-line overrides, so the profile wins over the recipe and the command line over both.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aclarena_slime.recipes import addresses
from aclarena_slime.recipes.schema import BACKENDS, KINDS, StageRecipe

GROUPS = ("paths", "model", "cluster", "algorithm", "lora", "data", "env", "service", "profile")


class RecipeError(ValueError):
    """A recipe that cannot be composed or validated; the message names the file and the key."""


_ROOT: ContextVar[Path | None] = ContextVar("recipes_root", default=None)  # the recipe being resolved's folder


def held_out(domain_list: str, data: str) -> dict[str, str]:
    """``${aclarena.held_out:LIST,${paths.data}}``: every domain's ``held_out`` sets in a domain list (relative to
    the recipes folder, e.g. ``curriculum/domains/paper.yaml``), by name, under ``data``: a mixed stage's
    per-domain evaluation (the parallel-MLE mix), so a domain joins it with its entry in the list."""
    root = _ROOT.get()
    if root is None:
        raise ValueError("aclarena.held_out resolves inside a stage recipe's composition only")
    path = root / domain_list
    out: dict[str, str] = {}
    try:
        domains = yaml.safe_load(path.read_text())["domains"]
        sets = [(name, file) for d in domains for name, file in (d.get("held_out") or {}).items()]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"aclarena.held_out: {path}: not a domain list ({exc})") from exc
    for name, file in sets:
        if name in out:
            raise ValueError(f"aclarena.held_out: {path}: the held-out set {name!r} is named twice")
        out[name] = f"{data}/{file}"
    return out


OmegaConf.register_new_resolver("aclarena.held_out", held_out, replace=True)


def recipes_root(recipe: Path) -> Path:
    """The folder holding the config groups: the recipe's folder (stage recipes live at its top)."""
    folder = recipe.resolve().parent
    if not all((folder / group).is_dir() for group in GROUPS):
        raise RecipeError(
            f"{recipe}: a stage recipe lives next to the config groups {', '.join(GROUPS)} (e.g. recipes/stage1_math.yaml)"
        )
    return folder


Adjust = Callable[[DictConfig], list[str]]


def compose_config(
    recipe: str | Path, overrides: list[str] | tuple[str, ...] = (), adjust: Adjust | None = None
) -> DictConfig:
    """Hydra composition of one stage recipe with command-line style overrides (``key=value``).

    ``adjust`` sees the composition of the choices (the config groups, ``kind``, ``cluster.backend``) and
    returns further overrides placed before ``overrides``: what the backend that runs the recipe adds (the
    launcher's local profile), so a run composes its recipe once.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    path = Path(recipe)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        raise RecipeError(f"{recipe}: no such recipe file (expected recipes/<name>.yaml)")
    root = recipes_root(path)
    try:
        with initialize_config_dir(config_dir=str(root), version_base="1.3"):
            # The choices first (a value override may name a key only the profile adds), then everything.
            choices = compose(config_name=path.stem, overrides=[o for o in overrides if _picks_profile(o)])
            extra = adjust(choices) if adjust is not None else []
            overrides = [*extra, *overrides]
            if any(_picks_profile(o) for o in extra):  # e.g. cluster=local: its profile applies
                choices = compose(config_name=path.stem, overrides=[o for o in overrides if _picks_profile(o)])
            profile = profile_overrides(choices, root)
            return compose(config_name=path.stem, overrides=[*profile, *overrides])
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise RecipeError(f"{path}: {_first_line(exc)}") from exc


def _picks_profile(override: str) -> bool:
    """Whether an override can change which profile or backend applies: a group choice or a top-level key
    (``kind``), cluster.profile, data.env or cluster.backend."""
    key = override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]
    return "." not in key or key in ("cluster.profile", "data.env", "cluster.backend")


def profile_overrides(composed: DictConfig, root: Path) -> list[str]:
    """The Hydra overrides that add the cluster's backend profile and its env's part to a composition."""
    name = OmegaConf.select(composed, "cluster.profile")
    if not name:
        return []
    if not (root / "profile" / f"{name}.yaml").is_file():
        raise RecipeError(f"cluster.profile={name!r}: no {root / 'profile' / name}.yaml")
    out = [f"+profile@_global_={name}"]
    env = OmegaConf.select(composed, "data.env", default=None)
    if not env:
        return out
    if (root / "env" / name / f"{env}.yaml").is_file():
        return [*out, f"+env/{name}@_global_={env}"]
    return [*out, *_variant_profile(composed, root / "env" / name, str(env))]


def _variant_profile(composed: DictConfig, folder: Path, variant: str) -> list[str]:
    """A variant tag's (``PLUGIN-VARIANT``) env part of a profile: its plugin's file, with the file's
    ``env_config.<plugin>`` section applied to ``env_config.<variant>``, the section the variant's env reads."""
    from aclarena_slime.plugin.registry import UnknownEnvironment, plugin_tag

    try:
        plugin = plugin_tag(variant)
    except UnknownEnvironment:
        return []  # not an env's tag: the recipe's check of data.env says so
    path = folder / f"{plugin}.yaml"
    if plugin == variant or not path.is_file():
        return []
    out = [f"+env/{folder.name}@_global_={plugin}"]
    section = ((yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("env_config") or {}).get(plugin)
    if section:
        if OmegaConf.select(composed, f"env_config.{plugin}", default=None) is None:
            out.append(f"~env_config.{plugin}")  # the file's section serves the variant, not a stage of the plugin
        try:
            out.append(f"++env_config.{variant}={_override_value(section)}")
        except ValueError as exc:
            raise RecipeError(f"{path}: env_config.{plugin} cannot serve the variant {variant!r} ({exc}); "
                              f"write {folder / variant}.yaml") from exc
    return out


def _override_value(value: object) -> str:
    """``value`` (from YAML) as a Hydra override's value; strings are quoted, so none is read as a number."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if "'" in value or "\\" in value:
            raise ValueError(f"the string {value!r} holds a quote or a backslash")
        return f"'{value}'"
    if isinstance(value, list):
        return "[" + ", ".join(_override_value(v) for v in value) + "]"
    if isinstance(value, dict) and all(isinstance(k, str) and k.isidentifier() for k in value):
        return "{" + ", ".join(f"{k}: {_override_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"{value!r} is not a YAML scalar, list or mapping of plain keys")


def load_recipe(
    recipe: str | Path, overrides: list[str] | tuple[str, ...] = (), adjust: Adjust | None = None
) -> StageRecipe:
    """Compose, type-check and resolve a stage recipe (``adjust``: see :func:`compose_config`); every error
    names the offending key."""
    composed = compose_config(recipe, overrides, adjust)
    token = _ROOT.set(recipes_root(Path(recipe)))
    try:
        return to_recipe(composed, str(recipe))
    finally:
        _ROOT.reset(token)


def to_recipe(composed: DictConfig, source: str = "<recipe>") -> StageRecipe:
    try:
        schema = OmegaConf.structured(StageRecipe)
        OmegaConf.set_readonly(schema.cluster.local, False)  # a frozen dataclass: frozen once built, not before
        merged = OmegaConf.merge(schema, composed)
        _resolve_addresses(merged, source)
        OmegaConf.resolve(merged)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise RecipeError(f"{source}: required settings have no value: {', '.join(missing)}")
        recipe: StageRecipe = OmegaConf.to_object(merged)
    except RecipeError:
        raise
    except (OmegaConfBaseException, ValueError) as exc:  # ValueError: a section's own check (LoraConfig, ...)
        raise RecipeError(f"{source}: {_first_line(exc)}") from exc
    _check_choices(recipe, source)
    return recipe


def _resolve_addresses(merged: DictConfig, source: str) -> None:
    """Fill ``cluster.ray.address`` and the services' hosts before the URLs built from them are resolved."""
    multi_node = addresses.nodes_needed(merged.cluster) > 1
    try:
        address, _ = addresses.resolve_head_address(merged.cluster.ray.address, multi_node, addresses.routable_ip)
    except addresses.AddressError as exc:
        raise RecipeError(f"{source}: {exc}") from exc
    merged.cluster.ray.address = address  # None: several nodes, none found; the launch refuses it then
    for service in merged.services.values():
        if service.host is None:
            service.host = address or addresses.LOOPBACK


def _check_choices(recipe: StageRecipe, source: str) -> None:
    if recipe.kind not in KINDS:
        raise RecipeError(f"{source}: kind must be one of {KINDS}, got {recipe.kind!r}")
    if recipe.cluster.backend not in BACKENDS:
        raise RecipeError(f"{source}: cluster.backend must be one of {BACKENDS}, got {recipe.cluster.backend!r}")
    for name, service in recipe.services.items():
        if not service.command:
            raise RecipeError(f"{source}: services.{name}.command is empty")
        if service.max_restarts < 0 or service.check_interval_s <= 0 or service.unready_timeout_s <= 0:
            raise RecipeError(f"{source}: services.{name}: max_restarts must be >= 0, check_interval_s and "
                              "unready_timeout_s positive")  # fmt: skip
    if recipe.kind != "sft" and recipe.data.env not in recipe.env_config:
        tag = recipe.data.env
        raise RecipeError(
            f"{source}: no env_config for the data's env tag {tag!r} (add env@env_config.{tag}: {_group_option(tag)}"
            f" to defaults, or +env@env_config.{tag}={_group_option(tag)} on the command line)"
        )


def _group_option(tag: str) -> str:
    """The ``env/`` group option of a tag's settings: its own, or its plugin's for a variant tag."""
    from aclarena_slime.plugin.registry import UnknownEnvironment, plugin_tag

    try:
        return plugin_tag(tag)
    except UnknownEnvironment:
        return tag


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(line.strip() for line in text.splitlines()[:3] if line.strip())
