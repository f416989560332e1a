"""What the engine reports, as dataclasses: a chunk's report, an answer, the session's status.

The node turns these into ROS messages and diagnostics; it reads nothing else of the engine. Every
type here is the engine's own: what the cache reports is copied into them where the session reads
it, so no cache type reaches a front end.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from .places import Pose


def _copied(cls, source, **overrides):
    """A ``cls`` with every field ``source`` has of the same name (lists and dicts copied), then ``overrides``."""
    values = {f.name: getattr(source, f.name) for f in fields(cls) if hasattr(source, f.name)}
    values = {k: type(v)(v) if isinstance(v, (list, dict)) else v for k, v in values.items()}
    return cls(**{**values, **overrides})


@dataclass
class CompressionOutcome:
    """What compressing after a chunk did. ``evicted_units``: the units no longer held anywhere;
    ``details``: the policy's own figures (summary tokens, guidance passes, STCE evictions ...)."""

    evicted_units: list[int] = field(default_factory=list)
    evicted_tokens: int = 0
    reindexed: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, outcome) -> "CompressionOutcome":
        """From the policy's own outcome of ``after_chunk``."""
        return _copied(cls, outcome)

    def as_dict(self) -> dict[str, Any]:
        return {"evicted_units": list(self.evicted_units), "evicted_tokens": self.evicted_tokens,
                "reindexed": self.reindexed, **self.details}


@dataclass
class CacheSummary:
    """What the cache holds (docs/interfaces.md, "What the numbers mean"): tokens per layer and per
    bank, with the banks' names (H2SVC: instantaneous, short_term, episodic; empty otherwise)."""

    policy: str = ""
    layer_tokens: list[int] = field(default_factory=list)  # per layer (H2SVC: the mean over its KV heads)
    kv_tokens: int = 0  # all layers (or heads) summed
    kv_bytes: int = 0  # bytes the cache tensors hold
    budget_tokens: int = 0  # 0: the policy takes none
    instant_tokens: int = 0  # the instant window's video tokens in a layer, held beside the budget
    units: list[int] = field(default_factory=list)  # video units with a token held anywhere, ascending
    max_position: float = -1.0
    reindex_events: int = 0
    bank_tokens: list[int] = field(default_factory=list)
    bank_names: list[str] = field(default_factory=list)  # what bank_tokens counts, in order
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, stats) -> "CacheSummary":
        """From the policy's ``stats()``."""
        return _copied(cls, stats, bank_names=list(stats.extra.get("bank_names", [])))


@dataclass(frozen=True)
class MemoryCounts:
    """What a set of frames (every camera's, or one camera's) holds now. Definitions
    (docs/interfaces.md, "What the numbers mean"): ``frames`` counts the frames of which some layer
    (H2SVC: some KV head) still holds at least half the tokens; the stamps are theirs; ``kv_tokens``
    is what a question limited to that set attends over: the system prompt, summary tokens and the
    set's frame tokens, summed over layers (H2SVC: over KV heads / KV heads per layer)."""

    frames: int = 0
    oldest_stamp: float = 0.0
    newest_stamp: float = 0.0
    kv_tokens: int = 0


@dataclass
class Exchange:
    question: str
    answer: str
    options: list[str] = field(default_factory=list)


@dataclass
class ChunkReport:
    chunk_id: int
    camera: str
    frames: int
    units: int
    tokens: int
    encode_ms: float
    prefill_ms: float
    compress_ms: float
    outcome: CompressionOutcome = field(default_factory=CompressionOutcome)
    compress_error: str = ""  # compressing failed: the chunk's frames are kept, over budget

    @property
    def compress_info(self) -> dict[str, Any]:
        """The outcome as a flat dict (what is logged and benchmarked)."""
        info = self.outcome.as_dict()
        if self.compress_error:
            info["compress_error"] = self.compress_error
        return info


@dataclass(frozen=True)
class EvidenceFrame:
    """A frame an answer drew on: its stamp, camera, and share of the answer's attention mass over
    the frames it could see (docs/interfaces.md "Time windows and evidence")."""

    stamp: float
    camera: str
    weight: float
    pose: Pose | None = None  # where the robot was when it took the frame (docs/places.md); None: unknown


@dataclass(frozen=True)
class Hole:
    """A span of a camera where frames were seen and are held nowhere (docs/archive.md "Holes"):
    dropped by the archive's bound, not written (a full disk), or while the node was down."""

    camera: str
    since: float
    until: float
    reason: str  # bound | disk | down
    chunks: int = 0  # chunks lost in it (0: unknown)


@dataclass
class Answer:
    text: str
    option_index: int
    answer_tokens: int
    ttft_ms: float
    total_ms: float
    frames_in_memory: int
    oldest_stamp: float
    newest_stamp: float
    kv_tokens: int
    cancelled: bool = False
    evidence: list[EvidenceFrame] = field(default_factory=list)  # strongest first, at most evidence_k
    # the summary tokens' share of the attention mass on frames and summary tokens (HERMES; 0 otherwise)
    evidence_summary_share: float = 0.0
    # options scored by their likelihood (options_mode "scored"): one probability per option; empty otherwise
    option_probabilities: list[float] = field(default_factory=list)
    # chunks brought back from the archive and replayed for this answer (0: the working memory answered)
    recalled_chunks: int = 0
    # how far back what the answer could read reaches (docs/interfaces.md "How far back an answer
    # reaches"): the oldest frame stamp (0.0: none), and whether older frames were seen and evicted
    searched_since: float = 0.0
    evicted_before: bool = False
    # a question without options to a model that declares its answers (answer_kinds.py;
    # docs/interfaces.md "Free-text answers"): the kind asked for, the kind the answer is ("" for
    # none), and the message when they differ (then the answer is not one: the node says success false)
    expected_kind: str = ""
    answer_kind: str = ""
    kind_error: str = ""
    # frames held inside the window (working memory or archive), against frames_in_memory: what it read
    frames_in_window: int = 0
    holes: list[Hole] = field(default_factory=list)  # inside the window, oldest first (evicted_before then true)
    frames_in_place: int = 0  # under a place: the window's frames taken inside it (docs/places.md)
    # a "Did you see ...?" question, retrieved then verified as `when` finds a moment (questions/desk.py):
    # how ("index", "walk", "standing", "memory", "index_unsure"; "" for any other question), the
    # index's candidates, and whether every part of the window that could hold a yes was read
    found_by: str = ""
    index_candidates: int = 0
    search_complete: bool = True


@dataclass
class ArchiveStatus:
    """The archive tier (docs/archive.md): chunks and payload bytes held, the bound, the file's bytes
    on disk, the free bytes of its file system, and the span of stamps it reaches."""

    chunks: int = 0
    bytes: int = 0
    max_bytes: int = 0
    file_bytes: int = 0
    disk_free_bytes: int = 0
    oldest_stamp: float = 0.0
    newest_stamp: float = 0.0
    path: str = ""
    # chunks encoded and never written (a full disk, a write error), and whether that goes on now
    not_archived: int = 0
    failing: bool = False
    holes: int = 0  # spans seen and held nowhere (docs/archive.md "Holes")
    # damaged files set aside at open (at most two), their bytes counted apart from the bound
    damaged_copies: list[str] = field(default_factory=list)
    damaged_bytes: int = 0


@dataclass
class IndexStatus:
    """The archive's index (docs/archive.md "Calibrating the index"): which dual encoder, whether a
    window it finds nothing in is answered not found (trusted) or searched further, how it did on the
    calibration set, and the answers that could not read all of their window."""

    identity: str = ""  # the encoder's folder name @ a hash of its weights and config
    trusted: bool = False
    description: str = ""  # one line: the calibration's figures and what trust means here
    recall: float = 0.0  # on the calibration set, at the threshold in use
    false_yes: float = 0.0
    incomplete_answers: int = 0  # `when` / "did you see" answers with search_complete false so far


@dataclass
class WhenAnswer:
    """The when search's answer (docs/interfaces.md "When"): the stamp where the answer is yes last
    or first, its window's P(yes), the timeline (one P(yes) per frame stamp, oldest first), and what
    the search cost."""

    found: bool
    stamp: float
    camera: str
    yes_probability: float
    timeline_stamps: list[float]
    timeline_yes_probability: list[float]
    questions_asked: int
    total_ms: float
    frames_searched: int
    recalled_chunks: int = 0  # archived chunks the search ran over (0: the working memory alone)
    searched_since: float = 0.0  # as Answer's: the oldest frame stamp searched (0.0: none)
    evicted_before: bool = False  # frames older than searched_since were seen and are no longer held
    # mode first: the answer lies in the oldest unit searched (the search sets it); the Session
    # keeps it only where older frames were evicted: the first time may be older
    may_be_older: bool = False
    # how it was found: "index" (ranked, then verified by short replays), "standing" (a standing
    # question's noted answers), "walk" (replays of the archive in time order: part of the window is
    # not indexed) or "memory" (the working memory searched); docs/archive.md "When with the index"
    found_by: str = "memory"
    index_candidates: int = 0  # chunks the index ranked at or above its threshold
    frames_in_window: int = 0  # frames held inside the window (working memory or archive)
    holes: list[Hole] = field(default_factory=list)  # inside the window, oldest first
    frames_in_place: int = 0  # under a place: the window's frames taken inside it (docs/places.md)
    pose: Pose | None = None  # where the robot was at ``stamp`` (None: not found, or no pose there)
    may_lie_in_hole: bool = False  # a hole newer (last) / older (first) than the answer, or any when not found
    # false when part of the window that could hold the answer was not read: the index could not
    # settle it and the walk stopped at walk_chunks, or the walk's replays could not hold the window
    # (found_by "index_unsure" for a not found; docs/archive.md "When with the index")
    search_complete: bool = True


@dataclass(frozen=True)
class MemoryReset:
    """What a reset forgot: frames of the working memory, chunks deleted from the archive."""

    frames: int
    archived_chunks: int = 0


@dataclass(frozen=True)
class WatchAnswer:
    """A standing question's answer over one chunk's window."""

    question: str
    camera: str
    stamp: float  # the window's last frame stamp
    yes_probability: float

    @property
    def answer(self) -> str:
        return "yes" if self.yes_probability >= 0.5 else "no"


@dataclass
class FrameRetention:
    """One frame still in memory and how much of it is kept (docs/interfaces.md "The memory timeline")."""

    stamp: float
    camera: str
    unit: int  # its stream unit (the two frames of a Qwen2.5-VL temporal patch share one)
    layer_kept: list[float]  # per layer: the share of its tokens held, over the layer's KV heads
    bank_kept: list[float] = field(default_factory=list)  # H2SVC: per bank, over the bank's heads
    pose: Pose | None = None  # where the robot was when it took the frame (docs/places.md)

    @property
    def kept(self) -> float:
        """The share of its tokens held over every layer."""
        return sum(self.layer_kept) / len(self.layer_kept) if self.layer_kept else 0.0


@dataclass
class MemoryTimeline:
    policy: str
    num_layers: int
    bank_names: list[str]  # what bank_kept counts, in order (H2SVC); empty otherwise
    frames: list[FrameRetention]  # oldest first
    holes: list[Hole] = field(default_factory=list)  # the archive's, of the camera asked (docs/archive.md "Holes")


@dataclass(frozen=True)
class DeviceMemory:
    """The accelerator's memory as torch's allocator sees it; all 0 without CUDA."""

    allocated_bytes: int = 0
    reserved_bytes: int = 0
    peak_bytes: int = 0
    total_bytes: int = 0

    @classmethod
    def of(cls, device: torch.device) -> "DeviceMemory":
        if device.type != "cuda" or not torch.cuda.is_available():
            return cls()
        return cls(torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device),
                   torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory)


def size_text(n: int) -> str:
    """Bytes as a person reads them: 400 kB, 12.5 MiB, 1.0 GiB."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 1000:.0f} kB" if n >= 1000 else f"{n} B"


def process_rss_bytes() -> int:
    """This process's resident memory in bytes (Linux: /proc/self/statm; elsewhere the peak from
    getrusage, the best the standard library offers; 0 when neither is readable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        try:
            import resource  # noqa: PLC0415

            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        except (ImportError, OSError):
            return 0


@dataclass(frozen=True)
class EngineInfo:
    """What a session runs: the same for its whole life."""

    model_id: str
    model_family: str
    device: str
    dtype: str
    policy: str
    chunk_frames: int
    prefix_tokens: int
    max_question_tokens: int


@dataclass
class SessionStatus:
    policy: str = ""
    model_id: str = ""
    frames_in_memory: int = 0
    oldest_stamp: float = 0.0
    newest_stamp: float = 0.0
    cache: CacheSummary = field(default_factory=CacheSummary)
    prefix_tokens: int = 0  # system prompt tokens per layer (kept on top of any budget)
    device_memory: DeviceMemory = field(default_factory=DeviceMemory)
    last_chunk: ChunkReport | None = None
    chunks_encoded: int = 0
    chunks_failed: int = 0
    chunks_failed_in_a_row: int = 0  # since the last chunk that went through: the memory is not updating
    last_chunk_error: str = ""
    # why chunks are not taken in (the memory reached the model's position range), "" while they are
    ingest_stopped: str = ""
    questions_answered: int = 0
    pending_frames: int = 0
    last_ttft_ms: float = 0.0
    cameras: list[str] = field(default_factory=list)
    most_questions_a_chunk_waited_for: int = 0
    camera_memory: dict[str, MemoryCounts] = field(default_factory=dict)  # per camera, as frames_in_memory
    process_rss_bytes: int = 0  # the process's resident host memory (what an edge board runs out of first)
    archive: ArchiveStatus | None = None  # None: no archive
    index: IndexStatus | None = None  # None: no index (no archive, or retrieval_model_path off)

    @property
    def memory(self) -> MemoryCounts:
        """The whole memory's counts (every camera's)."""
        return MemoryCounts(self.frames_in_memory, self.oldest_stamp, self.newest_stamp, self.cache.kv_tokens)
