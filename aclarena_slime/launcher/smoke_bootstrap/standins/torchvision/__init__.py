"""An import-only stand-in for torchvision, for slime's rollout-only smoke run on a CPU-only torch.

SGLang (``from torchvision.io import decode_jpeg``) and transformers' image utilities import
torchvision at import time; text rollouts never call it. Every function here raises if called, so a
code path that really needs torchvision fails loudly instead of computing something wrong.
"""

from __future__ import annotations

import enum
import sys
import types
from typing import Any

__version__ = "0.0.0+aclarena.standin"


def _unavailable(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("torchvision is an import-only stand-in in this aclarena smoke job: no image operations")


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4
    RGBA = 4


class _StandIn(types.ModuleType):
    """A submodule whose every unknown attribute is a function that raises when called."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _unavailable


def _submodule(name: str, **attrs: Any) -> _StandIn:
    module = _StandIn(f"{__name__}.{name}")
    module.__dict__.update(attrs)
    sys.modules[module.__name__] = module
    return module


io = _submodule("io", ImageReadMode=ImageReadMode)
transforms = _submodule("transforms", InterpolationMode=InterpolationMode)
transforms.functional = _submodule("transforms.functional", InterpolationMode=InterpolationMode)
transforms.v2 = _submodule("transforms.v2", InterpolationMode=InterpolationMode)
transforms.v2.functional = _submodule("transforms.v2.functional", InterpolationMode=InterpolationMode)
ops = _submodule("ops")
