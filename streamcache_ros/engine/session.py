"""The streaming session: frames in (chunked per camera), questions answered from the memory.

    adapter = load_adapter("tiny-qwen2_5_vl")
    session = Session(adapter, make_policy("fifo", budget_tokens=256), SessionConfig(chunk_frames=8))
    session.add_frame(rgb, stamp=12.5, camera="/camera/image_raw")
    answer = session.ask("what is on the table?")

The Session is a face: it holds the lock and the frames waiting for their chunk, and hands every decision
to the part that owns it (docs/architecture.md): ingest/pipeline.py how a chunk runs, memory/ledger.py
what is in memory, recall/tier.py what a question reads (the working memory or a replay of archived
chunks) and how far back its answer reaches, questions/desk.py how a question is checked, refused,
answered and booked, memory/snapshots.py the files, parameters.py what a running stream may take. A
question's tokens are truncated away after it, so the cache is what it was. No ROS here.
"""
from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Callable

import numpy as np

from .adapters import ModelAdapter
from .cache import PREFIX_UNIT, SUMMARY_UNIT, CachePolicy, make_policy
from .config import SessionConfig, default_evidence_layers
from .errors import ConfigError, QuestionError
from .ingest.pipeline import ChunkPipeline
from .memory.ledger import UnitLedger
from .memory.snapshots import check_writable, load_policy_state, read_memory, write_snapshot
from .places import Place, restored_poses, snapshot_poses
from .parameters import budget_warning, check_runtime, check_tunable, resolved_budget_tokens
from .questions import checks
from .questions.answering import QuestionRunner
from .questions.desk import QuestionDesk
from .questions.turns import TurnLock
from .recall.archive import Archive, ArchiveSettings, EncodedChunk
from .recall.scratch import ScratchMemories
from .recall.tier import MemoryTier
from .status import (Answer, ArchiveStatus, CacheSummary, ChunkReport, DeviceMemory, EngineInfo, EvidenceFrame,
                     MemoryReset, MemoryTimeline, SessionStatus, WatchAnswer, WhenAnswer, process_rss_bytes)
from .stream.chunk_queue import ChunkQueue

__all__ = ["Session", "SessionConfig"]


class Session:
    """One visual memory over one model; thread-safe (one lock around the model and the cache)."""

    def __init__(self, adapter: ModelAdapter, policy: CachePolicy, config: SessionConfig | None = None,
                 prefix_state: dict | None = None):
        self.adapter, self._prefix_state = adapter, prefix_state  # a scratch's system prompt KV, copied
        self.policy = policy
        self.config = config or SessionConfig()
        self.ledger = UnitLedger(SUMMARY_UNIT)
        policy.setup(adapter.geometry())
        layers = policy.geometry.num_layers
        self.evidence_layers = self.config.evidence_layers or default_evidence_layers(layers)
        wrong = [layer for layer in self.evidence_layers if not 0 <= layer < layers]
        if wrong:
            raise ConfigError("evidence_layers", f"{wrong} are not layers of this model (0..{layers - 1})")
        # a replay of archived chunks is prefilled into a scratch Session over a full cache
        scratch = ScratchMemories(lambda state: Session(adapter, make_policy("full"), self.config, state),
                                  lambda: adapter.prefix_ids)
        self.memory = MemoryTier(adapter, policy, self.ledger, scratch)
        self.chunks = ChunkPipeline(adapter, policy, self.ledger, self.config, keep=self.memory.keep,
                                    index_frames=self.memory.index_frames,
                                    thumbnail_frames=self.memory.thumbnail_frames)
        self.memory.make_whole(self.config.chunk_frames, self.chunks.encode_only)
        self.guidance = self.chunks.guidance  # computes what a policy's guidance_request asks for
        # model + cache: one forward pass at a time; a waiting chunk goes before waiting questions
        self._cache_lock = TurnLock()
        self._pending_lock = threading.Lock()  # frames waiting for their chunk: cheap to take
        self.answering = QuestionRunner(adapter, policy, self.config)
        self.desk = QuestionDesk(adapter, policy, self.config, self.ledger, self._cache_lock, self.memory,
                                 self.answering, self.evidence_layers, self.flush, self.waiting_stamps)
        # the most questions that ended while a due chunk waited for the model (1: the one in progress)
        self.most_questions_a_chunk_waited_for = 0
        # called with every chunk taken in, under the session's lock, whatever encoded it: a full
        # chunk, or a partial one a question, a save or a rate change encoded (flush); the node asks
        # its standing questions there, so they run on every chunk, in order (docs/interfaces.md
        # "Standing questions")
        self.on_chunk: Callable[[ChunkReport], None] | None = None
        with self._cache_lock:
            self._clear()

    # -- what the desk keeps, read where the Session was read before -------------------------------
    @property
    def history(self):
        return self.desk.history

    @property
    def questions_answered(self) -> int:
        return self.desk.questions_answered

    @property
    def last_attention_mass(self):
        return self.desk.last_attention_mass

    # -- state ----------------------------------------------------------------------------------
    def _clear(self) -> None:
        self._pending: ChunkQueue[tuple[np.ndarray, float]] = ChunkQueue(self.config.chunk_frames)
        self.ledger.clear()
        self.desk.clear()
        self.chunks.clear()
        self.policy.reset()
        if self._prefix_state is not None:  # a replay's scratch: its system prompt as the first one's
            return self.policy.load_state_dict(self._prefix_state)
        ids = self.adapter.prefix_ids
        self.policy.ensure_room(len(ids))
        self.adapter.forward(self.adapter.embed_text(ids), self.adapter.text_tokens(len(ids), PREFIX_UNIT),
                             self.policy)

    def reset(self) -> MemoryReset:
        """Forget every frame and the question history, the archive's too; says what was forgotten."""
        with self._cache_lock, self._pending_lock:
            forgotten = self.memory.counts().frames
            self._clear()
            return MemoryReset(forgotten, self.memory.clear())

    # -- the archive tier -------------------------------------------------------------------------
    def attach_archive(self, archive: Archive, key_layers: tuple[int, ...] = (), encoder=None) -> None:
        """From now on every chunk also goes to ``archive``, and questions that reach past the working memory
        are answered from it (recall/tier.py; docs/archive.md). ``key_layers``: the layers of the retrieval
        keys (default: the evidence layers); ``encoder``: the index's dual encoder (recall/index/), or None."""
        with self._cache_lock:
            self.memory.attach(archive, tuple(key_layers) or tuple(self.evidence_layers), encoder)
            self.chunks.key_layers = self.memory.key_layers

    def open_archive(self, path: str, owner: str = "", encoder=None, set_aside: bool = False, **settings) -> list[str]:
        """Open (or create) the archive in the folder ``path`` (``settings``: ArchiveSettings' fields)
        for this model and these cameras, and attach it; returns what opening found and mended (each a
        warning to log). ArchiveError when it is refused (held by another node, another model's, other
        cameras: with ``set_aside`` those two are set aside instead, ``Archive.open``), nothing changed."""
        for name, field in (("recall_chunks", "recall_chunks"), ("archive_thumbnail_px", "thumbnail_px")):
            if int(settings.get(field, 0)) < 0:
                raise ConfigError(name, f"must be >= 0, got {settings[field]}")
        settings = ArchiveSettings(path, **settings)
        identity = {"model_id": self.adapter.model_id, "config_hash": self.adapter.config_hash}
        archive = Archive.open(settings, identity, self.config.cameras, owner, set_aside_mismatch=set_aside)
        self.attach_archive(archive, encoder=encoder)
        return list(archive.warnings)

    def archive_warnings(self) -> list[str]:
        """What opening the archive found and mended (each a line to log); empty without one."""
        archive = self.memory.archive
        return list(archive.warnings) if archive is not None else []

    def thumbnails_at(self, stamps: list[float], cameras: list[str] | None = None) -> list:
        """The archived thumbnail (stamp, camera, jpeg) of each frame stamped ``stamps[i]`` (of
        ``cameras[i]``), None where there is none; read off the turn lock (docs/show.md)."""
        archive = self.memory.archive
        if archive is None or not stamps:
            return [None] * len(stamps)
        return archive.thumbnails_at(list(stamps), list(cameras or []))

    def close_archive(self) -> None:
        with self._cache_lock:
            archive, self.chunks.key_layers = self.memory.detach(), ()
            if archive is not None:
                archive.close()

    # -- frames ---------------------------------------------------------------------------------
    def add_frame(self, frame: np.ndarray, stamp: float, camera: str = "") -> ChunkReport | None:
        """Queue one RGB uint8 frame [H, W, 3]; encodes a chunk when ``chunk_frames`` are queued.

        Raises FrameError (nothing queued) or ChunkError (the chunk was dropped, memory unchanged).
        """
        frame = checks.checked_frame(frame)
        with self._pending_lock:
            batch = self._pending.push(camera, (frame, float(stamp)))
            self.ledger.note_camera(camera)
            if batch is None:
                return None
        questions_before = self._cache_lock.questions_done
        with self._cache_lock:
            waited = self._cache_lock.questions_done - questions_before
            self.most_questions_a_chunk_waited_for = max(self.most_questions_a_chunk_waited_for, waited)
            return self._run_chunk(camera, batch)

    def flush(self) -> list[ChunkReport]:
        """Encode every camera's queued frames now (a partial chunk)."""
        with self._cache_lock:
            with self._pending_lock:
                batches = self._pending.flush()
            return [self._run_chunk(camera, batch) for camera, batch in batches]

    def take_in(self, chunk: EncodedChunk) -> ChunkReport:
        """An already encoded chunk (an archived one, replayed) into this memory, as a chunk of its camera."""
        with self._cache_lock:
            self.ledger.note_camera(chunk.camera)
            return self.chunks.run_encoded(chunk, [])

    def _run_chunk(self, camera: str, batch) -> ChunkReport:
        """One chunk through the pipeline (which hands it to the archive as it is booked), then to ``on_chunk``."""
        report = self.chunks.run(camera, batch, self.desk.history)
        if self.on_chunk is not None:
            self.on_chunk(report)
        return report

    def pending_frames(self) -> int:
        with self._pending_lock:
            return len(self._pending)

    def waiting_stamps(self, camera: str) -> list[float]:
        """The stamps of ``camera``'s frames waiting for their chunk."""
        with self._pending_lock:
            return [stamp for _, stamp in self._pending.waiting(camera)]

    # -- questions (questions/desk.py) ----------------------------------------------------------------
    def ask(self, question: str, options: list[str] | tuple[str, ...] = (), camera: str = "",
            max_new_tokens: int = 0, on_text: Callable[[str, str], None] | None = None,
            should_stop: Callable[[], bool] | None = None, since: float | None = None,
            until: float | None = None, evidence_k: int | None = None, where: Place | None = None) -> Answer:
        """Answer from the memory (greedy). Frames queued so far are encoded first.

        ``on_text(partial, new_text)`` streams the answer; ``should_stop()`` cancels between tokens.
        ``since`` / ``until`` (stamps, None = open) restrict the answer to the units with a frame
        stamped inside the window, by masking the attention to every other unit's tokens; the
        answer's ``evidence`` names the ``evidence_k`` frames it drew on most (None: the session's
        ``evidence_k``; docs/interfaces.md "Time windows and evidence"), each with its pose. A window
        older than the working memory holds whole is answered over a replay of archived chunks
        (docs/archive.md). QuestionError before anything touches the cache for a refused question."""
        return self.desk.ask(question, options, camera, max_new_tokens, on_text, should_stop, since, until, evidence_k, where)

    def when(self, question: str, mode: str = "last", camera: str = "", since: float | None = None,
             until: float | None = None, where: Place | None = None) -> WhenAnswer:
        """The last or first stamp at which the yes/no ``question`` holds, or its timeline (docs/interfaces.md
        "When"); ``where`` (ask too): only frames taken inside that place (docs/places.md)."""
        return self.desk.when(question, mode, camera, since, until, where)

    def watch(self, questions: list[str], chunk: ChunkReport) -> list[WatchAnswer]:
        """Standing yes/no ``questions`` asked over the window of the chunk just encoded, in one pass,
        on its camera's position clock (as a question about that camera); empty when the chunk's
        frames are no longer in memory."""
        return self.desk.watch(questions, chunk)

    def check_yes_no_question(self, question: str) -> None:
        """QuestionError unless ``question`` could be asked by ``when`` or stand in ``watch_questions``."""
        self.desk.check_yes_no_question(question)

    def window_units(self, since: float | None = None, until: float | None = None, camera: str = "") -> list[int]:
        """The units a question about ``camera`` over since/until sees (what its key filter shows)."""
        with self._cache_lock:
            return self.ledger.visible(camera, checks.checked_window(since, until)).units

    def rank_evidence(self, probe, units=None, window=None, k: int = 3,
                      layers: list[int] | None = None) -> tuple[list[EvidenceFrame], float]:
        """``QuestionDesk.rank_evidence``: the ``k`` frames with the most attention mass, and the summary's share."""
        return self.desk.rank_evidence(probe, units, window, k, layers)

    def memory_timeline(self, camera: str = "") -> MemoryTimeline:
        """Every frame still in memory (of ``camera`` when given), oldest first, with the share of its
        tokens each layer (and each H2SVC bank) still holds (docs/interfaces.md "The memory timeline")."""
        camera = checks.resolved_camera(camera, self.config.cameras)
        if camera and camera not in self.ledger.cameras and camera not in self.config.cameras:
            raise QuestionError(f"unknown camera '{camera}'")
        with self._cache_lock:
            return self.memory.timeline(camera, list(self.policy.stats().extra.get("bank_names", [])))

    # -- status ---------------------------------------------------------------------------------
    def info(self) -> EngineInfo:
        adapter = self.adapter
        return EngineInfo(model_id=adapter.model_id, model_family=adapter.family, device=str(adapter.device),
                          dtype=str(adapter.dtype).replace("torch.", ""), policy=self.policy.name,
                          chunk_frames=self.config.chunk_frames, prefix_tokens=len(adapter.prefix_ids),
                          max_question_tokens=self.config.max_question_tokens)

    def status(self) -> SessionStatus:
        with self._cache_lock:
            held, stats = self.policy.unit_tokens(), self.policy.stats()
            counts = self.ledger.counts(held, stats.kv_tokens)
            archive = self.memory.archive
            return SessionStatus(
                policy=self.policy.name, model_id=self.adapter.model_id,
                frames_in_memory=counts.frames, oldest_stamp=counts.oldest_stamp, newest_stamp=counts.newest_stamp,
                cache=CacheSummary.of(stats), prefix_tokens=len(self.adapter.prefix_ids),
                device_memory=DeviceMemory.of(self.adapter.device), last_chunk=self.chunks.last,
                chunks_encoded=self.chunks.encoded, chunks_failed=self.chunks.failed,
                chunks_failed_in_a_row=self.chunks.failed_in_a_row, last_chunk_error=self.chunks.last_error,
                ingest_stopped=self.chunks.stopped,
                questions_answered=self.desk.questions_answered, pending_frames=self.pending_frames(),
                last_ttft_ms=self.desk.last_ttft_ms, cameras=list(self.ledger.cameras),
                most_questions_a_chunk_waited_for=self.most_questions_a_chunk_waited_for,
                camera_memory=self.ledger.camera_counts(held, stats.kv_tokens), process_rss_bytes=process_rss_bytes(),
                archive=ArchiveStatus(**archive.stats()) if archive is not None else None,
                index=self.memory.index_status())

    # -- runtime tuning (parameters.py) -------------------------------------------------------------
    def tune(self, max_new_tokens: int | None = None, sample_fps: float | None = None,
             budget_tokens: int | None = None) -> None:
        """Change what may change while the stream runs (docs/interfaces.md, "Changing parameters at runtime");
        a ConfigError changes nothing. ``sample_fps``: the frames waiting for their chunk are encoded first, at
        the old rate (a partial chunk), so that every chunk's time stride (Qwen2.5-VL's M-RoPE t) matches its
        own frames' spacing. ``budget_tokens``: the next chunk's compression brings the cache to it."""
        changes = {"max_new_tokens": max_new_tokens, "sample_fps": sample_fps, "budget_tokens": budget_tokens}
        for name, value in changes.items():
            if value is not None:
                check_tunable(self.policy, name, value)
        with self._cache_lock:
            if max_new_tokens is not None:
                self.config.max_new_tokens = int(max_new_tokens)
            if budget_tokens is not None:
                self.policy.set_budget(int(budget_tokens))
            if sample_fps is not None:
                try:
                    self.flush()  # a chunk that fails here is dropped and reported (ChunkError) ...
                finally:
                    self.adapter.set_sample_fps(float(sample_fps))  # ... and the new rate applies all the same

    def check_runtime(self, name: str, value) -> None:
        """ConfigError when the running stream cannot take ``value`` for the runtime parameter ``name``."""
        check_runtime(self.adapter, self.policy, name, value)

    def budget_in_force(self, budget_tokens: int) -> int:
        """The budget ``budget_tokens`` puts in force on this model: itself, or for 0 the model's own."""
        return resolved_budget_tokens(int(budget_tokens), self.adapter)

    def budget_warning(self, budget_tokens: int) -> str:
        """'' unless ``budget_tokens`` is far above the model folder's own budget (parameters.py)."""
        return budget_warning(self.adapter, self.policy, budget_tokens)

    # -- snapshots (memory/snapshots.py) --------------------------------------------------------------
    def _identity(self) -> dict:
        return {"model_id": self.adapter.model_id, "config_hash": self.adapter.config_hash,
                "policy": self.policy.name, "policy_config": self.policy.config_dict()}

    def save(self, path: str) -> int:
        """Write the memory to ``path``; returns bytes written. Queued frames are encoded first, once
        the path is known to be writable (a refused save leaves them waiting)."""
        check_writable(path)
        with self._cache_lock:
            self.flush()
            return write_snapshot(path, {**self._identity(), "policy_state": self.policy.state_dict(), **snapshot_poses(
                self.memory), "history": [asdict(x) for x in self.desk.history], **self.ledger.state_dict()})

    def load(self, path: str) -> int:
        """Replace the memory with the snapshot at ``path``; returns frames in memory.

        A snapshot that is not one (truncated, corrupted, another format version), was made with
        another model or policy (or policy parameters), or holds frames of cameras this session does
        not have (``SessionConfig.cameras``, when set) is refused; the memory is then unchanged.
        """
        saved = read_memory(path, self._identity(), self.config.cameras)
        with self._cache_lock, self._pending_lock:
            load_policy_state(self.policy, saved, path)
            self.ledger.load_state(saved.ledger)
            self.desk.history, self.memory.saved_poses = saved.history, restored_poses(saved.state)
            self._pending.clear()
            self.chunks.stopped = ""  # the next chunk finds out whether the loaded memory has room
            return self.memory.counts().frames
