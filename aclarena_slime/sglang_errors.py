"""What SGLang answers when a request names an adapter it does not serve: its exact words, in one place.

Read from SGLang 0.5.15 (slime 624b824's image): ``TokenizerManager`` remembers every adapter ever
loaded on this server process (``lora_ref_cache``: name -> path) and, when a request names one that is
not loaded now (unloaded, or evicted by ``--max-loaded-loras``), loads it again from that path
(``managers/tokenizer_manager.py``, ``_resolve_lora_path``). A request for an adapter

- never loaded by this process (a restarted engine) fails with :func:`never_loaded`'s message;
- loaded once, whose folder is gone, fails with :func:`implicit_load_failed`'s (its detail is the
  loader's error: for an absolute path that is no folder, huggingface_hub's refusal of it as a repo id);
- loaded once, whose folder is still there, is served again from that folder, silently — which is why
  the weight sync renames a retired version's folder before unloading it.

Both failures are ``ValueError``s that ``/generate`` returns as 400 ``{"error": {"message": ...}}``
(``entrypoints/http_server.py``, ``_create_error_response``). An unload of a name not registered answers
400 ``{"success": false, "error_message": unload_unknown(...), "loaded_adapters": null}``
(``lora/lora_registry.py``, ``unregister``). Our local engine words the first case its own way
(":data:`LOCAL_NOT_LOADED`"). :func:`is_adapter_missing` recognises all of them; the agent loop and the
gateway ask it, the test doubles and the local SGLang server speak through the builders below.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

NEVER_LOADED = "Got LoRA adapter that has never been loaded: "
IMPLICIT_LOAD_FAILED = "Failed to implicitly load LoRA adapter "
LOCAL_NOT_LOADED = "not loaded"  # the local engine: "The following requested LoRA adapters are not loaded: ..."
MISSING_STATUSES = (400, 404)  # SGLang's 400; the local engine's OpenAI endpoints answer an unknown adapter 404


def _keys(names: Iterable[str]) -> str:
    """How SGLang prints its registry's names: ``dict_keys(['math', 'search'])``."""
    return repr(dict.fromkeys(names).keys())


def never_loaded(name: str, loaded: Iterable[str]) -> str:
    """SGLang's message for a request naming an adapter this server process never loaded."""
    return f"{NEVER_LOADED}{name}\nAll loaded adapters: {_keys(loaded)}."


def implicit_load_failed(name: str, detail: str) -> str:
    """SGLang's message when it could not load a remembered adapter again."""
    return f"{IMPLICIT_LOAD_FAILED}{name}: {detail}"


def missing_folder_detail(path: str) -> str:
    """The loader's error for an absolute adapter path that is no folder: SGLang's ``LoRAConfig`` hands it to
    ``snapshot_download``, whose repo-id check refuses it (huggingface_hub 2.4's wording)."""
    return (
        f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'. "
        "Use `repo_type` argument if needed."
    )


def unload_unknown(name: str, loaded: Iterable[str]) -> str:
    """SGLang's message for an unload of a name it does not hold."""
    return f"LoRA with name {name} does not exist. Loaded LoRAs: {_keys(loaded)}"


def resolve_request(name: str, loaded: Iterable[str], remembered: Mapping[str, str]) -> str | None:
    """What SGLang 0.5.15 does with a request for adapter ``name``: None when it serves it (loaded, or
    remembered with its folder still there: reloaded from it), else the message of its 400."""
    names = list(loaded)
    if name in names:
        return None
    if name not in remembered:
        return never_loaded(name, names)
    if os.path.isdir(remembered[name]):
        return None
    return implicit_load_failed(name, missing_folder_detail(remembered[name]))


def is_adapter_missing(status: int, message: str) -> bool:
    """True when an engine's error answer says the adapter asked for is not served (a restarted engine, a
    retired version whose folder is gone, the local engine's "not loaded"): the request may be retried on
    another name or after the adapter is loaded again."""
    if status not in MISSING_STATUSES:
        return False
    return NEVER_LOADED in message or IMPLICIT_LOAD_FAILED in message or LOCAL_NOT_LOADED in message
