"""Labelled prompts of the installed environments, to train and measure the tag classifier.

The router knows no environment: each env plugin contributes its prompts through
:meth:`~aclarena_slime.plugin.contract.Environment.routing_prompts` (by default its ``demo_records``), and the
caller names the tags (a gateway: those of its expert manifest). A tag with no plugin, or a plugin that
fails to load, is an error that names it. Held-out prompts are asked for with another seed and
``exclude=`` the training texts: generated prompts repeat themselves, so another seed alone would test
on training prompts.

A variant tag (``reasoning_gym-spell_backward``: one plugin, several domains) has the prompts of its env built
with its settings (``env_configs``): its plugin's class alone would give every variant the same prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from aclarena_slime.plugin.contract import prompt_text
from aclarena_slime.plugin.registry import environment_class, get_environment, is_variant, plugin_tag

#: How far ``labelled_prompts`` widens its request to an env before calling its prompts exhausted.
_MAX_WIDENING = 64


def labelled_prompts(
    tags: Iterable[str],
    n_per_tag: int,
    seed: int = 0,
    exclude: Collection[str] = (),
    env_configs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[tuple[str, str]]:
    """``(prompt text, tag)`` pairs, ``n_per_tag`` for each tag, none of them in ``exclude``.

    ``env_configs``: env settings by tag; a tag given settings has the demo records' prompts of its env built with
    them (a variant tag must be given its own), the others their plugin's ``routing_prompts``.

    Raises :class:`~aclarena_slime.plugin.registry.UnknownEnvironment` or
    :class:`~aclarena_slime.plugin.registry.PluginLoadError` for a tag that does not load, and ``ValueError``
    when an env cannot give enough prompts outside ``exclude`` or a variant tag has no settings.
    """
    skip = set(exclude)
    out: list[tuple[str, str]] = []
    for tag in tags:
        out += [(text, tag) for text in _prompts(tag, n_per_tag, seed, skip, (env_configs or {}).get(tag))]
    return out


def _source(tag: str, config: Mapping[str, Any] | None) -> Callable[[int, int], list[str]]:
    """What gives the tag's prompts, ``(n, seed) -> texts``."""
    if config is None:
        if is_variant(tag):
            raise ValueError(
                f"{tag!r} is a variant tag of the env {plugin_tag(tag)!r}: its prompts depend on its env settings, "
                f"which the classifier's training needs (env_configs[{tag!r}])"
            )
        return environment_class(tag).routing_prompts
    env = get_environment(tag, config)
    return lambda n, seed: [prompt_text(record.get("prompt")) for record in env.demo_records(n, seed)]


def _prompts(tag: str, n: int, seed: int, skip: set[str], config: Mapping[str, Any] | None = None) -> list[str]:
    """``n`` of the env's routing prompts outside ``skip``, asking for more while too many are excluded."""
    source = _source(tag, config)
    asked = n
    while True:
        texts = [text for text in source(asked, seed) if text and text not in skip][:n]
        if len(texts) == n:
            return texts
        if asked >= _MAX_WIDENING * max(n, 1):
            raise ValueError(
                f"environment {tag!r} gives only {len(texts)} routing prompts outside the {len(skip)} excluded "
                f"ones (asked for {n}, out of {asked}); its routing_prompts repeat themselves"
            )
        asked *= 4
