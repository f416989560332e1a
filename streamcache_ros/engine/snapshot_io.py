"""Memory snapshots on disk: written atomically, read back and checked before anything is replaced."""
from __future__ import annotations

import os
import threading
from typing import Any

import torch

from .errors import SnapshotError

SNAPSHOT_FORMAT = 1
IDENTITY_KEYS = ("model_id", "config_hash", "policy", "policy_config")


def write_snapshot(path: str, state: dict[str, Any]) -> int:
    """Write ``state`` to ``path`` through a temporary file renamed over it (a crash mid-write leaves
    the last snapshot whole); returns the bytes written."""
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        torch.save({"format": SNAPSHOT_FORMAT, **state}, temporary)
        os.replace(temporary, path)
    except (OSError, RuntimeError) as err:  # torch: RuntimeError for a missing directory
        if os.path.exists(temporary):
            os.remove(temporary)
        raise SnapshotError(f"cannot write snapshot '{path}': {getattr(err, 'strerror', None) or err}") from None
    return os.path.getsize(path)


def read_snapshot(path: str, identity: dict[str, Any]) -> dict[str, Any]:
    """The snapshot at ``path``; refused (SnapshotError naming what differs) when it is not one, or
    was made with another model, policy or policy configuration than ``identity``."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SnapshotError(f"no snapshot at '{path}'") from None
    except Exception as err:  # pickle / zip errors: not a snapshot
        raise SnapshotError(f"'{path}' is not a streamcache snapshot ({type(err).__name__})") from None
    if not isinstance(state, dict) or state.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(f"'{path}' is not a streamcache snapshot (format {SNAPSHOT_FORMAT})")
    for key in IDENTITY_KEYS:
        theirs, ours = state.get(key), identity[key]
        if theirs != ours:
            if isinstance(theirs, dict) and isinstance(ours, dict):  # name only what differs
                keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
                theirs = ", ".join(f"{k}={theirs.get(k)!r}" for k in keys)
                ours = ", ".join(f"{k}={ours.get(k)!r}" for k in keys)
            raise SnapshotError(f"snapshot '{path}' was made with {key} {theirs!r}; this node runs {ours!r}")
    return state
