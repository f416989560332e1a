"""The streaming session: frames in (chunked per camera), questions answered from the cache.

    adapter = load_adapter("tiny-qwen2_5_vl")
    session = Session(adapter, make_policy("fifo", budget_tokens=256), SessionConfig(chunk_frames=8))
    session.add_frame(rgb, stamp=12.5, camera="/camera/image_raw")
    answer = session.ask("what is on the table?")

The Session orchestrates: it holds the locks, queues frames per camera, and hands the parts to
those who own them (docs/architecture.md): ingest.py how a chunk runs (encode, prefill, compress),
ledger.py what is in memory, checks.py what may come in, layout.py how a stream becomes tokens,
decoding.py an answer's tokens, snapshot_io.py the files. A question is prefilled and decoded from
the cache, then its tokens are truncated away again, so memory stays bounded and the cache is what
it was. No ROS here.
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from dataclasses import asdict
from typing import Callable

import numpy as np

from .questions import answer_kinds, checks
from .questions import when as when_search
from .adapters import ModelAdapter, match_option
from .cache import PREFIX_UNIT, SUMMARY_UNIT, CachePolicy
from .cache.evidence import OFFSET, AttentionMass, retention
from .cache.positions import PositionRangeError
from .config import SessionConfig, default_evidence_layers
from .errors import ChunkError, ConfigError, QuestionError, SnapshotError
from .recall.archive import Archive, ArchiveSettings
from .ingest.pipeline import ChunkPipeline
from .stream.chunk_queue import ChunkQueue
from .memory.ledger import Selection, UnitLedger, Window
from .questions.answering import YES_NO, QuestionRunner
from .recall.tier import Recall
from .parameters import check_budget, far_above_model_budget, reference_unit, resolved_budget_tokens
from .memory.snapshots import budget_apart, check_identity, check_writable, read_state, write_snapshot
from .status import (Answer, ArchiveStatus, CacheSummary, ChunkReport, DeviceMemory, EngineInfo, EvidenceFrame, Exchange, MemoryCounts,
                     MemoryTimeline, SessionStatus, WatchAnswer, WhenAnswer, process_rss_bytes)
from .questions.turns import TurnLock

__all__ = ["Session", "SessionConfig"]

class Session:
    """One visual memory over one model; thread-safe (one lock around the model and the cache)."""

    def __init__(self, adapter: ModelAdapter, policy: CachePolicy, config: SessionConfig | None = None):
        self.adapter = adapter
        self.policy = policy
        self.config = config or SessionConfig()
        self.ledger = UnitLedger(SUMMARY_UNIT)
        policy.setup(adapter.geometry())
        self.chunks = ChunkPipeline(adapter, policy, self.ledger, self.config)
        self.guidance = self.chunks.guidance  # computes what a policy's guidance_request asks for
        # model + cache: one forward pass at a time; a waiting chunk goes before waiting questions
        self._cache_lock = TurnLock()
        self._pending_lock = threading.Lock()  # frames waiting for their chunk: cheap to take
        self.answering = QuestionRunner(adapter, policy, self.config)
        # the most questions that ended while a due chunk waited for the model (1: the one in progress)
        self.most_questions_a_chunk_waited_for = 0
        layers = policy.geometry.num_layers
        self.evidence_layers = self.config.evidence_layers or default_evidence_layers(layers)
        wrong = [layer for layer in self.evidence_layers if not 0 <= layer < layers]
        if wrong:
            raise ConfigError("evidence_layers", f"{wrong} are not layers of this model (0..{layers - 1})")
        # the last answer's attention mass, every measured layer's row (bench/evidence_layers.py reads it)
        self.last_attention_mass: AttentionMass | None = None
        self.recall: Recall | None = None  # the archive tier, once attached (attach_archive)
        # called with every chunk taken in, under the session's lock, whatever encoded it: a full
        # chunk, or a partial one a question, a save or a rate change encoded (flush); the node asks
        # its standing questions there, so they run on every chunk, in order (docs/interfaces.md
        # "Standing questions")
        self.on_chunk: Callable[[ChunkReport], None] | None = None
        with self._cache_lock:
            self._clear()

    # -- state ----------------------------------------------------------------------------------
    def _clear(self) -> None:
        self._pending: ChunkQueue[tuple[np.ndarray, float]] = ChunkQueue(self.config.chunk_frames)
        self.ledger.clear()
        self.history: list[Exchange] = []
        self.chunks.clear()
        self.questions_answered = 0
        self.last_ttft_ms = 0.0
        self.policy.reset()
        ids = self.adapter.prefix_ids
        self.policy.ensure_room(len(ids))
        self.adapter.forward(self.adapter.embed_text(ids), self.adapter.text_tokens(len(ids), PREFIX_UNIT),
                             self.policy)

    def reset(self) -> int:
        """Forget every frame and the question history, the archive's too; returns the frames
        forgotten from the working memory."""
        with self._cache_lock, self._pending_lock:
            forgotten = self._counts().frames
            self._clear()
            if self.recall is not None:
                self.recall.archive.clear()
            return forgotten

    # -- the archive tier -------------------------------------------------------------------------
    def attach_archive(self, archive: Archive, key_layers: tuple[int, ...] = ()) -> None:
        """From now on every chunk also goes to ``archive``, and questions that reach past the
        working memory are answered from it (recall.py; docs/archive.md). ``key_layers``: the
        layers of the retrieval keys (default: the evidence layers)."""
        with self._cache_lock:
            self.recall = Recall(self, archive, tuple(key_layers) or tuple(self.evidence_layers))

    def open_archive(self, path: str, max_bytes: int, recall_chunks: int, owner: str = "") -> list[str]:
        """Open (or create) the archive in the folder ``path`` for this model and these cameras, and
        attach it; returns what opening found and mended (each a warning to log). ArchiveError when
        it is refused (held by another node, another model's, other cameras), nothing changed."""
        if int(recall_chunks) < 0:
            raise ConfigError("recall_chunks", f"must be >= 0, got {recall_chunks}")
        settings = ArchiveSettings(path, max_bytes=int(max_bytes), recall_chunks=int(recall_chunks))
        identity = {"model_id": self.adapter.model_id, "config_hash": self.adapter.config_hash}
        archive = Archive.open(settings, identity, self.config.cameras, owner)
        self.attach_archive(archive)
        return list(archive.warnings)

    def close_archive(self) -> None:
        with self._cache_lock:
            if self.recall is not None:
                self.recall.archive.close()
                self.recall = None

    def _run_chunk(self, camera: str, batch) -> ChunkReport:
        """One chunk through the pipeline, then into the archive (kept even when its compression
        failed: its frames are in the working memory then), then to ``on_chunk``."""
        try:
            report = self.chunks.run(camera, batch, self.history)
        finally:
            if self.recall is not None:
                self.recall.keep()
        if self.on_chunk is not None:
            self.on_chunk(report)
        return report

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

    def pending_frames(self) -> int:
        with self._pending_lock:
            return len(self._pending)

    # -- questions ------------------------------------------------------------------------------
    def ask(self, question: str, options: list[str] | tuple[str, ...] = (), camera: str = "",
            max_new_tokens: int = 0, on_text: Callable[[str, str], None] | None = None,
            should_stop: Callable[[], bool] | None = None, since: float | None = None,
            until: float | None = None, evidence_k: int | None = None) -> Answer:
        """Answer from the cache (greedy). Frames queued so far are encoded first.

        ``on_text(partial, new_text)`` streams the answer; ``should_stop()`` cancels between tokens.
        ``since`` / ``until`` (stamps, None = open) restrict the answer to the units with a frame
        stamped inside the window, by masking the attention to every other unit's tokens; the
        answer's ``evidence`` names the ``evidence_k`` frames it drew on most (None: the session's
        ``evidence_k``; docs/interfaces.md "Time windows and evidence").
        Raises QuestionError before anything touches the cache when the question is refused.
        """
        started = time.perf_counter()
        options = [str(o) for o in options]
        camera = checks.resolved_camera(camera, self.config.cameras)
        budget = max_new_tokens or (self.config.mc_max_new_tokens if options else self.config.max_new_tokens)
        ids = self._question_ids(question, options, camera, budget)
        checks.check_camera_for_now(question, camera, self.config.cameras)
        window = checks.checked_window(since, until)
        evidence_k = self.config.evidence_k if evidence_k is None else int(evidence_k)
        if evidence_k < 0:
            raise QuestionError(f"evidence_k must be >= 0, got {evidence_k}")
        free_text = answer_kinds.check_free_text(question, options, answer_kinds.vocabulary_of(self.adapter),
                                                 self.adapter.model_id)
        with self._cache_lock.question():
            seen = self._select(camera, window, len(ids), budget)
            replay = self.recall.for_ask(ids, camera, window, seen.clock) if self.recall is not None else None
            if replay is None and not seen.units:
                self.ledger.visible(camera, window)  # refuses, as without an archive
            if replay is not None:
                return self._ask_replay(replay, question, options, camera, max_new_tokens, on_text, should_stop,
                                        since, until, evidence_k, started)
            probe = AttentionMass(self.evidence_layers, self.policy.geometry.num_layers, self.ledger.next_unit,
                                  self.policy.geometry.device) if evidence_k else None
            if options and self.config.options_mode == "scored":
                reply = self.answering.score(ids, options, seen, probe, on_text, started)
            else:
                reply = self.answering.decode(ids, budget, started, seen, probe, on_text, should_stop)
            evidence, summary_share = self.rank_evidence(probe, seen.units, window, evidence_k) if probe else ([], 0.0)
            self.last_attention_mass = probe
            self._book_exchange(question, reply.text, options, reply.ttft_ms)
            held = self._counts(seen.units, window=window)
            searched_since, evicted_before = self._reach(camera, window, held, self._archive_read(window))
        index = reply.option_index if reply.option_index is not None else match_option(reply.text, options)
        return Answer(text=reply.text.strip(), option_index=index, answer_tokens=reply.tokens, ttft_ms=reply.ttft_ms,
                      total_ms=(time.perf_counter() - started) * 1e3, frames_in_memory=held.frames,
                      oldest_stamp=held.oldest_stamp, newest_stamp=held.newest_stamp, kv_tokens=held.kv_tokens,
                      cancelled=reply.cancelled, evidence=evidence, evidence_summary_share=summary_share,
                      option_probabilities=reply.probabilities, searched_since=searched_since,
                      evicted_before=evicted_before, **free_text.judge(reply.text, reply.cancelled))

    def _ask_replay(self, replay, question, options, camera, max_new_tokens, on_text, should_stop, since, until,
                    evidence_k, started) -> Answer:
        """``ask`` over a replay of archived chunks (recall.py), booked as this session's question."""
        answer = replay.session.ask(question, options, camera, max_new_tokens, on_text, should_stop, since, until,
                                    evidence_k)
        self._book_exchange(question, answer.text, list(options), answer.ttft_ms)
        window = checks.checked_window(since, until)
        held = self._counts(self.ledger.visible(camera, window).units, window) if self._sees(camera, window) else None
        searched_since, evicted_before = self._reach(camera, window, held, archive_read=True)
        return dataclasses.replace(answer, recalled_chunks=len(replay.chunks), searched_since=searched_since,
                                   evicted_before=evicted_before, total_ms=(time.perf_counter() - started) * 1e3)

    def _sees(self, camera: str, window: Window | None) -> bool:
        try:
            self.ledger.visible(camera, window)
        except QuestionError:
            return False
        return True

    def _archive_read(self, window: Window | None) -> bool:
        """Whether a question over ``window`` (None: none) could read the archive: one with a window
        reaches it, one without only when ``recall_chunks`` brings chunks back (recall.py)."""
        if self.recall is None:
            return False
        return window is not None or self.recall.archive.settings.recall_chunks > 0

    def _reach(self, camera: str, window: Window | None, held: MemoryCounts | None,
               archive_read: bool) -> tuple[float, bool]:
        """(searched_since, evicted_before) of an answer that read ``held`` of the working memory (None:
        nothing of it), and the archive's frames of ``window`` when ``archive_read``: the oldest
        frame stamp it could read (0.0: none), and whether frames of ``camera`` older than that and
        inside the window were seen and are held nowhere the answer could read
        (docs/interfaces.md "How far back an answer reaches")."""
        window = window or Window()
        oldest = held.oldest_stamp if held is not None and held.frames else math.inf
        if archive_read and self.recall is not None:
            oldest = min(oldest, self.recall.oldest_stamp(window, camera))
        if oldest == math.inf:
            return 0.0, False
        seen_from = self.ledger.oldest_seen(camera)
        if self.recall is not None:  # after a restart the archive remembers older frames than the ledger
            seen_from = min(seen_from, self.recall.oldest_stamp(Window(), camera))
        return oldest, window.since < oldest and seen_from < oldest

    def _book_exchange(self, question: str, text: str, options: list[str], ttft_ms: float) -> None:
        """An answered question in the bounded history (HERMES guidance reads it) and the counters."""
        self.history.append(Exchange(question, text, options))
        del self.history[:-self.config.history_size]
        self.questions_answered += 1
        self.last_ttft_ms = ttft_ms

    def _question_ids(self, question: str, options: list[str], camera: str, answer_tokens: int) -> list[int]:
        """The question's token ids with its prompt; QuestionError for anything that cannot be asked
        (checked before the question touches the cache)."""
        limit = self.config.max_question_tokens
        checks.check_question(question, options, limit)
        checks.check_camera_name(camera, self.config.cameras)
        ids = self.adapter.question_ids(question, options)
        checks.check_prompt_length(ids, limit)
        checks.check_answer_room(len(ids), answer_tokens,
                                 self.config.largest_question(self.policy.geometry.max_position_embeddings))
        return ids

    def _select(self, camera: str, window: Window | None, prompt_tokens: int, answer_tokens: int) -> Selection:
        """Under the lock: the queued frames encoded, then what a question about ``camera`` over
        ``window`` sees, with positions made for its prompt and answer; QuestionError when it sees
        nothing or they do not fit. Whether it would see anything is checked before the queued
        frames are encoded, so a refusal leaves them waiting (docs/reliability.md "A refusal changes
        nothing"); the room for its prompt and answer was checked before (``_question_ids``)."""
        checks.check_camera_seen(camera, self.ledger.cameras, self.config.cameras)
        self._check_something_seen(camera, window)
        try:
            self.flush()
        except ChunkError as err:
            if not err.position_range:  # a full memory still answers from what it holds
                raise
        try:
            seen = self.ledger.visible(camera, window)
        except QuestionError:
            # the working memory sees nothing there (or holds nothing yet, after a restart): the
            # archive may; the caller asks it, and refuses as this did when it has nothing either
            if self.recall is None or not self.recall.holds(window, camera):
                raise
            seen = Selection([], None, window, None)
        try:
            self.policy.ensure_room(prompt_tokens + answer_tokens, seen.clock)
        except PositionRangeError as err:
            raise QuestionError(f"the question ({prompt_tokens} tokens) and its answer (max_new_tokens {answer_tokens}) "
                                f"do not fit in the positions left: {err}") from None
        return seen

    def _check_something_seen(self, camera: str, window: Window | None) -> None:
        """QuestionError when a question about ``camera`` over ``window`` would see nothing even once
        the queued frames are encoded: none of them, no frame in the working memory and none in
        the archive falls there."""
        with self._pending_lock:
            waiting = [stamp for _, stamp in self._pending.waiting(camera)]
        if any((window or Window()).holds(stamp) for stamp in waiting):
            return
        if self.recall is not None and self.recall.holds(window, camera):
            return
        if not self.ledger.units and waiting:
            raise QuestionError(f"no frames between {Window.describe(window.since)} and {Window.describe(window.until)} "
                                f"(the frames waiting for their chunk are stamped {min(waiting):.3f} to "
                                f"{max(waiting):.3f}): widen since/until")
        self.ledger.visible(camera, window)  # refuses when it sees nothing there

    # -- when and standing questions ---------------------------------------------------------------
    def when(self, question: str, mode: str = "last", camera: str = "", since: float | None = None,
             until: float | None = None) -> WhenAnswer:
        """The last or first stamp at which the yes/no ``question`` holds, or its timeline, searched
        over time windows of the memory (when.py; docs/interfaces.md "When")."""
        started = time.perf_counter()
        mode = str(mode or "last").strip().lower()
        if mode not in when_search.MODES:
            raise QuestionError(f"unknown mode '{mode}' (one of: {', '.join(when_search.MODES)})")
        camera = checks.resolved_camera(camera, self.config.cameras)
        ids = self._question_ids(question, list(YES_NO), camera, 1)
        checks.check_yes_no_question(question)
        window = checks.checked_window(since, until)
        with self._cache_lock.question():
            seen = self._select(camera, window or Window(), len(ids), 1)
            replays = self.recall.for_when(ids, camera, window or Window(), seen.clock, mode) if self.recall else ()
            found = self._when_replays(replays, question, mode, camera, since, until, started)
            if found is None and not seen.units:
                self.ledger.visible(camera, window)  # refuses, as without an archive
            if found is not None:
                return found
            # the frames in memory, as frames_in_memory counts them: one count of what was searched
            counted = self.ledger.counted(self.policy.unit_tokens(), seen.units) or seen.units
            units = sorted(counted, key=lambda u: (min(self.ledger.units[u].stamps), u))
            found = when_search.search(mode, len(units), lambda windows: self.answering.yes([ids] * len(windows), [
                [units[i] for i in w] for w in windows], seen.clock), when_search.SearchSettings.within(
                self.config.rows_per_pass, self.config.chunk_frames // self.adapter.frames_per_unit))
            self.questions_answered += 1
            found = when_search.answer(found, mode, [self.ledger.units[u] for u in units], window or Window(),
                                       (time.perf_counter() - started) * 1e3)
            searched = self._counts(units, window) if found.frames_searched else None
            return self._with_reach(found, camera, window, searched, self.recall is not None)

    def _with_reach(self, found: WhenAnswer, camera: str, window: Window | None, held: MemoryCounts | None,
                    archive_read: bool) -> WhenAnswer:
        """``found`` with its reach (``_reach``); ``may_be_older`` kept only where frames older than
        the edge it lies at were evicted."""
        searched_since, evicted_before = self._reach(camera, window, held, archive_read)
        return dataclasses.replace(found, searched_since=searched_since, evicted_before=evicted_before,
                                   may_be_older=found.found and found.may_be_older and evicted_before)

    def _when_replays(self, replays, question, mode, camera, since, until, started) -> WhenAnswer | None:
        """``when`` over the archive's replays, tried in order until one finds the answer (recall.py);
        None when there were none (the working memory holds the window whole)."""
        found, chunks, asked, searched, at_edge = None, 0, 0, 0, False
        for tried, replay in enumerate(replays):
            found = replay.session.when(question, mode, camera, since, until)
            chunks, asked, searched = chunks + len(replay.chunks), asked + found.questions_asked, \
                searched + found.frames_searched
            at_edge = found.may_be_older and tried == 0  # mode first walks the oldest replay first
            if found.found:
                break
        if found is None:
            return None
        self.questions_answered += 1
        window = checks.checked_window(since, until)
        held = self._counts(self.ledger.visible(camera, window).units, window) if self._sees(camera, window) else None
        found = dataclasses.replace(found, recalled_chunks=chunks, questions_asked=asked, frames_searched=searched,
                                    may_be_older=at_edge, total_ms=(time.perf_counter() - started) * 1e3)
        return self._with_reach(found, camera, window, held, archive_read=True)

    def watch(self, questions: list[str], chunk: ChunkReport) -> list[WatchAnswer]:
        """Standing yes/no ``questions`` asked over the window of the chunk just encoded, in one pass,
        on its camera's position clock (as a question about that camera); empty when the chunk's
        frames are no longer in memory."""
        prompts = [self._question_ids(q, list(YES_NO), "", 1) for q in questions]
        with self._cache_lock.question():
            units = [u for u, info in self.ledger.units.items() if info.chunk == chunk.chunk_id]
            if not prompts or not units:
                return []
            p_yes = self.answering.yes(prompts, [units] * len(prompts), self.ledger.clock(chunk.camera))
            if self.recall is not None:
                self.recall.note_watch(chunk.chunk_id, dict(zip(questions, p_yes)))
        stamp = max(self.ledger.stamps(units), default=0.0)
        return [WatchAnswer(q, chunk.camera, stamp, p) for q, p in zip(questions, p_yes)]

    # -- time -------------------------------------------------------------------------------------
    def window_units(self, since: float | None = None, until: float | None = None, camera: str = "") -> list[int]:
        """The units a question about ``camera`` over since/until sees (what its key filter shows)."""
        with self._cache_lock:
            return self.ledger.visible(camera, checks.checked_window(since, until)).units

    def rank_evidence(self, probe: AttentionMass, units: list[int] | None = None, window: Window | None = None,
                      k: int = 3, layers: list[int] | None = None) -> tuple[list[EvidenceFrame], float]:
        """The ``k`` frames of ``units`` with the most attention mass over ``layers`` (default: the
        measured ones), and the summary tokens' share (``UnitLedger.rank_evidence``)."""
        totals = probe.totals(layers).tolist()
        return self.ledger.rank_evidence(totals[OFFSET:], totals[SUMMARY_UNIT + OFFSET], units, window, k)

    def memory_timeline(self, camera: str = "") -> MemoryTimeline:
        """Every frame still in memory (of ``camera`` when given), oldest first, with the share of its
        tokens each layer (and each H2SVC bank) still holds (docs/interfaces.md "The memory timeline")."""
        camera = checks.resolved_camera(camera, self.config.cameras)
        if camera and camera not in self.ledger.cameras and camera not in self.config.cameras:
            raise QuestionError(f"unknown camera '{camera}'")
        with self._cache_lock:
            layer_tokens, layer_rows, bank_tokens, bank_rows = retention(self.policy.layer_stores(),
                                                                         self.ledger.next_unit)
            names = list(self.policy.stats().extra.get("bank_names", []))
            frames = self.ledger.timeline(layer_tokens, layer_rows, bank_tokens, bank_rows, camera)
            banks = [names[b] if b < len(names) else str(b) for b in sorted(bank_tokens)]
            return MemoryTimeline(self.policy.name, len(layer_rows), banks, frames)

    # -- status ---------------------------------------------------------------------------------
    def _counts(self, units=None, window: Window | None = None) -> MemoryCounts:
        return self.ledger.counts(self.policy.unit_tokens(), self.policy.stats().kv_tokens, units, window)

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
            return SessionStatus(
                policy=self.policy.name, model_id=self.adapter.model_id,
                frames_in_memory=counts.frames, oldest_stamp=counts.oldest_stamp, newest_stamp=counts.newest_stamp,
                cache=CacheSummary.of(stats), prefix_tokens=len(self.adapter.prefix_ids),
                device_memory=DeviceMemory.of(self.adapter.device), last_chunk=self.chunks.last,
                chunks_encoded=self.chunks.encoded, chunks_failed=self.chunks.failed,
                chunks_failed_in_a_row=self.chunks.failed_in_a_row, last_chunk_error=self.chunks.last_error,
                ingest_stopped=self.chunks.stopped,
                questions_answered=self.questions_answered, pending_frames=self.pending_frames(),
                last_ttft_ms=self.last_ttft_ms, cameras=list(self.ledger.cameras),
                most_questions_a_chunk_waited_for=self.most_questions_a_chunk_waited_for,
                camera_memory=self.ledger.camera_counts(held, stats.kv_tokens), process_rss_bytes=process_rss_bytes(),
                archive=self._archive_status())

    def _archive_status(self) -> ArchiveStatus | None:
        return ArchiveStatus(**self.recall.archive.stats()) if self.recall is not None else None

    # -- runtime tuning -------------------------------------------------------------------------
    def tune(self, max_new_tokens: int | None = None, sample_fps: float | None = None,
             budget_tokens: int | None = None) -> None:
        """Change what may change while the stream runs (docs/interfaces.md, "Changing parameters at
        runtime"); a ConfigError changes nothing. ``sample_fps``: the frames waiting for their chunk
        are encoded first, at the old rate (a partial chunk), so that every chunk's time stride
        (Qwen2.5-VL's M-RoPE t) matches its own frames' spacing. ``budget_tokens``: the next chunk's
        compression brings the cache to it."""
        changes = {"max_new_tokens": max_new_tokens, "sample_fps": sample_fps, "budget_tokens": budget_tokens}
        for name, value in changes.items():
            if value is not None:
                self._check_tunable(name, value)
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

    def _check_tunable(self, name: str, value) -> None:
        """ConfigError when ``tune`` cannot take ``value`` for ``name``."""
        if name == "max_new_tokens" and int(value) < 1:
            raise ConfigError("max_new_tokens", f"must be >= 1, got {value}")
        if name == "sample_fps" and not float(value) > 0:
            raise ConfigError("sample_fps", f"must be > 0, got {value}")
        if name == "budget_tokens" and not self.policy.settings_class.takes("budget_tokens"):
            raise ConfigError("budget_tokens", f"is not used by policy {self.policy.name}: it keeps no token budget")

    def check_runtime(self, name: str, value) -> None:
        """ConfigError when the running stream cannot take ``value`` for the runtime parameter
        ``name``: what ``tune`` refuses, and a budget that cannot hold one reference frame."""
        self._check_tunable(name, value)
        if name == "budget_tokens":
            check_budget(self.adapter, int(value), reference_unit(self.adapter).tokens_per_unit)

    def budget_in_force(self, budget_tokens: int) -> int:
        """The budget ``budget_tokens`` puts in force on this model: itself, or for 0 the model's own."""
        return resolved_budget_tokens(int(budget_tokens), self.adapter)

    def budget_warning(self, budget_tokens: int) -> str:
        """'' unless ``budget_tokens`` (as given) is far above the model folder's own budget, for a
        policy that keeps one (parameters.py); then a line naming both."""
        if not self.policy.settings_class.takes("budget_tokens"):
            return ""
        return far_above_model_budget(int(budget_tokens), self.adapter)

    def check_yes_no_question(self, question: str) -> None:
        """QuestionError unless ``question`` could be asked by ``when`` or stand in ``watch_questions``:
        not empty, a yes/no question, short enough with its prompt. Touches no memory."""
        limit = self.config.max_question_tokens
        checks.check_question(question, list(YES_NO), limit)
        checks.check_yes_no_question(question)
        checks.check_prompt_length(self.adapter.question_ids(question, list(YES_NO)), limit)

    # -- snapshots ------------------------------------------------------------------------------
    def _identity(self) -> dict:
        return {"model_id": self.adapter.model_id, "config_hash": self.adapter.config_hash,
                "policy": self.policy.name, "policy_config": self.policy.config_dict()}

    def save(self, path: str) -> int:
        """Write the memory to ``path``; returns bytes written. Queued frames are encoded first, once
        the path is known to be writable (a refused save leaves them waiting)."""
        check_writable(path)
        with self._cache_lock:
            self.flush()
            return write_snapshot(path, {**self._identity(), "policy_state": self.policy.state_dict(),
                                         "history": [asdict(x) for x in self.history], **self.ledger.state_dict()})

    def load(self, path: str) -> int:
        """Replace the memory with the snapshot at ``path``; returns frames in memory.

        A snapshot that is not one (truncated, corrupted, another format version), was made with
        another model or policy (or policy parameters), or holds frames of cameras this session does
        not have (``SessionConfig.cameras``, when set) is refused; the memory is then unchanged.
        """
        identity = self._identity()
        state = read_state(path)
        their_budget = budget_apart(state, identity)  # made at another budget: loaded, then brought to ours
        check_identity(path, state, identity if their_budget is None else
                       {**identity, "policy_config": {**identity["policy_config"], "budget_tokens": their_budget}})
        try:  # everything read before anything is replaced
            ledger = UnitLedger.read_state(state)
            history = [Exchange(**x) for x in state["history"]]
        except Exception as err:  # noqa: BLE001 - a file of the right format with the wrong content
            raise SnapshotError(f"snapshot '{path}' has unreadable bookkeeping ({type(err).__name__}: {err})") from None
        held = list(dict.fromkeys(info.camera for info in ledger["units"].values()))
        foreign = [camera for camera in held if camera not in self.config.cameras]
        if self.config.cameras and foreign:
            raise SnapshotError(f"snapshot '{path}' holds frames of camera(s) {', '.join(repr(c) for c in foreign)} "
                                f"that this node does not have (its cameras: "
                                f"{', '.join(repr(c) for c in self.config.cameras)}); the memory is unchanged: "
                                "load it where those cameras are configured")
        with self._cache_lock, self._pending_lock:
            backup = self.policy.state_dict()
            our_budget = identity["policy_config"].get("budget_tokens")
            try:
                if their_budget is not None:
                    self.policy.set_budget(their_budget)
                self.policy.load_state_dict(state["policy_state"])
            except Exception as err:
                self.policy.load_state_dict(backup)
                raise SnapshotError(f"snapshot '{path}' does not fit this cache: {err}") from None
            finally:
                if their_budget is not None:
                    self.policy.set_budget(our_budget)  # the next chunk's compression brings the memory to it
            self.ledger.load_state(ledger)
            self.history = history
            self._pending.clear()
            self.chunks.stopped = ""  # the next chunk finds out whether the loaded memory has room
            return self._counts().frames
