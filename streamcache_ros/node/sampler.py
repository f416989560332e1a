"""Stamp-based sampling, the sampled frames' queues and per-camera counters (no ROS here).

A camera publishes faster than the memory needs; frames are sampled at ``sample_fps`` by MESSAGE
stamp, not by arrival time, so a bag replayed at any rate gives the same frames as long as nothing
is dropped. A sampled frame waits in its camera's bounded queue for the ingest thread; only when the
queue is full (the encoder is slower than the sampling rate) is the oldest one dropped and counted.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field

import numpy as np

NS_PER_S = 1_000_000_000


class StampSampler:
    """Keeps the first frame of each 1/sample_fps slot of message time (slots counted from the first
    sampled stamp). A stamp more than one period BEFORE the last sampled one (a bag started again, a
    clock reset) restarts the slots there; a small step back (reordered messages) is not sampled.

    Two steps, so a frame that turns out unusable does not use up its slot: ``is_due(stamp)`` asks,
    ``commit(stamp)`` records the frame as sampled.
    """

    def __init__(self, sample_fps: float):
        if sample_fps <= 0:
            raise ValueError(f"sample_fps must be > 0, got {sample_fps}")
        self.sample_fps = float(sample_fps)
        self.period_ns = int(round(NS_PER_S / self.sample_fps))
        self.restarts = 0
        self._origin_ns: int | None = None
        self._last_slot = 0
        self._last_ns = 0

    def _restarts_at(self, stamp_ns: int) -> bool:
        return self._origin_ns is None or stamp_ns < self._last_ns - self.period_ns

    def _slot(self, stamp_ns: int) -> int:
        # integer nanoseconds: epoch stamps as float seconds lose the sub-microsecond digits
        return int((stamp_ns - self._origin_ns) * self.sample_fps // NS_PER_S)

    def is_due(self, stamp_ns: int) -> bool:
        return self._restarts_at(stamp_ns) or self._slot(stamp_ns) > self._last_slot

    def commit(self, stamp_ns: int) -> None:
        if self._restarts_at(stamp_ns):
            self.restarts += self._origin_ns is not None
            self._origin_ns, self._last_slot = stamp_ns, 0
        else:
            self._last_slot = self._slot(stamp_ns)
        self._last_ns = stamp_ns

    def offer(self, stamp_ns: int) -> bool:
        """``is_due`` and, when due, ``commit``."""
        due = self.is_due(stamp_ns)
        if due:
            self.commit(stamp_ns)
        return due


@dataclass
class SampledFrame:
    camera: str
    stamp_ns: int
    rgb: np.ndarray
    arrived: float = field(default_factory=time.monotonic)


class FrameQueues:
    """Per camera, a bounded first-in first-out queue of sampled frames waiting for the ingest thread
    (``capacity`` frames each); ``take`` gives the waiting frame that arrived first, of any camera.

    A frame sampled while the ingest thread waits (a chunk being encoded, a question being answered)
    is kept and encoded after it; only when a camera's queue is full, because the encoder is slower
    than the sampling rate, is its oldest frame dropped (docs/reliability.md, "Threads and executor").
    """

    def __init__(self, capacity: int = 1):
        if capacity < 1:
            raise ValueError(f"a frame queue holds at least one frame, got {capacity}")
        self.capacity = int(capacity)
        self._cond = threading.Condition()
        self._queues: dict[str, collections.deque[SampledFrame]] = {}
        self._closed = False
        self.most_waiting = 0  # the most frames one camera's queue has held

    def put(self, frame: SampledFrame) -> tuple[SampledFrame | None, int]:
        """Queue ``frame``; returns (the frame dropped to make room or None, frames that were
        already waiting for this camera)."""
        with self._cond:
            queue = self._queues.setdefault(frame.camera, collections.deque())
            waiting = len(queue)
            dropped = queue.popleft() if waiting >= self.capacity else None
            queue.append(frame)
            self.most_waiting = max(self.most_waiting, len(queue))
            self._cond.notify()
            return dropped, waiting

    def take(self, timeout: float | None = None) -> SampledFrame | None:
        """The waiting frame that arrived first; None after ``timeout`` or when closed."""
        with self._cond:
            if not self._cond.wait_for(lambda: any(self._queues.values()) or self._closed, timeout):
                return None
            waiting = [q for q in self._queues.values() if q]
            if not waiting:
                return None
            return min(waiting, key=lambda q: q[0].arrived).popleft()

    def clear(self) -> int:
        with self._cond:
            count = sum(len(q) for q in self._queues.values())
            self._queues.clear()
            return count

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values())


class RateMeter:
    """Events per second over the last ``window_s`` seconds (monotonic clock)."""

    def __init__(self, window_s: float = 10.0):
        self.window_s = window_s
        self._times: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()

    def tick(self, now: float | None = None) -> None:
        with self._lock:
            self._times.append(time.monotonic() if now is None else now)

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._times and self._times[0] < now - self.window_s:
                self._times.popleft()
            if len(self._times) < 2:
                return 0.0
            span = max(now - self._times[0], 1e-9)
            return len(self._times) / span


@dataclass
class CameraSnapshot:
    received: int
    sampled: int
    ingested: int
    dropped: int
    rejected: int
    rejected_by_reason: dict[str, int]
    last_reject: str
    last_stamp_ns: int
    last_arrival: float  # time.monotonic(); 0.0 before the first frame
    receive_rate: float
    ingest_rate: float
    time_jumps: int = 0  # stamps that went back by more than a sampling period (sampling restarted)
    waited: int = 0  # sampled frames queued behind another one (kept for later, not dropped)


class CameraCounters:
    """What one camera input has done; thread-safe (image callbacks and the ingest thread write)."""

    def __init__(self, topic: str, sample_fps: float):
        self.topic = topic
        self.sampler = StampSampler(sample_fps)
        self._lock = threading.Lock()
        self._received = self._sampled = self._ingested = self._dropped = self._waited = 0
        self._rejected: collections.Counter[str] = collections.Counter()
        self._earlier_restarts = 0  # time jumps seen by samplers replaced at a memory reset
        self._last_reject = ""
        self._last_stamp_ns = 0
        self._last_arrival = 0.0
        self._receive_rate = RateMeter()
        self._ingest_rate = RateMeter()

    def arrived(self, stamp_ns: int) -> None:
        """Count an arriving message (valid or not)."""
        now = time.monotonic()
        self._receive_rate.tick(now)
        with self._lock:
            self._received += 1
            self._last_stamp_ns, self._last_arrival = stamp_ns, now

    def is_due(self, stamp_ns: int) -> bool:
        with self._lock:
            return self.sampler.is_due(stamp_ns)

    def sampled(self, stamp_ns: int) -> None:
        with self._lock:
            self.sampler.commit(stamp_ns)
            self._sampled += 1

    def restart_sampling(self, sample_fps: float | None = None) -> None:
        """Slots counted afresh from the next frame (after the memory was reset, or at a new
        ``sample_fps``)."""
        with self._lock:
            self._earlier_restarts += self.sampler.restarts
            self.sampler = StampSampler(sample_fps or self.sampler.sample_fps)

    def rejected(self, reason: str, message: str) -> None:
        with self._lock:
            self._rejected[reason] += 1
            self._last_reject = message

    def dropped(self) -> None:
        with self._lock:
            self._dropped += 1

    def queued(self, waiting: int) -> None:
        """A sampled frame was queued with ``waiting`` frames of this camera ahead of it."""
        if waiting:
            with self._lock:
                self._waited += 1

    def ingested(self) -> None:
        self._ingest_rate.tick()
        with self._lock:
            self._ingested += 1

    def snapshot(self) -> CameraSnapshot:
        with self._lock:
            return CameraSnapshot(self._received, self._sampled, self._ingested, self._dropped,
                                  sum(self._rejected.values()), dict(self._rejected), self._last_reject,
                                  self._last_stamp_ns, self._last_arrival, self._receive_rate.rate(),
                                  self._ingest_rate.rate(), self.sampler.restarts + self._earlier_restarts,
                                  self._waited)
