"""Evaluation: suites from YAML, a runner over any SGLang-speaking endpoint, the forgetting monitor.

The names below load their module on first use, so a caller of one part (the suite format, the monitor)
does not import the runner and its HTTP stack.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EvalDataset": "suite",
    "EvalSuite": "suite",
    "SuiteError": "suite",
    "load_suite": "suite",
    "parse_suite": "suite",
    "ResultsExist": "runner",
    "RunSettings": "runner",
    "load_experts": "runner",
    "run_suite": "runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
