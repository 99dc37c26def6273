"""Labelled prompts of the installed environments, to train and measure the tag classifier.

The router knows no environment: each env plugin contributes its prompts through
:meth:`~aclarena_slime.plugin.contract.Environment.routing_prompts` (by default its ``demo_records``), and the
caller names the tags (a gateway: those of its expert manifest). A tag with no plugin, or a plugin that
fails to load, is an error that names it. Held-out prompts are asked for with another seed and
``exclude=`` the training texts: generated prompts repeat themselves, so another seed alone would test
on training prompts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from aclarena_slime.plugin.registry import environment_class

#: How far ``labelled_prompts`` widens its request to an env before calling its prompts exhausted.
_MAX_WIDENING = 64


def labelled_prompts(
    tags: Iterable[str], n_per_tag: int, seed: int = 0, exclude: Collection[str] = ()
) -> list[tuple[str, str]]:
    """``(prompt text, tag)`` pairs, ``n_per_tag`` for each tag, none of them in ``exclude``.

    Raises :class:`~aclarena_slime.plugin.registry.UnknownEnvironment` or
    :class:`~aclarena_slime.plugin.registry.PluginLoadError` for a tag that does not load, and ``ValueError``
    when an env cannot give enough prompts outside ``exclude``.
    """
    skip = set(exclude)
    out: list[tuple[str, str]] = []
    for tag in tags:
        out += [(text, tag) for text in _prompts(tag, n_per_tag, seed, skip)]
    return out


def _prompts(tag: str, n: int, seed: int, skip: set[str]) -> list[str]:
    """``n`` of the env's routing prompts outside ``skip``, asking for more while too many are excluded."""
    env = environment_class(tag)
    asked = n
    while True:
        texts = [text for text in env.routing_prompts(asked, seed) if text and text not in skip][:n]
        if len(texts) == n:
            return texts
        if asked >= _MAX_WIDENING * max(n, 1):
            raise ValueError(
                f"environment {tag!r} gives only {len(texts)} routing prompts outside the {len(skip)} excluded "
                f"ones (asked for {n}, out of {asked}); its routing_prompts repeat themselves"
            )
        asked *= 4
