"""Finding environments by tag: entry points in the group ``aclarena_slime.envs``, loaded lazily.

Nothing central lists the plugins. An outside package declares, in its own pyproject::

    [project.entry-points."aclarena_slime.envs"]
    mytag = "my_pkg.env:MyEnvironment"

A plugin that fails to import fails loudly, naming the plugin; other plugins are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from aclarena_slime.plugin.contract import Environment

ENTRY_POINT_GROUP = "aclarena_slime.envs"

EnvironmentFactory = Callable[[Mapping[str, Any]], Environment]

_registered: dict[str, EnvironmentFactory] = {}


class UnknownEnvironment(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class PluginLoadError(ImportError):
    pass


def register(tag: str, factory: EnvironmentFactory) -> None:
    """Register an environment in-process (tests, notebooks); entry points are the normal way."""
    _registered[tag] = factory


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def entry_point(tag: str) -> EntryPoint | None:
    """The installed entry point of ``tag`` (read from the installed packages' metadata), or None."""
    return _entry_points().get(tag)


def available_tags() -> list[str]:
    return sorted(set(_entry_points()) | set(_registered))


def load_factory(tag: str) -> EnvironmentFactory:
    if tag in _registered:
        return _registered[tag]
    eps = _entry_points()
    if tag not in eps:
        raise UnknownEnvironment(
            f"no environment registered under tag {tag!r}; known tags: {', '.join(available_tags())}"
        )
    claims = {ep.value: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == tag}
    if len(claims) > 1:  # two installed packages claim the tag: which one loads would be an accident
        owners = ", ".join(f"{value} ({_owner(ep)})" for value, ep in sorted(claims.items()))
        raise PluginLoadError(f"environment tag {tag!r} is registered by several installed packages: {owners}")
    try:
        factory = eps[tag].load()
    except Exception as exc:  # the plugin's own import error, re-raised with its name on it
        raise PluginLoadError(f"environment plugin {tag!r} ({eps[tag].value}) failed to load: {exc!r}") from exc
    return factory


def _owner(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"package {dist.metadata['Name']}" if dist is not None else "unknown package"


def environment_class(tag: str) -> type[Environment]:
    """The :class:`Environment` subclass registered under ``tag`` (for what an env says without being built)."""
    factory = load_factory(tag)
    if not (isinstance(factory, type) and issubclass(factory, Environment)):
        raise TypeError(f"plugin {tag!r} is registered as {factory!r}, not an aclarena_slime.plugin.contract.Environment class")
    return factory


def get_environment(tag: str, config: Mapping[str, Any] | None = None) -> Environment:
    """A new environment for ``tag`` and ``config``, owned by the caller (who calls its ``aclose``).

    Nothing is cached here: a rollout builds its envs once in its context
    (:class:`aclarena_slime.rollout.RolloutContext`), which closes them.
    """
    env = load_factory(tag)(dict(config or {}))
    if not isinstance(env, Environment):
        raise TypeError(f"plugin {tag!r} built {type(env).__name__}, not an aclarena_slime.plugin.contract.Environment")
    return env
