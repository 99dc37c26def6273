"""What every test tier shares: the test profile (recipes/profile/test.yaml) as command-line overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

PROFILE = Path(__file__).resolve().parents[1] / "recipes" / "profile" / "test.yaml"


def _flat(values: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key}.")
        else:
            text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            out.append(f"++{prefix}{key}={text}")
    return out


@pytest.fixture(scope="session")
def test_profile() -> list[str]:
    """The test profile's settings as overrides (``++key=value``) for a real local stage: after ``cluster=local``
    on the command line, they win over the local profile; a test's own overrides after them win over both."""
    return _flat(yaml.safe_load(PROFILE.read_text(encoding="utf-8")))
