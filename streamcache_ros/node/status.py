"""What the node tells about the memory: the MemoryStatus message (memory_status, 1 Hz and after each
chunk) and the engine's view the "memory" and "latency" diagnostics read (diagnostics.py).

Both come from the session's status taken after the last chunk / question / reset / load, so the
timers that publish them never wait for the session's lock.
"""
from __future__ import annotations

from streamcache_ros_interfaces.msg import MemoryStatus

from ..engine.status import SessionStatus
from . import translate
from .diagnostics import EngineView


class StatusReports:
    """Mixed into the node (node.py), which owns ``session``, ``_status`` (and its lock), ``cameras``,
    ``slots``, ``snapshots``; the budget's pending state is tuning.py's."""

    def _refresh_status(self, budget_changed: bool = False) -> None:
        """Take the session's status; ``budget_changed``: a budget was just set at runtime, pending
        from this status's last chunk on (set with the status, so no diagnostic sees one without the other)."""
        session = self.session
        if session is not None:
            status = session.status()
            with self._status_lock:
                self._status = status
                if budget_changed:
                    self._budget_changed, self._chunk_before_budget = True, status.last_chunk

    def memory_status(self) -> MemoryStatus:
        """The MemoryStatus message: the engine's status plus the live frame counters."""
        with self._status_lock:
            status = self._status
        stamp = self.get_clock().now().to_msg()
        if status is None:
            msg = MemoryStatus()
            msg.header.stamp = stamp
            return msg
        return translate.memory_status(status, {c.topic: c.counters.snapshot() for c in list(self.cameras.values())},
                                       stamp, self.slots.most_waiting)

    def engine_view(self) -> EngineView:
        """What the memory and latency diagnostics read."""
        with self._status_lock:
            status = self._status or SessionStatus()
            budget_pending = self.budget_pending(status)
        span = self.info.chunk_frames / self.sample_fps if self.info is not None else 0.0
        return EngineView(status=status, active=self._active, chunk_span_s=span, cameras=max(1, len(self.cameras)),
                          ingest_fps=sum(c.counters.snapshot().ingest_rate for c in list(self.cameras.values())),
                          chunk_error=self._ingest_error or status.last_chunk_error,
                          snapshot=self.snapshots.summary(),
                          snapshot_error=self.snapshots.detail if self.snapshots.state == "refused" else "",
                          budget_pending=budget_pending, watch_ms=self.last_watch_ms,
                          watch_questions=len(self._watch_questions))

    def publish_memory_status(self) -> None:
        if self._active:
            self._publish(self.status_pub, self.memory_status())

    def _publish(self, publisher, msg) -> None:
        if publisher is None:
            return
        try:
            publisher.publish(msg)
        except Exception:  # noqa: BLE001 - the context is shutting down (SIGINT): nothing to tell
            pass
