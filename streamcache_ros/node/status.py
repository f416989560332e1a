"""What the node tells about the memory: the MemoryStatus message (memory_status, 1 Hz and after each
chunk) and the engine's view the "memory" and "latency" diagnostics read (diagnostics.py).

Both come from the session's status taken after the last chunk / question / reset / load, so the
timers that publish them never wait for the session's lock.
"""
from __future__ import annotations

import threading
from typing import Callable

from streamcache_ros_interfaces.msg import MemoryStatus

from ..engine.status import EngineInfo, SessionStatus
from . import translate
from .cameras import Cameras
from .diagnostics import EngineView
from .publishing import publish_quietly
from .snapshots import SnapshotKeeper
from .time_questions import TimeQuestions


class StatusReports:
    """The session's last status, and what is made of it. Given the ``session`` and its ``info``,
    ``status_pub`` (memory_status), the node's ``clock``, ``is_active``, and the parts whose facts
    the reports show beside the engine's: ``cameras`` (frame counters, queues, ingest failures),
    ``snapshots`` and ``questions`` (the standing questions' cost)."""

    def __init__(self, session, info: EngineInfo, status_pub, clock, is_active: Callable[[], bool], cameras: Cameras,
                 snapshots: SnapshotKeeper, questions: TimeQuestions):
        self.session = session
        self.info = info
        self.status_pub = status_pub
        self.clock = clock
        self.is_active = is_active
        self.cameras = cameras
        self.snapshots = snapshots
        self.questions = questions
        self._lock = threading.Lock()
        self._status: SessionStatus = session.status()  # after the last chunk / question / reset / load
        self._budget_changed = False  # budget_tokens was set at runtime ...
        self._chunk_before_budget = None  # ... after this chunk: the memory comes to it at the next one

    def refresh(self, budget_changed: bool = False) -> None:
        """Take the session's status; ``budget_changed``: a budget was just set at runtime, pending
        from this status's last chunk on (set with the status, so no diagnostic sees one without the other)."""
        status = self.session.status()
        with self._lock:
            self._status = status
            if budget_changed:
                self._budget_changed, self._chunk_before_budget = True, status.last_chunk

    def latest(self) -> SessionStatus:
        with self._lock:
            return self._status

    def budget_pending(self, status: SessionStatus) -> bool:
        """A budget set at runtime and no chunk compressed since (``status``: the session's)."""
        return self._budget_changed and status.last_chunk is self._chunk_before_budget

    def memory_status(self) -> MemoryStatus:
        """The MemoryStatus message: the engine's status plus the live frame counters."""
        return translate.memory_status(self.latest(), self.cameras.counters(), self.clock.now().to_msg(),
                                       self.cameras.queues.most_waiting)

    def engine_view(self) -> EngineView:
        """What the memory and latency diagnostics read."""
        with self._lock:
            status = self._status
            budget_pending = self.budget_pending(status)
        cameras, snapshots = self.cameras, self.snapshots
        return EngineView(status=status, active=self.is_active(),
                          chunk_span_s=self.info.chunk_frames / cameras.sample_fps,
                          cameras=max(1, len(cameras.inputs)), ingest_fps=cameras.ingest_fps,
                          chunk_error=cameras.ingest_error or status.last_chunk_error,
                          snapshot=snapshots.summary(),
                          snapshot_error=snapshots.detail if snapshots.state == "refused" else "",
                          budget_pending=budget_pending, watch_ms=self.questions.last_watch_ms,
                          watch_questions=self.questions.watch_count)

    def publish(self) -> None:
        if self.is_active():
            publish_quietly(self.status_pub, self.memory_status())
