"""Finding environments by tag: entry points in the group ``aclarena_slime.envs``, loaded lazily.

Nothing central lists the plugins. An outside package declares, in its own pyproject::

    [project.entry-points."aclarena_slime.envs"]
    mytag = "my_pkg.env:MyEnvironment"

A plugin that fails to import fails loudly, naming the plugin; other plugins are unaffected.

One plugin, several domains: a *variant tag* ``PLUGIN-VARIANT`` (e.g. ``reasoning_gym-spell_backward``) that no
plugin claims itself names the plugin ``PLUGIN`` under a tag of its own, so two stages of one bridge keep apart
everything the tag keys (``env_config.<tag>``, records' ``metadata.env``, experts, forgetting columns). The env
built for it reports the variant tag (``env.tag``); its settings are the stage's ``env_config.<variant tag>``.
An exact registration always wins. The hyphen is legal in Hydra override keys, file names and URLs.
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


VARIANT_SEPARATOR = "-"


def plugin_tag(tag: str) -> str:
    """The registered tag that serves ``tag``: ``tag`` itself when registered, else the longest registered
    ``PLUGIN`` of a variant tag ``PLUGIN-VARIANT``. Raises :class:`UnknownEnvironment` when there is none."""
    known = set(_entry_points()) | set(_registered)
    if tag in known:
        return tag
    cuts = [i for i, char in enumerate(tag) if char == VARIANT_SEPARATOR and 0 < i < len(tag) - 1]
    for cut in reversed(cuts):  # the longest plugin part first: a plugin tag may hold a hyphen itself
        if tag[:cut] in known:
            return tag[:cut]
    variant = f" (nor a plugin of which it is a variant PLUGIN{VARIANT_SEPARATOR}VARIANT)" if cuts else ""
    raise UnknownEnvironment(f"no environment registered under tag {tag!r}{variant}; known tags: {', '.join(sorted(known))}")


def is_variant(tag: str) -> bool:
    """Whether ``tag`` is a variant tag: served by a plugin registered under another tag."""
    return plugin_tag(tag) != tag


def entry_point(tag: str) -> EntryPoint | None:
    """The installed entry point of ``tag`` (read from the installed packages' metadata; a variant's: its
    plugin's), or None."""
    try:
        return _entry_points().get(plugin_tag(tag))
    except UnknownEnvironment:
        return None


def available_tags() -> list[str]:
    return sorted(set(_entry_points()) | set(_registered))


def load_factory(tag: str) -> EnvironmentFactory:
    """The factory registered under ``tag``, or under its plugin's tag for a variant tag (see :func:`plugin_tag`)."""
    tag = plugin_tag(tag)
    if tag in _registered:
        return _registered[tag]
    eps = _entry_points()
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
    """The :class:`Environment` subclass registered under ``tag`` (for what an env says without being built); for
    a variant tag, its plugin's class, whose ``tag`` is the plugin's (only a built env knows its variant)."""
    factory = load_factory(tag)
    if not (isinstance(factory, type) and issubclass(factory, Environment)):
        raise TypeError(f"plugin {tag!r} is registered as {factory!r}, not an aclarena_slime.plugin.contract.Environment class")
    return factory


def get_environment(tag: str, config: Mapping[str, Any] | None = None) -> Environment:
    """A new environment for ``tag`` and ``config``, owned by the caller (who calls its ``aclose``).

    Nothing is cached here: a rollout builds its envs once in its context
    (:class:`aclarena_slime.rollout.RolloutContext`), which closes them. Built for a variant tag, the env's
    ``tag`` is the variant's, so the records it generates and its messages carry it.
    """
    plugin = plugin_tag(tag)
    env = load_factory(plugin)(dict(config or {}))
    if not isinstance(env, Environment):
        raise TypeError(f"plugin {plugin!r} built {type(env).__name__}, not an aclarena_slime.plugin.contract.Environment")
    if plugin != tag:
        env.tag = tag  # type: ignore[misc]  # the instance's tag shadows its class's: this env serves the variant
    return env
