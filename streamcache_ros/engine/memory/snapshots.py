"""Memory snapshots on disk: written atomically, read back and checked before anything is replaced.

A file is one header line, ``streamcache-snapshot <format> <sha256 of the rest>``, then the state as
``torch.save`` writes it. A file that is truncated or altered (the digest differs), of another
format version, or not a snapshot at all is refused before anything is loaded; ``torch.load`` runs
with ``weights_only`` (tensors and plain containers only, never code).
"""
from __future__ import annotations

import hashlib
import io
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import SnapshotError
from ..status import Exchange
from .ledger import UnitLedger

SNAPSHOT_FORMAT = 3
# Older formats, refused with the reason (a snapshot holds positions: they cannot be converted)
OLD_FORMATS = {
    1: "a bare torch.save file without a digest",
    2: "every camera's frames on one position clock, where this node keeps a clock per camera "
       "(docs/architecture.md \"Positions\")",
}
MAGIC = b"streamcache-snapshot"
IDENTITY_KEYS = ("model_id", "config_hash", "policy", "policy_config")
HEADER_LIMIT = 256  # bytes: the header line is far shorter


def check_writable(path: str) -> None:
    """SnapshotError when a snapshot cannot be written at ``path`` (a folder, or in a folder that is
    missing or not writable): checked before the memory is touched for it."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise SnapshotError(f"cannot write snapshot '{path}': it is a folder")
    if not os.path.isdir(folder):
        raise SnapshotError(f"cannot write snapshot '{path}': folder '{folder}' does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SnapshotError(f"cannot write snapshot '{path}': folder '{folder}' is not writable")


def write_snapshot(path: str, state: dict[str, Any]) -> int:
    """Write ``state`` to ``path`` through a temporary file renamed over it (a crash mid-write leaves
    the last snapshot whole); returns the bytes written."""
    buffer = io.BytesIO()
    torch.save({"format": SNAPSHOT_FORMAT, **state}, buffer)
    payload = buffer.getbuffer()
    header = b"%s %d %s\n" % (MAGIC, SNAPSHOT_FORMAT, hashlib.sha256(payload).hexdigest().encode())
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(temporary, "wb") as f:
            f.write(header)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError as err:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise SnapshotError(f"cannot write snapshot '{path}': {err.strerror or err}") from None
    return os.path.getsize(path)


def _payload(path: str) -> bytes:
    """The checked state bytes of the file at ``path``; SnapshotError saying what is wrong."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SnapshotError(f"no snapshot at '{path}'") from None
    except OSError as err:
        raise SnapshotError(f"cannot read snapshot '{path}': {err.strerror or err}") from None
    end = data.find(b"\n", 0, HEADER_LIMIT)
    fields = data[:end].split(b" ") if end > 0 else []
    if len(fields) != 3 or fields[0] != MAGIC:
        older = " (a snapshot of format 1, written before snapshots carried a digest: save it again)" \
            if data.startswith(b"PK") else ""
        raise SnapshotError(f"'{path}' is not a streamcache snapshot{older}")
    if fields[1] != str(SNAPSHOT_FORMAT).encode():
        version = fields[1].decode(errors="replace")
        why = OLD_FORMATS.get(int(version) if version.isdigit() else -1)
        reason = f" ({why}): it cannot be read; record the memory again and save it anew" if why else ""
        raise SnapshotError(f"snapshot '{path}' is of format {version}{reason}; this node reads format "
                            f"{SNAPSHOT_FORMAT}")
    payload = data[end + 1:]
    if hashlib.sha256(payload).hexdigest().encode() != fields[2]:
        raise SnapshotError(f"snapshot '{path}' is damaged: truncated or altered (its digest does not match)")
    return payload


def read_state(path: str) -> dict[str, Any]:
    """The state saved in the snapshot at ``path`` (checked: a snapshot, this format, undamaged)."""
    payload = _payload(path)
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - pickle / zip errors: not a snapshot
        raise SnapshotError(f"'{path}' is not a streamcache snapshot ({type(err).__name__})") from None
    if not isinstance(state, dict) or state.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(f"'{path}' is not a streamcache snapshot (format {SNAPSHOT_FORMAT})")
    return state


def read_snapshot(path: str, identity: dict[str, Any]) -> dict[str, Any]:
    """The snapshot at ``path``; refused (SnapshotError naming what differs) when it is not one, is
    damaged, or was made with another model, policy or policy configuration than ``identity``."""
    state = read_state(path)
    check_identity(path, state, identity)
    return state


def budget_apart(state: dict[str, Any], identity: dict[str, Any]) -> int | None:
    """The snapshot's ``budget_tokens`` when that is all its policy configuration differs in from
    ``identity``'s (same model, same policy): such a memory loads, and the running policy's next
    compression brings it to the budget in force (docs/interfaces.md "ResetMemory, SaveMemory,
    LoadMemory"); None otherwise."""
    theirs, ours = state.get("policy_config"), identity["policy_config"]
    if not isinstance(theirs, dict) or not isinstance(ours, dict) or "budget_tokens" not in ours:
        return None
    if any(state.get(key) != identity[key] for key in IDENTITY_KEYS if key != "policy_config"):
        return None
    budget = theirs.get("budget_tokens")
    if not isinstance(budget, int) or budget == ours["budget_tokens"] or budget < 1:
        return None
    return budget if {**theirs, "budget_tokens": ours["budget_tokens"]} == ours else None


def check_identity(path: str, state: dict[str, Any], identity: dict[str, Any]) -> None:
    """SnapshotError naming what differs when ``state`` was made with another model, policy or
    policy configuration than ``identity``."""
    for key in IDENTITY_KEYS:
        theirs, ours = state.get(key), identity[key]
        if theirs != ours:
            if isinstance(theirs, dict) and isinstance(ours, dict):  # name only what differs
                keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
                theirs = ", ".join(f"{k}={theirs.get(k)!r}" for k in keys)
                ours = ", ".join(f"{k}={ours.get(k)!r}" for k in keys)
            raise SnapshotError(f"snapshot '{path}' was made with {key} {theirs!r}; this node runs {ours!r}")


@dataclass
class SavedMemory:
    """A snapshot read and checked against the running memory, nothing of it applied yet."""

    state: dict[str, Any]
    ledger: dict[str, Any]  # UnitLedger.read_state's
    history: list[Exchange]
    their_budget: int | None  # made at another budget_tokens (``budget_apart``), else None


def read_memory(path: str, identity: dict[str, Any], cameras: tuple[str, ...]) -> SavedMemory:
    """The snapshot at ``path``, refused (SnapshotError) when it is not one, is damaged, was made with
    another model or policy (or policy parameters other than the budget), or holds frames of
    cameras not in ``cameras`` (when given). Everything is read before anything is replaced."""
    state = read_state(path)
    their_budget = budget_apart(state, identity)  # made at another budget: loaded, then brought to ours
    check_identity(path, state, identity if their_budget is None else
                   {**identity, "policy_config": {**identity["policy_config"], "budget_tokens": their_budget}})
    try:
        ledger = UnitLedger.read_state(state)
        history = [Exchange(**x) for x in state["history"]]
    except Exception as err:  # noqa: BLE001 - a file of the right format with the wrong content
        raise SnapshotError(f"snapshot '{path}' has unreadable bookkeeping ({type(err).__name__}: {err})") from None
    held = list(dict.fromkeys(info.camera for info in ledger["units"].values()))
    foreign = [camera for camera in held if camera not in cameras]
    if cameras and foreign:
        raise SnapshotError(f"snapshot '{path}' holds frames of camera(s) {', '.join(repr(c) for c in foreign)} "
                            f"that this node does not have (its cameras: {', '.join(repr(c) for c in cameras)}); "
                            "the memory is unchanged: load it where those cameras are configured")
    return SavedMemory(state, ledger, history, their_budget)


def load_policy_state(policy, saved: SavedMemory, path: str) -> None:
    """The snapshot's cache into ``policy``, or SnapshotError with the policy as it was. A memory
    made at another budget loads at its own; the next chunk's compression brings it to ours."""
    backup = policy.state_dict()
    our_budget = policy.config_dict().get("budget_tokens")
    try:
        if saved.their_budget is not None:
            policy.set_budget(saved.their_budget)
        policy.load_state_dict(saved.state["policy_state"])
    except Exception as err:  # noqa: BLE001 - whatever the policy finds wrong with the tensors
        policy.load_state_dict(backup)
        raise SnapshotError(f"snapshot '{path}' does not fit this cache: {err}") from None
    finally:
        if saved.their_budget is not None:
            policy.set_budget(our_budget)
