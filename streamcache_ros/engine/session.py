"""The streaming session: frames in (chunked per camera), questions answered from the cache.

    adapter = load_adapter("tiny-qwen2_5_vl")
    session = Session(adapter, make_policy("fifo", budget_tokens=256), SessionConfig(chunk_frames=8))
    session.add_frame(rgb, stamp=12.5, camera="/camera/image_raw")
    answer = session.ask("what is on the table?")

Flow of a chunk: adapter.preprocess -> vision encoder -> one prefill of the chunk's tokens through
the policy's attention (no recompute of the cache) -> the guidance the policy asks for, if any ->
policy.after_chunk (compression, re-index). A question is prefilled and decoded from the cache
(decoding.py), then its tokens are truncated away again, so memory stays bounded and the cache is
what it was. Snapshots on disk: snapshot_io.py. No ROS here.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

from . import failpoints
from .adapters import ModelAdapter, match_option
from .cache import PREFIX_UNIT, SUMMARY_UNIT, CachePolicy, ChunkContext, ChunkOutcome, NewTokens
from .cache.evidence import OFFSET, AttentionMass, retention
from .cache.positions import PositionRangeError
from .decoding import REPLACEMENT_CHARACTER, greedy_decode
from .errors import AnswerError, ChunkError, ConfigError, FrameError, QuestionError, SnapshotError
from .guidance import GuidanceProvider
from .layout import OPTION_LETTERS, ChunkQueue
from .snapshot_io import read_snapshot, write_snapshot
from .status import (Answer, ChunkReport, DeviceMemory, EngineInfo, EvidenceFrame, Exchange, FrameRetention,
                     MemoryCounts, MemoryTimeline, SessionStatus, UnitInfo)
from .turns import TurnLock

# A question longer than this many characters per allowed token cannot fit: refused before the
# tokenizer sees it (a megabyte string must not cost a tokenizer pass).
CHARS_PER_TOKEN_LIMIT = 16


@dataclass
class SessionConfig:
    """Checked here, once; a bad value is a ConfigError naming the node's parameter."""

    chunk_frames: int = 8
    max_question_tokens: int = 512
    max_new_tokens: int = 64
    mc_max_new_tokens: int = 16  # docs/hermes.md §2: multiple choice answers are short
    repetition_penalty: float = 1.0  # the HERMES reference driver uses 1.1 (docs/hermes.md §11)
    # Past exchanges kept (HERMES guidance reads the last one); bounded so a robot asked questions
    # for days does not grow its memory with them
    history_size: int = 32
    # The cameras a question may name (the node's camera_topics); empty: any camera seen so far
    cameras: tuple[str, ...] = ()
    # Evidence (docs/interfaces.md "Time windows and evidence"): the frames an answer names (0: none,
    # and no attention mass is computed), and the layers whose attention defines it (empty: the
    # middle half of the layers, ``default_evidence_layers``)
    evidence_k: int = 3
    evidence_layers: tuple[int, ...] = ()
    # A chunk is prefilled this many tokens at a time at most (0: in one forward), which bounds the
    # decoder's activations (engine/prefill.py; the default: docs/performance.md "Prefill in blocks")
    prefill_block_tokens: int = 128

    def largest_question(self, max_position_embeddings: int) -> int:
        """Positions the largest question and its answer take: max_question_tokens + max_new_tokens,
        at most half the model's range (``ask`` refuses more)."""
        answer = max(self.max_new_tokens, self.mc_max_new_tokens)
        return min(self.max_question_tokens + answer, max_position_embeddings // 2)

    def __post_init__(self):
        for name in ("chunk_frames", "max_question_tokens", "max_new_tokens", "mc_max_new_tokens", "history_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        self.cameras = tuple(self.cameras)
        if int(self.evidence_k) < 0:
            raise ConfigError("evidence_k", f"must be >= 0, got {self.evidence_k}")
        self.evidence_layers = tuple(int(layer) for layer in self.evidence_layers)
        block = self.prefill_block_tokens
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 0:
            raise ConfigError("prefill_block_tokens", f"must be a whole number of tokens >= 0 (0: the whole chunk "
                                                      f"in one forward), got {block!r}")
        self.prefill_block_tokens = int(block)


def default_evidence_layers(num_layers: int) -> tuple[int, ...]:
    """The layers whose attention defines evidence when none are chosen: the middle half, where a
    question's attention to the image is strongest in vision-language models
    (docs/interfaces.md "Which layers"); bench/evidence_layers.py chooses them for a model."""
    first = num_layers // 4
    return tuple(range(first, max(first + 1, (3 * num_layers) // 4)))


def _validate_frame(frame) -> np.ndarray:
    if not isinstance(frame, np.ndarray):
        raise FrameError(f"frame must be a numpy array, got {type(frame).__name__}")
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise FrameError(f"frame must be RGB [H, W, 3], got shape {tuple(frame.shape)}")
    if frame.dtype != np.uint8:
        raise FrameError(f"frame must be uint8, got {frame.dtype}")
    if frame.shape[0] < 1 or frame.shape[1] < 1:
        raise FrameError(f"frame is empty: shape {tuple(frame.shape)}")
    return np.ascontiguousarray(frame)


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, (torch.cuda.OutOfMemoryError, torch.OutOfMemoryError, MemoryError))


def release_device_memory(err: BaseException) -> None:
    """After an out-of-memory error: hand the allocator's cached blocks back, so the next chunk or
    question starts from what the cache really holds."""
    if is_out_of_memory(err):
        torch.cuda.empty_cache()  # a no-op where CUDA was never initialised


def _describe(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    hint = " (out of memory: lower budget_tokens, chunk_frames or the frame size)" if is_out_of_memory(err) else ""
    return f"{type(err).__name__}: {text}{hint}"


def _check_window(since: float | None, until: float | None) -> tuple[float, float] | None:
    """(since, until) with open ends as infinities, or None without a window; QuestionError for a
    window that cannot hold a frame."""
    if since is None and until is None:
        return None
    low, high = (-math.inf if since is None else float(since)), (math.inf if until is None else float(until))
    if math.isnan(low) or math.isnan(high):
        raise QuestionError("since/until must be numbers")
    if low > high:
        raise QuestionError(f"the window is empty: since ({low:.3f}) is after until ({high:.3f})")
    return low, high


def _describe_stamp(stamp: float) -> str:
    return "the start" if stamp == -math.inf else "now" if stamp == math.inf else f"{stamp:.3f}"


def _check_text(what: str, text: str) -> None:
    bad = text.find(REPLACEMENT_CHARACTER)
    if bad >= 0:
        raise QuestionError(f"the {what} is not valid UTF-8 (character {bad} is U+FFFD, what bytes that are "
                            "not UTF-8 become on the way): send UTF-8 text")


class Session:
    """One visual memory over one model; thread-safe (one lock around the model and the cache)."""

    def __init__(self, adapter: ModelAdapter, policy: CachePolicy, config: SessionConfig | None = None):
        self.adapter = adapter
        self.policy = policy
        self.config = config or SessionConfig()
        self.guidance = GuidanceProvider(adapter)  # computes what a policy's guidance_request asks for
        # model + cache: one forward pass at a time; a waiting chunk goes before waiting questions
        self._cache_lock = TurnLock()
        self._pending_lock = threading.Lock()  # frames waiting for their chunk: cheap to take
        self.chunk_attempts = 0  # every chunk started, failed or not (failpoint plans count these)
        self.question_attempts = 0  # every accepted question that reached the model
        # the most questions that ended while a due chunk waited for the model (1: the one in progress)
        self.most_questions_a_chunk_waited_for = 0
        policy.setup(adapter.geometry())
        layers = policy.geometry.num_layers
        self.evidence_layers = self.config.evidence_layers or default_evidence_layers(layers)
        wrong = [layer for layer in self.evidence_layers if not 0 <= layer < layers]
        if wrong:
            raise ConfigError("evidence_layers", f"{wrong} are not layers of this model (0..{layers - 1})")
        # the last answer's attention mass, every measured layer's row (bench/evidence_layers.py reads it)
        self.last_attention_mass: AttentionMass | None = None
        with self._cache_lock:
            self._clear()

    # -- state ----------------------------------------------------------------------------------
    def _clear(self) -> None:
        self._pending: ChunkQueue[tuple[np.ndarray, float]] = ChunkQueue(self.config.chunk_frames)
        self.units: dict[int, UnitInfo] = {}
        self.history: list[Exchange] = []
        self.cameras: list[str] = []
        self._next_unit = 0
        self._next_chunk = 0
        self.chunks_encoded = 0
        self.chunks_failed = 0
        self.chunks_failed_in_a_row = 0
        self.last_chunk_error = ""
        self.ingest_stopped = ""
        self.questions_answered = 0
        self.last_chunk: ChunkReport | None = None
        self.last_ttft_ms = 0.0
        self.policy.reset()
        ids = self.adapter.prefix_ids
        self.policy.ensure_room(len(ids))
        self.adapter.forward(self.adapter.embed_text(ids), self.adapter.text_tokens(len(ids), PREFIX_UNIT),
                             self.policy)

    def reset(self) -> int:
        """Forget every frame and the question history; returns the frames forgotten."""
        with self._cache_lock, self._pending_lock:
            forgotten = self._memory().frames
            self._clear()
            return forgotten

    # -- frames ---------------------------------------------------------------------------------
    def add_frame(self, frame: np.ndarray, stamp: float, camera: str = "") -> ChunkReport | None:
        """Queue one RGB uint8 frame [H, W, 3]; encodes a chunk when ``chunk_frames`` are queued.

        Raises FrameError (nothing queued) or ChunkError (the chunk was dropped, memory unchanged).
        """
        frame = _validate_frame(frame)
        with self._pending_lock:
            batch = self._pending.push(camera, (frame, float(stamp)))
            if camera not in self.cameras:
                self.cameras.append(camera)
            if batch is None:
                return None
        questions_before = self._cache_lock.questions_done
        with self._cache_lock:
            waited = self._cache_lock.questions_done - questions_before
            self.most_questions_a_chunk_waited_for = max(self.most_questions_a_chunk_waited_for, waited)
            return self._encode_chunk(camera, batch)

    def flush(self) -> list[ChunkReport]:
        """Encode every camera's queued frames now (a partial chunk)."""
        reports = []
        with self._cache_lock:
            with self._pending_lock:
                batches = self._pending.flush()
            for camera, batch in batches:
                reports.append(self._encode_chunk(camera, batch))
        return reports

    def pending_frames(self) -> int:
        with self._pending_lock:
            return len(self._pending)

    def _encode_chunk(self, camera: str, batch: list[tuple[np.ndarray, float]]) -> ChunkReport:
        """Encode, prefill and compress one chunk. A fault while encoding or prefilling drops the
        chunk: the cache is truncated to its mark from before the chunk. A fault while compressing
        (after_chunk) keeps the chunk: every token is already in place, and a policy replaces its
        storage layer by layer, so what it holds is consistent; the next chunk compresses again."""
        adapter, policy = self.adapter, self.policy
        self.chunk_attempts += 1
        attempt = self.chunk_attempts
        mark = policy.mark()
        chunk_id = self._next_chunk
        source = f"chunk of {len(batch)} frame(s) from '{camera or 'default'}'"
        try:
            t0 = time.perf_counter()
            inputs = adapter.preprocess([frame for frame, _ in batch])
            rel = adapter.chunk_rel_positions(inputs)
            # before the encoder runs: a chunk the position range cannot take costs no more
            policy.ensure_room(int(rel.max().item()) + 1 + self._question_room())
            mark = policy.mark()  # ensure_room may re-index; it never changes lengths
            failpoints.hit("encode", chunk=attempt)
            embeds = adapter.encode(inputs)
            t1 = time.perf_counter()
            unit_ids = torch.arange(self._next_unit, self._next_unit + inputs.num_units)
            chunk = NewTokens(rel, unit_ids.repeat_interleave(inputs.tokens_per_unit),
                              torch.full((rel.shape[1],), chunk_id, dtype=torch.long))
            self._prefill(embeds, chunk, inputs.tokens_per_unit, attempt)
            t2 = time.perf_counter()
        except PositionRangeError as err:
            policy.truncate(mark)
            raise self._range_full(source, err) from err
        except Exception as err:
            policy.truncate(mark)
            message = f"{source} dropped: {_describe(err)}"
            self._chunk_failed(message)
            release_device_memory(err)
            raise ChunkError(message, out_of_memory=is_out_of_memory(err)) from err
        unit_frames = {int(u): tuple(f) for u, f in zip(unit_ids, inputs.unit_frames)}
        compress_error = None
        try:
            failpoints.hit("compress", chunk=attempt)
            outcome = policy.after_chunk(ChunkContext(chunk_id, guidance=self._guidance(), unit_frames=unit_frames))
        except Exception as err:  # noqa: BLE001 - raised below, once the chunk is booked
            compress_error, outcome = err, ChunkOutcome()
            release_device_memory(err)
        t3 = time.perf_counter()
        for unit, frames in zip(unit_ids.tolist(), inputs.unit_frames):
            self.units[unit] = UnitInfo(tuple(batch[i][1] for i in frames), camera, chunk_id, inputs.tokens_per_unit)
        self._next_unit += inputs.num_units
        self._next_chunk += 1
        self.chunks_encoded += 1
        # the units that left the cache: the outcome lists them; after a failed compression the
        # cache says what it still holds
        self._forget(outcome.evicted_units if compress_error is None else None)
        self.last_chunk = ChunkReport(chunk_id, camera, len(batch), inputs.num_units, int(rel.shape[1]),
                                      (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, outcome,
                                      _describe(compress_error) if compress_error else "")
        if compress_error is not None:
            message = (f"{source}: compressing failed ({_describe(compress_error)}); its frames are kept, "
                       "over budget until the next chunk is compressed")
            self._chunk_failed(message)
            raise ChunkError(message, kept=True, out_of_memory=is_out_of_memory(compress_error)) from compress_error
        self.chunks_failed_in_a_row = 0
        self.ingest_stopped = ""
        return self.last_chunk

    def _question_room(self) -> int:
        """Positions a chunk must leave free in the model's range. A policy that can free none
        (nothing bounds what it keeps: ``full``) keeps room for the largest question, so questions
        are still answered once the range is full; a bounded one re-indexes for a question instead
        (the factory checked that its budget, a chunk and a question fit, docs/architecture.md)."""
        if self.policy.bounding_setting:
            return 0
        return self.config.largest_question(self.policy.geometry.max_position_embeddings)

    def _range_full(self, source: str, err: PositionRangeError) -> ChunkError:
        """A chunk the position range cannot take: refused, memory unchanged; the status says so
        (an ERROR memory diagnostic) until a chunk is taken in again."""
        policy = self.policy
        advice = (f"policy '{policy.name}' keeps every token, so no more frames fit: use a bounded policy (fifo, "
                  "uniform or hermes with budget_tokens, or h2svc) to keep streaming"
                  if not policy.bounding_setting else f"lower {policy.bounding_setting}")
        message = (f"{source} not taken in: the memory has reached the model's position range "
                   f"(max_position_embeddings {err.limit}); questions are answered from the "
                   f"{self._memory().frames} frame(s) held; {advice}")
        self._chunk_failed(message)
        self.ingest_stopped = message
        return ChunkError(message, position_range=True)

    def _prefill(self, embeds: torch.Tensor, chunk: NewTokens, tokens_per_unit: int, attempt: int) -> None:
        """The chunk's tokens through the decoder over the cache in blocks of at most
        ``prefill_block_tokens``, after_prefill after the chunk, or after each unit for a policy
        that evicts between units (engine/prefill.py)."""
        from .prefill import prefill_chunk  # noqa: PLC0415

        hook = failpoints.layer_hook("prefill", chunk=attempt, layers=self.policy.geometry.num_layers)
        prefill_chunk(self.adapter, self.policy, embeds, chunk, tokens_per_unit, self.config.prefill_block_tokens, hook)

    def _guidance(self):
        """The guidance q/k the policy asks for before compressing (None: it asks for none)."""
        if not self.policy.needs_guidance:
            return None
        request = self.policy.guidance_request(list(self.history))
        return self.guidance.compute(request, self.policy) if request is not None else None

    def _chunk_failed(self, message: str) -> None:
        self.chunks_failed += 1
        self.chunks_failed_in_a_row += 1
        self.last_chunk_error = message

    def _forget(self, evicted: list[int] | None) -> None:
        """Drop the bookkeeping of units no longer in the cache (``None``: ask the cache)."""
        if evicted is None:
            held = set(self.policy.stats().units)
            evicted = [u for u in self.units if u not in held]
        for unit in evicted:
            self.units.pop(unit, None)

    # -- questions ------------------------------------------------------------------------------
    def _check_question(self, question: str, options: list[str], camera: str, max_new_tokens: int) -> list[int]:
        """The question's token ids with its prompt; QuestionError for anything that cannot be asked
        (checked before the question touches the cache)."""
        if not isinstance(question, str) or not question.strip():
            raise QuestionError("the question is empty")
        limit = self.config.max_question_tokens
        if len(question) > CHARS_PER_TOKEN_LIMIT * limit:
            raise QuestionError(f"the question is {len(question)} characters; at most {CHARS_PER_TOKEN_LIMIT * limit} "
                                f"(max_question_tokens {limit})")
        _check_text("question", question)
        if max_new_tokens < 0:
            raise QuestionError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if len(options) > len(OPTION_LETTERS):
            raise QuestionError(f"at most {len(OPTION_LETTERS)} options (A-Z), got {len(options)}")
        for i, option in enumerate(options):
            if not option.strip():
                raise QuestionError(f"option {i} ({OPTION_LETTERS[i]}) is empty")
            _check_text(f"option {i} ({OPTION_LETTERS[i]})", option)
        _check_text("camera name", camera)
        if camera and self.config.cameras and camera not in self.config.cameras:
            raise QuestionError(f"unknown camera '{camera}' (camera_topics: {', '.join(self.config.cameras)})")
        ids = self.adapter.question_ids(question, options)
        if len(ids) > limit:
            raise QuestionError(f"the question is {len(ids)} tokens with its prompt; the limit is {limit} "
                                "(max_question_tokens)")
        return ids

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
        ids = self._check_question(question, options, camera, max_new_tokens)
        window = _check_window(since, until)
        evidence_k = self.config.evidence_k if evidence_k is None else int(evidence_k)
        if evidence_k < 0:
            raise QuestionError(f"evidence_k must be >= 0, got {evidence_k}")
        policy = self.policy
        budget = max_new_tokens or (self.config.mc_max_new_tokens if options else self.config.max_new_tokens)
        # a question and its answer take positions after the cache: they must fit the model's range
        # with room to spare, or answering would have to re-index the memory
        room = policy.geometry.max_position_embeddings // 2
        if len(ids) + budget > room:
            raise QuestionError(f"max_new_tokens {budget} is too many: the question ({len(ids)} tokens) and its "
                                f"answer must fit in half the model's position range ({room} tokens)")
        with self._cache_lock.question():
            if camera and camera not in self.cameras:
                if self.config.cameras:
                    raise QuestionError(f"no frames from camera '{camera}' yet")
                known = ", ".join(c or "''" for c in self.cameras) or "none yet"
                raise QuestionError(f"unknown camera '{camera}' (cameras seen: {known})")
            try:
                self.flush()
            except ChunkError as err:
                if not err.position_range:  # a full memory still answers from what it holds
                    raise
            if not self.units:
                raise QuestionError("no frames in memory yet: wait for the camera stream, then ask again")
            key_filter, visible = None, list(self.units)
            if camera:
                visible = [u for u, info in self.units.items() if info.camera == camera]
                if not visible:
                    raise QuestionError(f"no frames from camera '{camera}' in memory")
                key_filter = torch.tensor(visible + [SUMMARY_UNIT], dtype=torch.long)
            if window is not None:
                visible = self._window_units(visible, window, camera)
                # a window hides the summary tokens too: they fold frames of any time together
                key_filter = torch.tensor(visible, dtype=torch.long)
            try:
                policy.ensure_room(len(ids) + budget)
            except PositionRangeError as err:
                raise QuestionError(f"the question ({len(ids)} tokens) and its answer (max_new_tokens {budget}) do "
                                    f"not fit in the positions left: {err}") from None
            held = self._memory(visible, window=window)
            probe = AttentionMass(self.evidence_layers, policy.geometry.num_layers, self._next_unit,
                                  policy.geometry.device) if evidence_k else None
            decoded = self._decode(ids, budget, started, key_filter, probe, on_text, should_stop)
            evidence, summary_share = self.rank_evidence(probe, visible, window, evidence_k) if probe else ([], 0.0)
            self.last_attention_mass = probe
            text = self.adapter.decode(decoded.tokens)
            self.history.append(Exchange(question, text, options))
            del self.history[:-self.config.history_size]
            self.questions_answered += 1
            self.last_ttft_ms = decoded.ttft_ms
        return Answer(text=text.strip(), option_index=match_option(text, options), answer_tokens=len(decoded.tokens),
                      ttft_ms=decoded.ttft_ms, total_ms=(time.perf_counter() - started) * 1e3,
                      frames_in_memory=held.frames, oldest_stamp=held.oldest_stamp, newest_stamp=held.newest_stamp,
                      kv_tokens=held.kv_tokens, cancelled=decoded.cancelled, evidence=evidence,
                      evidence_summary_share=summary_share)

    def _decode(self, ids: list[int], budget: int, started: float, key_filter: torch.Tensor | None,
                probe: AttentionMass | None, on_text, should_stop):
        """The question prefilled and its answer decoded over the cache, ``probe`` (evidence) lent to
        the policy meanwhile; the question's tokens are removed again, whatever happens."""
        policy = self.policy
        mark = policy.mark()
        self.question_attempts += 1
        hook = failpoints.layer_hook("question", question=self.question_attempts, layers=policy.geometry.num_layers)
        try:
            policy.probe = probe
            return greedy_decode(self.adapter, policy, ids, budget, started, key_filter, on_text, should_stop,
                                 self.config.repetition_penalty, hook)
        except Exception as err:
            release_device_memory(err)
            raise AnswerError(f"answering failed: {_describe(err)}; the memory is unchanged") from err
        finally:
            policy.probe = None
            policy.truncate(mark)

    # -- time -------------------------------------------------------------------------------------
    def _window_units(self, units: list[int], window: tuple[float, float], camera: str) -> list[int]:
        """The units with a frame stamped inside ``window``; QuestionError when there is none."""
        inside = [u for u in units if any(window[0] <= s <= window[1] for s in self.units[u].stamps)]
        if not inside:
            stamps = self._stamps(units)
            source = f" from camera '{camera}'" if camera else ""
            raise QuestionError(f"no frames{source} in memory between {_describe_stamp(window[0])} and "
                                f"{_describe_stamp(window[1])} (the memory holds frames stamped {min(stamps, default=0.0):.3f} to "
                                f"{max(stamps, default=0.0):.3f}): widen since/until")
        return inside

    def _stamps(self, units: list[int], window: tuple[float, float] | None = None) -> list[float]:
        """Stamps of the frames of ``units`` (inside ``window`` when given)."""
        low, high = window or (-math.inf, math.inf)
        return [s for u in units for s in self.units[u].stamps if low <= s <= high]

    def rank_evidence(self, probe: AttentionMass, units: list[int] | None = None,
                      window: tuple[float, float] | None = None, k: int = 3,
                      layers: list[int] | None = None) -> tuple[list[EvidenceFrame], float]:
        """The ``k`` frames of ``units`` (default: all in memory) with the most attention mass over
        ``layers`` (default: the measured ones), and the summary tokens' share. A unit's mass is
        shared equally by its frames (inside the window, when one is given); ties go to the newer."""
        units = list(self.units) if units is None else units
        totals = probe.totals(layers).tolist()
        frames = []
        for unit in units:
            info = self.units[unit]
            stamps = self._stamps([unit], window)
            frames += [(stamp, info.camera, totals[unit + OFFSET] / len(stamps)) for stamp in stamps]
        frame_mass = sum(mass for *_, mass in frames)
        summary = totals[SUMMARY_UNIT + OFFSET]
        share = summary / (frame_mass + summary) if frame_mass + summary > 0 else 0.0
        ranked = sorted((f for f in frames if f[2] > 0), key=lambda f: (-f[2], -f[0]))[:k]
        return [EvidenceFrame(stamp, camera, mass / frame_mass) for stamp, camera, mass in ranked], share

    def memory_timeline(self, camera: str = "") -> MemoryTimeline:
        """Every frame still in memory (of ``camera`` when given), oldest first, with the share of its
        tokens each layer (and each H2SVC bank) still holds (docs/interfaces.md "The memory timeline")."""
        if camera and camera not in self.cameras and camera not in self.config.cameras:
            raise QuestionError(f"unknown camera '{camera}'")
        with self._cache_lock:
            size = self._next_unit
            layer_tokens, layer_rows, bank_tokens, bank_rows = retention(self.policy.layer_stores(), size)
            banks = sorted(bank_tokens)
            names = list(self.policy.stats().extra.get("bank_names", []))
            frames = []
            for unit in sorted(self.units, key=lambda u: (min(self.units[u].stamps), u)):
                info = self.units[unit]
                if camera and info.camera != camera:
                    continue
                per_row = info.tokens or int((layer_tokens[:, unit] / layer_rows.clamp(min=1)).max().ceil())
                if per_row == 0:
                    continue
                layer_kept = (layer_tokens[:, unit] / (per_row * layer_rows.clamp(min=1))).tolist()
                bank_kept = [float(bank_tokens[b][unit]) / (per_row * bank_rows[b]) for b in banks]
                frames += [FrameRetention(stamp, info.camera, unit, layer_kept, bank_kept) for stamp in info.stamps]
            return MemoryTimeline(self.policy.name, len(layer_rows), [names[b] if b < len(names) else str(b)
                                                                      for b in banks], frames)

    # -- status ---------------------------------------------------------------------------------
    def _memory(self, units=None, held=None, window: tuple[float, float] | None = None) -> MemoryCounts:
        """What ``units`` (default: all) hold now, as MemoryCounts defines it: a unit's frames count
        when some layer (H2SVC: some KV head) still holds at least half of the unit's tokens, so a
        HERMES frame reduced to a token or two in a few layers is not "in memory". With a time
        ``window`` (a question's since/until), only its frames count, and the summary tokens, which
        the window hides, are not among the tokens attended over."""
        held = held or self.policy.unit_tokens()
        units = set(self.units if units is None else units)
        column = {u: i for i, u in enumerate(held.units.tolist())}
        most = held.counts.max(dim=0).values.tolist() if held.counts.numel() else []
        counted = [u for u in units if u in column and 2 * most[column[u]] >= (self.units[u].tokens or most[column[u]])]
        stamps = self._stamps(counted, window)
        outside = [column[u] for u in column if u not in units]  # frames a question limited to ``units`` skips
        skipped = int(held.counts[:, outside].sum()) if outside else 0
        if window is not None:
            skipped += held.summary
        kv_tokens = self.policy.stats().kv_tokens - round(skipped / held.rows_per_layer)
        return MemoryCounts(len(stamps), min(stamps, default=0.0), max(stamps, default=0.0), kv_tokens)

    def _camera_memory(self) -> dict[str, MemoryCounts]:
        held = self.policy.unit_tokens()
        return {camera: self._memory([u for u, info in self.units.items() if info.camera == camera], held)
                for camera in self.cameras}

    def info(self) -> EngineInfo:
        adapter = self.adapter
        return EngineInfo(model_id=adapter.model_id, model_family=adapter.family, device=str(adapter.device),
                          dtype=str(adapter.dtype).replace("torch.", ""), policy=self.policy.name,
                          chunk_frames=self.config.chunk_frames, prefix_tokens=len(adapter.prefix_ids),
                          max_question_tokens=self.config.max_question_tokens)

    def status(self) -> SessionStatus:
        with self._cache_lock:
            held = self._memory()
            return SessionStatus(
                policy=self.policy.name, model_id=self.adapter.model_id,
                frames_in_memory=held.frames, oldest_stamp=held.oldest_stamp, newest_stamp=held.newest_stamp,
                cache=self.policy.stats(), prefix_tokens=len(self.adapter.prefix_ids),
                device_memory=DeviceMemory.of(self.adapter.device), last_chunk=self.last_chunk,
                chunks_encoded=self.chunks_encoded, chunks_failed=self.chunks_failed,
                chunks_failed_in_a_row=self.chunks_failed_in_a_row, last_chunk_error=self.last_chunk_error,
                ingest_stopped=self.ingest_stopped,
                questions_answered=self.questions_answered, pending_frames=self.pending_frames(),
                last_ttft_ms=self.last_ttft_ms, cameras=list(self.cameras),
                most_questions_a_chunk_waited_for=self.most_questions_a_chunk_waited_for,
                camera_memory=self._camera_memory())

    # -- runtime tuning -------------------------------------------------------------------------
    def tune(self, max_new_tokens: int | None = None, sample_fps: float | None = None,
             budget_tokens: int | None = None) -> None:
        """Change what may change while the stream runs (docs/interfaces.md, "Changing parameters at
        runtime"); a ConfigError changes nothing. ``sample_fps``: the frames waiting for their chunk
        are encoded first, at the old rate (a partial chunk), so that every chunk's time stride
        (Qwen2.5-VL's M-RoPE t) matches its own frames' spacing. ``budget_tokens``: the next chunk's
        compression brings the cache to it."""
        if max_new_tokens is not None and int(max_new_tokens) < 1:
            raise ConfigError("max_new_tokens", f"must be >= 1, got {max_new_tokens}")
        if sample_fps is not None and not float(sample_fps) > 0:
            raise ConfigError("sample_fps", f"must be > 0, got {sample_fps}")
        if budget_tokens is not None and not self.policy.settings_class.takes("budget_tokens"):
            raise ConfigError("budget_tokens", f"is not used by policy {self.policy.name}: it keeps no token budget")
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

    # -- snapshots ------------------------------------------------------------------------------
    def _identity(self) -> dict:
        return {"model_id": self.adapter.model_id, "config_hash": self.adapter.config_hash,
                "policy": self.policy.name, "policy_config": self.policy.config_dict()}

    def save(self, path: str) -> int:
        """Write the memory to ``path``; returns bytes written. Queued frames are encoded first."""
        with self._cache_lock:
            self.flush()
            return write_snapshot(path, {
                **self._identity(), "policy_state": self.policy.state_dict(),
                "units": {u: asdict(info) for u, info in self.units.items()},
                "history": [asdict(x) for x in self.history], "cameras": list(self.cameras),
                "next_unit": self._next_unit, "next_chunk": self._next_chunk})

    def load(self, path: str) -> int:
        """Replace the memory with the snapshot at ``path``; returns frames in memory.

        A snapshot that is not one (truncated, corrupted, another format version) or was made with
        another model or policy (or policy parameters) is refused; the memory is then unchanged.
        """
        state = read_snapshot(path, self._identity())
        try:  # everything read before anything is replaced
            units = {int(u): UnitInfo(tuple(float(t) for t in i["stamps"]), str(i["camera"]), int(i["chunk"]),
                                      int(i.get("tokens", 0))) for u, i in state["units"].items()}
            history = [Exchange(**x) for x in state["history"]]
            cameras = [str(c) for c in state["cameras"]]
            next_unit, next_chunk = int(state["next_unit"]), int(state["next_chunk"])
        except Exception as err:  # noqa: BLE001 - a file of the right format with the wrong content
            raise SnapshotError(f"snapshot '{path}' has unreadable bookkeeping ({type(err).__name__}: {err})") from None
        with self._cache_lock, self._pending_lock:
            backup = self.policy.state_dict()
            try:
                self.policy.load_state_dict(state["policy_state"])
            except Exception as err:
                self.policy.load_state_dict(backup)
                raise SnapshotError(f"snapshot '{path}' does not fit this cache: {err}") from None
            self.units, self.history, self.cameras = units, history, cameras
            self._next_unit, self._next_chunk = next_unit, next_chunk
            self._pending.clear()
            self.ingest_stopped = ""  # the next chunk finds out whether the loaded memory has room
            return self._memory().frames
