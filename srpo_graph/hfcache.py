"""Hub names found in the local Hugging Face cache, with no network call (a shared helper: lang's
chat-template check, models' ``resolve_model`` and runtime's tokenizers read the cache through it).

Consumes a policy's model string that names a hub repository (``"Qwen/Qwen2.5-0.5B-Instruct"``)
and the environment (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``, ``HF_HUB_CACHE`` / ``HF_HOME``);
produces the snapshot folder ``huggingface_hub`` laid out
(``HUB/models--Qwen--Qwen2.5-0.5B-Instruct/snapshots/<revision>/``, the revision read from
``refs/main``) or, when the model is not there and the hub is offline, one error naming the
cache and the fix. Every consumer of a model string goes through ``models.resolve_model``, so
``check``, ``run``, ``train``, ``eval``, the language server and an SGLang launch (which is
handed the folder, not the name) all read the same files and none of them dials out.
It does not download and does not know what the files hold.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_TRUE = {"1", "ON", "YES", "TRUE"}
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_offline() -> bool:
    """Whether the Hugging Face libraries are told not to use the network (``HF_HUB_OFFLINE=1`` or
    ``TRANSFORMERS_OFFLINE=1``), read now (not at import, as huggingface_hub's constants are)."""
    return any(os.environ.get(k, "").upper() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_cache() -> Path:
    """The hub cache huggingface_hub uses: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` (default ``~/.cache/huggingface/hub``)."""
    env = os.environ
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(env[key]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface" / "hub"


def is_hub_name(name: str) -> bool:
    """``ORG/NAME`` that is not a path on this machine.

    >>> is_hub_name("Qwen/Qwen2.5-0.5B-Instruct"), is_hub_name("tiny"), is_hub_name("/models/qwen")
    (True, False, False)
    """
    return bool(_REPO.fullmatch(name)) and not Path(name).exists()


def cached_snapshot(repo_id: str, revision: str = "main") -> Path | None:
    """The snapshot folder of ``repo_id`` in :func:`hub_cache` (None when it is not there or holds
    no ``config.json``), found from the files alone: ``huggingface_hub.snapshot_download`` with
    ``local_files_only``."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=hub_cache(), local_files_only=True))
    except Exception:  # noqa: BLE001 - LocalEntryNotFoundError and friends: not in the cache
        return None
    return folder if (folder / "config.json").is_file() else None


def missing_message(repo_id: str) -> str:
    """What to say when ``repo_id`` is not in the cache of an offline machine."""
    cache = hub_cache()
    return (
        f"model {repo_id!r} is not in the Hugging Face cache at {cache} (looked for "
        f"{cache / ('models--' + repo_id.replace('/', '--'))}/refs/main and its snapshot) and the hub is offline "
        "(HF_HUB_OFFLINE=1): nothing is downloaded. Fix: on a machine with network, "
        f"`hf download {repo_id}` (huggingface-cli download) and copy its cache folder here, or point "
        "HF_HUB_CACHE (or HF_HOME) at a cache that has it, or give the model's local folder as the policy's model"
    )
