"""The one loader of a dotted path to a Python object: slime's hooks (what preflight checks), arena methods,
demo-turn functions, environments' data preparation and the fidelity table's ``code:`` keys."""

from __future__ import annotations

import importlib
from typing import Any


class DottedPathError(ValueError):
    """A path that does not name ``package.module.name`` (or ``package.module:name``)."""


def load_dotted(path: str, *, colon: bool = True) -> Any:
    """The object at ``package.module.name``, or with ``colon`` also ``package.module:name`` (slime's own
    ``load_function`` reads the dotted form only). A module that does not import raises its ``ImportError``, a
    missing name ``AttributeError``: the caller says what it was loading."""
    module_name, sep, attr = path.partition(":") if colon and ":" in path else path.rpartition(".")
    if not sep or not module_name or not attr:
        form = "'package.module.name' (or 'package.module:name')" if colon else "'package.module.name'"
        raise DottedPathError(f"expected a dotted path {form}, got {path!r}")
    return getattr(importlib.import_module(module_name), attr)
