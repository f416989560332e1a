"""The node's memory services, reset_memory, save_memory, load_memory and memory_timeline
(docs/interfaces.md), and the memory snapshot it keeps at memory_snapshot_path (snapshots.py).

A refusal answers with the engine's own reason (a snapshot of another model or policy, a missing
file); the memory is then unchanged.
"""
from __future__ import annotations

import traceback

from ..engine.errors import SnapshotError, StreamCacheError
from . import translate


class _RequestError(StreamCacheError):
    """A service request that cannot be served as asked (the message says why)."""


class MemoryServices:
    """Mixed into the node (node.py), which owns ``session``, ``slots``, ``cameras``, ``snapshots``."""

    def _memory_call(self, response, action):
        if not self._active or self.session is None:
            response.success = False
            response.error_message = f"{self.get_name()} is not active: configure and activate it first"
            return response
        try:
            action(response)
            response.success = True
        except StreamCacheError as err:
            response.success = False
            response.error_message = str(err)
        except Exception as err:  # noqa: BLE001
            self.get_logger().error(f"memory service failed: {type(err).__name__}: {err}\n{traceback.format_exc()}")
            response.success = False
            response.error_message = f"internal error: {type(err).__name__}: {err}"
        self._refresh_status()
        self.publish_memory_status()
        return response

    def _on_reset(self, request, response):
        def reset(r):
            self.slots.clear()  # sampled before the reset: not wanted after it
            for camera in self.cameras.values():
                camera.counters.restart_sampling()
                camera.last_ingested_ns = None
            r.frames_cleared = self.session.reset()
            self.get_logger().info(f"memory reset: {r.frames_cleared} frames forgotten")
        return self._memory_call(response, reset)

    def _on_save(self, request, response):
        def save(r):
            path = request.path.strip()
            if not path:  # the configured snapshot file
                if not self.snapshots.path:
                    raise _RequestError("path is empty (and memory_snapshot_path is not set)")
                if not self.snapshots.writable:
                    raise _RequestError(f"path is empty and memory_snapshot_path {self.snapshots.path} holds a "
                                        "snapshot refused at start: give a path")
                path = self.snapshots.path
            r.bytes_written = self.session.save(path)
            r.frames_in_memory = self.session.status().frames_in_memory
            self.get_logger().info(f"memory saved to {path}: {r.bytes_written} bytes")
        return self._memory_call(response, save)

    def _on_load(self, request, response):
        def load(r):
            if not request.path.strip():
                raise _RequestError("path is empty")
            self.slots.clear()
            r.frames_in_memory = self.session.load(request.path)
            for camera in self.cameras.values():
                camera.last_ingested_ns = None
            self.get_logger().info(f"memory loaded from {request.path}: {r.frames_in_memory} frames")
        return self._memory_call(response, load)

    def _on_memory_timeline(self, request, response):
        def timeline(r):
            translate.fill_timeline(r, self.session.memory_timeline(self._camera_key(request.camera)))
        return self._memory_call(response, timeline)

    def _write_snapshot(self, reason: str) -> None:
        session = self.session
        if session is None:
            return
        try:
            line = self.snapshots.write(session, reason)
        except SnapshotError as err:
            self.get_logger().error(f"memory snapshot not written: {err}")
            return
        if line:
            self.get_logger().info(line)
