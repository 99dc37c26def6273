"""Recipe file + Hydra overrides -> a typed, validated :class:`StageRecipe`.

Composition uses Hydra's compose API on the recipe's own folder (the one holding the config groups
``model/``, ``cluster/``, ``algorithm/``, ``lora/``, ``data/``), then merges the result into the
structured schema, so a key the schema lacks fails with a message naming it.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aclarena_slime.launcher import addresses
from aclarena_slime.recipes.schema import BACKENDS, KINDS, StageRecipe

GROUPS = ("paths", "model", "cluster", "algorithm", "lora", "data", "env", "service")


class RecipeError(ValueError):
    """A recipe that cannot be composed or validated; the message names the file and the key."""


def recipes_root(recipe: Path) -> Path:
    """The folder holding the config groups: the recipe's folder (stage recipes live at its top)."""
    folder = recipe.resolve().parent
    if not all((folder / group).is_dir() for group in GROUPS):
        raise RecipeError(
            f"{recipe}: a stage recipe lives next to the config groups {', '.join(GROUPS)} (e.g. recipes/stage1_math.yaml)"
        )
    return folder


def compose_config(recipe: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Hydra composition of one stage recipe with command-line style overrides (``key=value``)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    path = Path(recipe)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        raise RecipeError(f"{recipe}: no such recipe file (expected recipes/<name>.yaml)")
    root = recipes_root(path)
    try:
        with initialize_config_dir(config_dir=str(root), version_base="1.3"):
            return compose(config_name=path.stem, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise RecipeError(f"{path}: {_first_line(exc)}") from exc


def load_recipe(recipe: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> StageRecipe:
    """Compose, type-check and resolve a stage recipe; every error names the offending key."""
    composed = compose_config(recipe, overrides)
    return to_recipe(composed, str(recipe))


def to_recipe(composed: DictConfig, source: str = "<recipe>") -> StageRecipe:
    try:
        schema = OmegaConf.structured(StageRecipe)
        merged = OmegaConf.merge(schema, composed)
        _resolve_addresses(merged, source)
        OmegaConf.resolve(merged)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise RecipeError(f"{source}: required settings have no value: {', '.join(missing)}")
        recipe: StageRecipe = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
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
    if recipe.kind != "sft" and recipe.data.env not in recipe.env_config:
        raise RecipeError(
            f"{source}: no env_config for the data's env tag {recipe.data.env!r} (add env@env_config.TAG: TAG)"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(line.strip() for line in text.splitlines()[:3] if line.strip())
