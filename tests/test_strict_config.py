from dataclasses import dataclass

import pytest

from aclarena_slime.plugin.settings import from_mapping


@dataclass
class Settings:
    rank: int = 16
    alpha: float = 32.0


def test_known_keys_build_unknown_keys_are_named():
    assert from_mapping(Settings, {"rank": 8}, "lora settings") == Settings(rank=8)

    class Refused(ValueError):
        pass

    with pytest.raises(Refused, match=r"unknown lora settings \['rnak'\]; known: \['alpha', 'rank'\]"):
        from_mapping(Settings, {"rnak": 8}, "lora settings", Refused)
