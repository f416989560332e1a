"""The node's memory services, reset_memory, save_memory, load_memory and memory_timeline
(docs/interfaces.md), and the memory snapshot it keeps at memory_snapshot_path (snapshots.py).

A refusal answers with the engine's own reason (a snapshot of another model or policy, a missing
or damaged file); the memory is then unchanged. save_memory and load_memory take names inside
``snapshot_dir`` only: any participant on the ROS domain can call them (docs/reliability.md,
"Securing the memory services").
"""
from __future__ import annotations

import os
import traceback
from typing import Callable

from ..engine.errors import SnapshotError, StreamCacheError
from . import translate
from .cameras import Cameras
from .snapshots import SnapshotKeeper, in_snapshot_dir


class _RequestError(StreamCacheError):
    """A service request that cannot be served as asked (the message says why)."""


class MemoryServices:
    """Serves reset_memory, save_memory, load_memory and memory_timeline over ``session``, and writes
    the memory snapshot. Given the ``cameras`` (whose waiting frames a reset or a load makes stale),
    the ``snapshots`` keeper and ``snapshot_dir``, the node's ``name`` and ``logger``, ``is_active``,
    and ``changed()``: called after every call, to refresh and publish the memory's status."""

    def __init__(self, session, cameras: Cameras, snapshots: SnapshotKeeper, snapshot_dir: str, name: str, logger,
                 is_active: Callable[[], bool], changed: Callable[[], None]):
        self.session = session
        self.cameras = cameras
        self.snapshots = snapshots
        self.snapshot_dir = snapshot_dir
        self.name = name
        self.log = logger
        self.is_active = is_active
        self.changed = changed

    def _memory_call(self, response, action):
        if not self.is_active():
            response.success = False
            response.error_message = f"{self.name} is not active: configure and activate it first"
            return response
        try:
            action(response)
            response.success = True
        except StreamCacheError as err:
            response.success = False
            response.error_message = str(err)
        except Exception as err:  # noqa: BLE001
            self.log.error(f"memory service failed: {type(err).__name__}: {err}\n{traceback.format_exc()}")
            response.success = False
            response.error_message = f"internal error: {type(err).__name__}: {err}"
        self.changed()
        return response

    def on_reset(self, request, response):
        def reset(r):
            self.cameras.queues.clear()  # sampled before the reset: not wanted after it
            self.cameras.memory_replaced(restart_sampling=True)
            forgotten = self.session.reset()
            r.frames_cleared, r.archived_chunks_cleared = forgotten.frames, forgotten.archived_chunks
            self.log.info(f"memory reset: {r.frames_cleared} frames forgotten from the working memory, "
                          f"{r.archived_chunks_cleared} archived chunks deleted")
        return self._memory_call(response, reset)

    def on_save(self, request, response):
        def save(r):
            path = request.path.strip()
            if not path:  # the configured snapshot file
                if not self.snapshots.path:
                    raise _RequestError("path is empty (and memory_snapshot_path is not set)")
                if not self.snapshots.writable:
                    raise _RequestError(f"path is empty and memory_snapshot_path {self.snapshots.path} holds a "
                                        "snapshot refused at start: give a path")
                path = self.snapshots.path
            else:
                path = self._in_snapshot_dir(path)
                os.makedirs(self.snapshot_dir, mode=0o700, exist_ok=True)
            r.bytes_written = self.session.save(path)
            r.frames_in_memory = self.session.status().frames_in_memory
            self.log.info(f"memory saved to {path}: {r.bytes_written} bytes")
        return self._memory_call(response, save)

    def on_load(self, request, response):
        def load(r):
            if not request.path.strip():
                raise _RequestError("path is empty")
            path = self._in_snapshot_dir(request.path.strip())
            r.frames_in_memory = self.session.load(path)  # refused: the frames waiting stay
            self.cameras.queues.clear()  # sampled before the load: not wanted after it
            self.cameras.memory_replaced()
            self.log.info(f"memory loaded from {path}: {r.frames_in_memory} frames")
        return self._memory_call(response, load)

    def on_memory_timeline(self, request, response):
        def timeline(r):
            found = self.session.memory_timeline(self.cameras.key(request.camera))
            translate.fill_timeline(r, found, [f.pose for f in found.frames])
        return self._memory_call(response, timeline)

    def _in_snapshot_dir(self, name: str) -> str:
        try:
            return in_snapshot_dir(name, self.snapshot_dir)
        except ValueError as err:
            self.log.warning(f"memory service refused: {err}")
            raise _RequestError(str(err)) from None

    def write_snapshot(self, reason: str) -> None:
        try:
            line = self.snapshots.write(self.session, reason)
        except SnapshotError as err:
            self.log.error(f"memory snapshot not written: {err}")
            return
        if line:
            self.log.info(line)
