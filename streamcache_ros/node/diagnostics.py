"""/diagnostics for the node through diagnostic_updater: one task per concern (each camera, the
memory, latency, the archive's index).

- "camera <topic>" (one per camera): a CompositeDiagnosticTask of a FrequencyStatus (arrival rate;
  ERROR when the camera is silent for the window, WARN below ``camera_min_rate``), a TimeStampStatus
  (how old the stamps are by the node's clock, or by the stream's own for a replay faster than real
  time, stream_clock.py; ERROR past ``max_frame_delay``) and the frame counters
  (WARN when the camera has been silent for two periods of its minimum rate, so a camera going
  silent shows WARN before the rate's ERROR; WARN when its stamps jumped back, when sampled frames
  were dropped because the encoder was busy, or frames were rejected, since the last update; ERROR
  when every frame since the last update was rejected).
- "memory": KV tokens and bytes held vs the budget, per-layer (and per-bank) summary, CUDA memory.
  ERROR when chunks fail again and again (the memory is not updating: answers come from stale
  frames) or the memory reached the model's position range (the full cache takes no more frames); WARN when
  a layer holds more video tokens than the budget (a budget lowered at runtime is OK, said to be
  pending, until the next chunk's compression), or CUDA memory is nearly full.
- "latency": encode / prefill / compress ms of the last chunk, the standing questions' time on it,
  and the last TTFT. WARN when a chunk (its standing questions included) takes longer than the
  encoder's time for it: the stream time one chunk covers (chunk_frames /
  sample_fps) shared by every camera, since each camera fills its own chunks in that time (the
  encoder falls behind); ERROR when a chunk failed since the last update.

Both read the engine's typed status (``EngineView``), never a ROS message or a dict.
Where ``diagnostic_updater`` is not importable, diagnostics_fallback provides the same classes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.clock import Clock, ClockType

try:
    import diagnostic_updater as updater_lib
    BACKEND = "diagnostic_updater"
except ImportError:  # no wheelhouse and no system ROS 2: same statuses from the built-in stand-in
    from . import diagnostics_fallback as updater_lib
    BACKEND = "built-in fallback"

from ..engine.status import SessionStatus
from .stream_clock import StreamClock

OK, WARN, ERROR = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR
GPU_NEARLY_FULL = 0.9
MIB = 1024 * 1024
ARCHIVE_NEARLY_FULL = 0.95  # of archive_max_bytes: past it the oldest chunks go
ARCHIVE_DISK_RESERVE = 256 * MIB  # of the archive's disk, for the rest of the robot
# this many chunks failed in a row: the memory is not updating (ERROR), not a passing fault
FAILING_CHUNKS = 3


@dataclass
class EngineView:
    """What the "memory" and "latency" statuses read: the engine's status and the node's own facts."""

    status: SessionStatus = field(default_factory=SessionStatus)
    active: bool = True
    chunk_span_s: float = 0.0  # stream time one chunk covers: chunk_frames / sample_fps
    cameras: int = 1  # each fills a chunk in chunk_span_s: the encoder has chunk_span_s / cameras per chunk
    ingest_fps: float = 0.0  # frames taken into memory per second, all cameras
    chunk_error: str = ""  # the last chunk failure
    snapshot: str = ""  # the memory snapshot's state ("" = not shown)
    snapshot_error: str = ""  # a snapshot refused at start
    budget_pending: bool = False  # a budget set at runtime that the next chunk's compression brings the memory to
    watch_ms: float = 0.0  # the standing questions' time on the last chunk
    watch_questions: int = 0  # standing questions asked per chunk


def _fmt_ms(value: float) -> str:
    return f"{value:.1f}"


class CameraTask:
    """The counters part of a camera's status (rate and stamps are upstream's own tasks)."""

    def __init__(self, counters, is_active: Callable[[], bool], silent_after_s: Callable[[], float] = lambda: 2.0,
                 qos: Callable[[], tuple[str, int]] = lambda: ("", 0), judged_by: Callable[[], str] = lambda: ""):
        self.counters = counters
        self.judged_by = judged_by  # the clock the frames' age is judged by (stream_clock.py)
        self.is_active = is_active
        self.silent_after_s = silent_after_s
        self.qos = qos  # (what the subscription's QoS is and why, resubscriptions so far)
        self._previous = counters.snapshot()

    def run(self, stat):
        now = self.counters.snapshot()
        before, self._previous = self._previous, now
        received = now.received - before.received
        rejected = now.rejected - before.rejected
        dropped = now.dropped - before.dropped
        age = time.monotonic() - now.last_arrival if now.last_arrival else float("nan")
        if not self.is_active():
            stat.summary(WARN, "node inactive: not subscribed")
        elif received > 0 and rejected == received:
            stat.summary(ERROR, f"every frame rejected: {now.last_reject}")
        elif age > self.silent_after_s():
            stat.summary(WARN, f"silent: no frame for {age:.1f} s")
        elif now.time_jumps > before.time_jumps:
            stat.summary(WARN, "stamps jumped back (a bag loop, a clock reset): sampling restarted")
        elif dropped > 0:
            stat.summary(WARN, f"{dropped} sampled frame(s) dropped: the encoder is slower than the camera")
        elif rejected > 0:
            stat.summary(WARN, f"{rejected} frame(s) rejected: {now.last_reject}")
        else:
            stat.summary(OK, f"{now.ingested} frames taken into memory")
        stat.add("Frames received", str(now.received))
        stat.add("Frames sampled", str(now.sampled))
        stat.add("Frames taken into memory", str(now.ingested))
        stat.add("Frames dropped (encoder busy)", str(now.dropped))
        stat.add("Frames that waited in the queue", str(now.waited))
        stat.add("Frames rejected", str(now.rejected))
        for reason, count in sorted(now.rejected_by_reason.items()):
            stat.add(f"Rejected: {reason}", str(count))
        if now.last_reject:
            stat.add("Last rejection", now.last_reject)
        stat.add("Last frame age (s)", f"{age:.2f}")
        stat.add("Time jumps back", str(now.time_jumps))
        stat.add("Last stamp (s)", f"{now.last_stamp_ns / 1e9:.3f}")
        if self.judged_by():
            stat.add("Frame age judged by", self.judged_by())
        stat.add("Receive rate (Hz)", f"{now.receive_rate:.2f}")
        stat.add("Ingest rate (Hz)", f"{now.ingest_rate:.2f}")
        qos, changes = self.qos()
        stat.add("QoS reliability", qos)
        stat.add("QoS changes (publishers came or went)", str(changes))
        return stat


class NodeDiagnostics:
    """Owns the Updater and its tasks for one node; ``view`` gives the engine's view when asked."""

    def __init__(self, node, view: Callable[[], EngineView]):
        self.node = node
        self.view = view
        self.engine = EngineTasks(view)
        self.updater = updater_lib.Updater(node)
        # robots on one domain: statuses named "<fully qualified node name>: <task>" and the hardware
        # id that name, so rqt_robot_monitor tells /robot1/streamcache_node from /robot2/...
        self.updater.node_name = node.get_fully_qualified_name()
        self.updater.setHardwareID(node.get_fully_qualified_name())
        # The Updater times itself by the node's clock; with use_sim_time that clock stops when a
        # replay's /clock does, and so would /diagnostics. A steady timer keeps them at 1 Hz.
        node.destroy_timer(self.updater.timer)
        self.updater.timer = node.create_timer(self.updater.period, self.updater.update,
                                               clock=Clock(clock_type=ClockType.STEADY_TIME))
        self._task_names: list[str] = []
        self._stamp_tasks = {}
        self._rate_tasks = {}
        self._min_rates: dict[str, float] = {}
        self._clocks: dict[str, StreamClock] = {}

    @property
    def backend(self) -> str:
        return BACKEND

    def add_camera(self, topic: str, counters, min_rate: float, max_delay: float,
                   qos: Callable[[], tuple[str, int]] = lambda: ("", 0)) -> None:
        rate = updater_lib.FrequencyStatus(updater_lib.FrequencyStatusParam({"min": min_rate}, 0.1, 5), "rate")
        stamps = updater_lib.TimeStampStatus(updater_lib.TimeStampStatusParam(-1.0, max_delay), "stamps")
        task = updater_lib.CompositeDiagnosticTask(f"camera {topic}")
        task.addTask(rate)
        task.addTask(stamps)
        self._min_rates[topic] = min_rate
        # silent: two periods of the minimum rate without a frame
        self._clocks[topic] = StreamClock()
        frames = CameraTask(counters, lambda: self.view().active, lambda: 2.0 / self._min_rates[topic], qos,
                            judged_by=lambda: self._clocks[topic].judged_by)
        task.addTask(updater_lib.FunctionDiagnosticTask("frames", frames.run))
        self._rate_tasks[topic], self._stamp_tasks[topic] = rate, stamps
        self._add(task)

    def set_limits(self, min_rate: float, max_delay: float) -> None:
        for topic in self._min_rates:
            self._min_rates[topic] = min_rate
        for rate in self._rate_tasks.values():
            rate.params.freq_bound["min"] = min_rate
        for stamps in self._stamp_tasks.values():
            stamps.params.max_acceptable = max_delay

    def add_engine(self) -> None:
        self._add(updater_lib.FunctionDiagnosticTask("memory", self.engine.memory))
        self._add(updater_lib.FunctionDiagnosticTask("latency", self.engine.latency))
        self._add(updater_lib.FunctionDiagnosticTask("index", self.engine.index))

    def add_poses(self, poses) -> None:
        """"poses": where the frames' poses come from, and how many frames got none (docs/places.md)."""
        def run(stat):
            track = poses.track
            newest = track.newest_stamp
            level = OK
            message = f"poses from {poses.describe()}"
            if poses.source == "topic" and poses.subscription is None or newest is None:
                level, message = WARN, f"no pose yet from {poses.describe()}: frames are kept without one"
            elif track.frames_without:
                level = WARN
                message += f"; {track.frames_without} frame(s) had no pose within {track.tolerance:g} s"
            stat.summary(level, message)
            stat.add("Source", poses.describe())
            stat.add("Poses received", str(track.received))
            stat.add("Newest pose stamp (s)", "none" if newest is None else f"{newest:.3f}")
            stat.add("Frames with a pose", str(track.frames_posed))
            stat.add("Frames without a pose", str(track.frames_without))
            stat.add("Poses out of order", str(track.out_of_order))
            if poses.source == "tf":
                stat.add("TF lookups failed", str(poses.tf_failures))
            return stat
        self._add(updater_lib.FunctionDiagnosticTask("poses", run))

    def _add(self, task) -> None:
        self.updater.add(task)
        self._task_names.append(task.getName())

    def clear(self) -> None:
        for name in self._task_names:
            self.updater.removeByName(name)
        self._task_names.clear()
        self._rate_tasks.clear()
        self._min_rates.clear()
        self._stamp_tasks.clear()
        self._clocks.clear()

    def frame_arrived(self, topic: str, stamp_ns: int, now_ns: int) -> None:
        """Tick the camera's rate and stamp tasks. TimeStampStatus measures delay against the system
        clock; the frame's age is taken by the NODE's clock instead (sim time during a bag replay),
        or by the stream's own when frames arrive faster than their stamps (StreamClock), and handed
        over as the system-clock instant with that age."""
        self._rate_tasks[topic].tick()
        if stamp_ns == 0:
            self._stamp_tasks[topic].tick(0.0)  # upstream reports a zero stamp as ERROR
        else:  # a replay faster than real time by its own clock (stream_clock.py)
            age = self._clocks[topic].age_s(stamp_ns, now_ns, time.monotonic_ns())
            self._stamp_tasks[topic].tick(time.time() - age)


def archive_full(archive) -> str:
    """Why the archive's diagnostic is WARN: its bound nearly reached (the oldest chunks now go) or
    its disk nearly full; "" when neither (docs/archive.md)."""
    if archive is None:
        return ""
    if archive.bytes > ARCHIVE_NEARLY_FULL * archive.max_bytes:
        return (f"archive at {archive.bytes / MIB:.0f} of {archive.max_bytes / MIB:.0f} MiB (archive_max_bytes): the "
                "oldest chunks are being dropped")
    if archive.disk_free_bytes < max(archive.max_bytes - archive.bytes, 0) + ARCHIVE_DISK_RESERVE:
        return (f"archive disk nearly full: {archive.disk_free_bytes / MIB:.0f} MiB free, the archive may still grow "
                f"by {(archive.max_bytes - archive.bytes) / MIB:.0f} MiB: lower archive_max_bytes or free the disk")
    return ""


def archive_not_writing(archive, not_archived_before: int) -> str:
    """Why the memory diagnostic is ERROR for the archive: chunks are not being written (a full
    disk, a write error) now or since the last status; "" otherwise (docs/reliability.md)."""
    if archive is None or not (archive.failing or archive.not_archived > not_archived_before):
        return ""
    return (f"archive not writing: {archive.not_archived} chunk(s) not archived so far ({archive.disk_free_bytes / MIB:.0f} "
            f"MiB free on its disk); they are named as a hole in answers")


class EngineTasks:
    """The "memory" and "latency" statuses, from an EngineView."""

    def __init__(self, view: Callable[[], EngineView]):
        self.view = view
        self._chunks_failed = 0
        self._not_archived = 0  # at the last memory status: ERROR while the count grows

    def memory(self, stat):
        v = self.view()
        m, cache, device = v.status, v.status.cache, v.status.device_memory
        layers = list(cache.layer_tokens)
        # the instant window's tokens are held beside the budget (docs/architecture.md "The instant window")
        video_max = max(layers) - m.prefix_tokens - cache.instant_tokens if layers else 0
        if m.ingest_stopped:  # the memory reached the model's position range: no frame is taken in
            stat.summary(ERROR, m.ingest_stopped)
        elif m.chunks_failed_in_a_row >= FAILING_CHUNKS:
            stat.summary(ERROR, f"the memory is not updating: the last {m.chunks_failed_in_a_row} chunks failed "
                                f"({v.chunk_error or m.last_chunk_error}); answers come from frames up to stamp "
                                f"{m.newest_stamp:.3f}")
        elif archive_not_writing(m.archive, self._not_archived):
            stat.summary(ERROR, archive_not_writing(m.archive, self._not_archived))
        elif v.snapshot_error:
            stat.summary(WARN, v.snapshot_error)
        elif m.archive is not None and m.archive.damaged_copies:
            stat.summary(WARN, f"the archive was damaged and salvaged at open; the damaged file is at "
                               f"'{m.archive.damaged_copies[-1]}' (remove it once looked at to clear this)")
        elif cache.budget_tokens and video_max > cache.budget_tokens and v.budget_pending:
            stat.summary(OK, f"budget changed to {cache.budget_tokens} video tokens per layer: pending, the next "
                             f"chunk brings the memory to it (a layer holds {video_max} now)")
        elif cache.budget_tokens and video_max > cache.budget_tokens:
            stat.summary(WARN, f"over budget: a layer holds {video_max} video tokens, budget {cache.budget_tokens}")
        elif archive_full(m.archive):
            stat.summary(WARN, archive_full(m.archive))
        elif device.total_bytes and device.reserved_bytes > GPU_NEARLY_FULL * device.total_bytes:
            stat.summary(WARN, f"CUDA memory nearly full: {device.reserved_bytes / MIB:.0f} of "
                               f"{device.total_bytes / MIB:.0f} MiB reserved")
        else:
            bound = (f"budget {cache.budget_tokens} video tokens per layer" if cache.budget_tokens
                     else "bounded by its banks" if cache.bank_tokens else "unbounded")
            stat.summary(OK, f"{m.frames_in_memory} frames, {cache.kv_bytes / MIB:.1f} MiB KV ({bound})")
        stat.add("Policy", m.policy)
        stat.add("Model", m.model_id)
        stat.add("Frames in memory", str(m.frames_in_memory))
        stat.add("Oldest stamp (s)", f"{m.oldest_stamp:.3f}")
        stat.add("Newest stamp (s)", f"{m.newest_stamp:.3f}")
        stat.add("KV tokens (all layers)", str(cache.kv_tokens))
        stat.add("KV bytes", str(cache.kv_bytes))
        stat.add("Budget (video tokens per layer)", str(cache.budget_tokens) if cache.budget_tokens else "none")
        stat.add("System prompt tokens per layer", str(m.prefix_tokens))
        stat.add("Chunks failed in a row", str(m.chunks_failed_in_a_row))
        stat.add("Process RSS (MiB)", f"{m.process_rss_bytes / MIB:.1f}")
        if v.snapshot:
            stat.add("Memory snapshot", v.snapshot)
        if m.archive is not None:
            a = m.archive
            stat.add("Archive", a.path)
            stat.add("Archive chunks", str(a.chunks))
            stat.add("Archive bytes (MiB)", f"{a.bytes / MIB:.1f} of {a.max_bytes / MIB:.0f}")
            stat.add("Archive span (s)", f"{a.oldest_stamp:.3f} .. {a.newest_stamp:.3f}" if a.chunks else "empty")
            stat.add("Archive disk free (MiB)", f"{a.disk_free_bytes / MIB:.0f}")
            stat.add("Archive chunks not archived", str(a.not_archived))
            stat.add("Archive holes", str(a.holes))
            if a.damaged_copies:
                stat.add("Archive damaged copies (MiB)", f"{len(a.damaged_copies)}, {a.damaged_bytes / MIB:.1f}")
        if m.archive is not None:
            self._not_archived = m.archive.not_archived
        if layers:
            stat.add("Layer tokens min/mean/max", f"{min(layers)}/{sum(layers) / len(layers):.1f}/{max(layers)}")
            stat.add("Layer tokens", " ".join(str(n) for n in layers))
        if cache.bank_tokens:
            banks = "/".join(name.replace("_", "-") for name in cache.bank_names)
            stat.add(f"Bank tokens ({banks})", " ".join(str(n) for n in cache.bank_tokens))
        if device.total_bytes:
            stat.add("GPU allocated (MiB)", f"{device.allocated_bytes / MIB:.1f}")
            stat.add("GPU reserved (MiB)", f"{device.reserved_bytes / MIB:.1f}")
            stat.add("GPU peak (MiB)", f"{device.peak_bytes / MIB:.1f}")
            stat.add("GPU total (MiB)", f"{device.total_bytes / MIB:.1f}")
        return stat

    def index(self, stat):
        """The archive's index: which one, and whether a window it finds nothing in is an answer
        (docs/archive.md "Calibrating the index"). WARN while it is not trusted: "not found" then
        comes from a bounded walk, and says when it could not read the whole window."""
        m = self.view().status
        index = m.index
        if m.archive is None:
            stat.summary(OK, "no archive: questions read the working memory")
        elif index is None:
            stat.summary(OK, "no index (retrieval_model_path off): `when` and \"did you see\" walk the archive")
        elif not index.trusted:
            stat.summary(WARN, f"index {index.identity} not trusted: a window it finds nothing in is searched further "
                               f"({index.incomplete_answers} answer(s) so far could not read all of their window)")
        else:
            stat.summary(OK, f"index {index.identity}: trusted (recall {index.recall:.2f}, false yes "
                             f"{index.false_yes:.3f} on the calibration set)")
        if index is not None:
            stat.add("Index", index.identity)
            stat.add("Trusted", "yes" if index.trusted else "no")
            stat.add("Calibration", index.description)
            stat.add("Answers that could not read all of their window", str(index.incomplete_answers))
        return stat

    def latency(self, stat):
        v = self.view()
        m, chunk = v.status, v.status.last_chunk
        failed = m.chunks_failed - self._chunks_failed
        self._chunks_failed = m.chunks_failed
        encode, prefill, compress = (chunk.encode_ms, chunk.prefill_ms, chunk.compress_ms) if chunk else (0.0,) * 3
        chunk_ms = encode + prefill + compress + (v.watch_ms if chunk else 0.0)
        span_ms = v.chunk_span_s * 1e3
        budget_ms = span_ms / v.cameras  # every camera fills a chunk in span_ms
        per = f" of stream ({v.cameras} cameras: {budget_ms:.0f} ms each)" if v.cameras > 1 else " of stream"
        if failed > 0:
            stat.summary(ERROR, f"{failed} chunk(s) failed: {v.chunk_error}")
        elif m.chunks_encoded and chunk_ms > budget_ms:
            stat.summary(WARN, f"a chunk takes {chunk_ms:.0f} ms for {span_ms:.0f} ms{per}: "
                               "the encoder falls behind (lower sample_fps or use a GPU)")
        elif not m.chunks_encoded:
            stat.summary(OK, "no chunk encoded yet")
        else:
            stat.summary(OK, f"chunk {chunk_ms:.0f} ms for {span_ms:.0f} ms{per}")
        stat.add("Encode (ms, last chunk)", _fmt_ms(encode))
        stat.add("Prefill (ms, last chunk)", _fmt_ms(prefill))
        stat.add("Compress (ms, last chunk)", _fmt_ms(compress))
        stat.add("Standing questions (ms, last chunk)", _fmt_ms(v.watch_ms))
        stat.add("Standing questions", str(v.watch_questions))
        stat.add("Stream time per chunk (ms)", _fmt_ms(span_ms))
        stat.add("Cameras", str(v.cameras))
        stat.add("Encoder time per chunk, all cameras (ms)", _fmt_ms(budget_ms))
        stat.add("Last TTFT (ms)", _fmt_ms(m.last_ttft_ms))
        stat.add("Ingest rate (frames/s)", f"{v.ingest_fps:.2f}")
        stat.add("Chunks encoded", str(m.chunks_encoded))
        stat.add("Chunks failed", str(m.chunks_failed))
        stat.add("Questions answered", str(m.questions_answered))
        # 1: a chunk waits for the question in progress, never more
        stat.add("Most questions a chunk waited for", str(m.most_questions_a_chunk_waited_for))
        if v.chunk_error:
            stat.add("Last chunk error", v.chunk_error)
        return stat
