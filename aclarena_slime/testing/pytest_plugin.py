"""Pytest fixtures and markers for env plugin authors and our own suite: a tiny checkpoint, a fake engine.

Installed with the package as a pytest plugin (entry point ``pytest11``, name ``aclarena_slime``):
any test run in an environment where ``aclarena-slime`` is installed has the fixtures
``tiny_checkpoint`` and ``tiny_tokenizer`` and the markers ``slime`` and ``gpu`` (skipped where slime
does not import, or where there is no CUDA GPU). ``-p no:aclarena_slime`` turns it off.
"""

from __future__ import annotations

from pathlib import Path

import pytest

try:  # a dev dependency: without it, no async tests, and nothing to close after them
    import pytest_asyncio
except ImportError:  # pragma: no cover - the dev extra installs it
    pytest_asyncio = None

MARKERS = {
    "slime": "needs THUDM/slime importable (skipped otherwise)",
    "gpu": "needs a CUDA GPU (skipped otherwise)",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with the tiny tokenizer (what ``args.hf_checkpoint`` points at)."""
    from aclarena_slime.local.tiny_model import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-ckpt"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_checkpoint: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_checkpoint)


if pytest_asyncio is not None:

    @pytest_asyncio.fixture(autouse=True)
    async def _close_rollout_context():
        """Each test has its own event loop: close the rollout context a test's generate / reward calls built on it
        (its envs' ``aclose`` and its HTTP session), as slime's process does at exit.

        ``pytest_asyncio.fixture``, not ``pytest.fixture``: in pytest-asyncio's strict mode (a plugin
        author's default) a plain-decorated async fixture is never awaited and breaks every test.
        """
        yield
        from aclarena_slime.slime_edge.rollout import close_context

        await close_context()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``slime`` tests run only where slime imports; ``gpu`` tests only where CUDA is present."""
    if not any(item.get_closest_marker(name) for item in items for name in MARKERS):
        return  # nothing to decide: do not pay for importing slime or torch
    try:
        import slime.utils.types  # noqa: F401

        has_slime = True
    except Exception:  # noqa: BLE001 - any import failure means "no usable slime here"
        has_slime = False
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    for item in items:
        if item.get_closest_marker("slime") and not has_slime:
            item.add_marker(pytest.mark.skip(reason="slime is not importable here (install it from its repository)"))
        if item.get_closest_marker("gpu") and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU here"))
