"""The memory tier: what a question reads, the working memory or a replay of archived chunks, and
how far back its answer reaches.

    tier = MemoryTier(adapter, policy, ledger, make_scratch)
    tier.attach(archive, key_layers)                  # from now on every chunk also goes to the archive
    tier.keep(encoded, key, chunk_id)                 # ingest hands each chunk over as it is booked
    replay = tier.plan_ask(ids, camera, window, clock)   # None: the working memory answers
    answer = replay.session.ask(...)                  # a short stream of the recalled chunks
    since, evicted = tier.reach(camera, window, held, archive_read=True)

The working memory answers a question whose window it holds whole. One reaching older frames (or
with no window, when older frames lie in the archive, or when the working memory holds nothing of
its camera) is answered over a *replay*: the chunks the archive plans for it (archive/plan.py),
prefilled again in time order into a scratch memory (``make_scratch``: a full cache, the start of a
short stream), then dropped; the GPU working memory is left as it was (docs/archive.md "Recall").
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Protocol

import numpy as np
import torch

from ..adapters.models import RETRIEVAL_DIR, is_world_model
from ..cache import CachePolicy
from ..cache.evidence import retention
from ..memory.ledger import UnitLedger, Window
from ..places import PoseTrack
from ..errors import QuestionError
from ..status import Hole, IndexStatus, MemoryCounts, MemoryTimeline
from .archive import Archive, ArchivedChunk, EncodedChunk, question_vector
from .archive.thumbnails import decode as decode_jpeg
from .archive.thumbnails import encode_all as encode_thumbnails
from .archive.thumbnails import encode_at
from .index import FrameScores, RetrievalEncoder, best_by_chunk
from .index.calibration import CALIBRATION_FILE
from .late_poses import LatePoses

log = logging.getLogger("streamcache_ros.archive")
# standing answers are noted for the newest chunks only: older ones have left the ledger's window
WATCHED_CHUNKS = 64
# archive_content auto: a chunk whose fp16 embeddings take at least this much a frame is kept as frames
# (a 3B or 7B model's 0.5-1 MB a frame; the bundled world models' 1-2 kB stay embeddings)
FRAMES_FROM_BYTES = 128 << 10
# what each kind of hole means, in a refusal (docs/archive.md "Holes")
HOLE_REASONS = {"bound": "its frames were dropped by archive_max_bytes", "disk": "its frames were never written: the "
                "disk was full or failing", "down": "the node was down"}


class ScratchMemory(Protocol):
    """A memory a replay is prefilled into (the Session over a full cache is one)."""

    def take_in(self, chunk: EncodedChunk) -> Any: ...


class Replay:
    """A short replay of archived chunks. Planned under the turn lock (which chunks: cheap), prefilled
    when ``session`` is first read, off the lock: the working memory and the cameras go on meanwhile
    (docs/archive.md "Questions never stop the cameras")."""

    def __init__(self, chunks: list[ArchivedChunk], recalled: int, left_out: int = 0,
                 prefill: Callable[[list[ArchivedChunk]], tuple[Any, list, list]] | None = None):
        self.chunks = chunks
        self.recalled = recalled  # of them, the chunks brought back for their relevance to the question
        self.left_out = left_out  # the window's archived chunks the replay could not hold (read nowhere)
        self.gone: list[ArchivedChunk] = []  # planned, then dropped by the bound before they were read
        self._prefill, self._session = prefill, None

    @property
    def session(self):
        """The scratch memory over the replayed chunks alone; questions are asked of it. The chunks
        are read as the archive holds them then: a part made whole meanwhile is read as the whole,
        a chunk dropped by the bound meanwhile is left out, counted in ``left_out`` (``gone``); a
        QuestionError when every one is gone."""
        if self._session is None:
            self._session, self.chunks, self.gone = self._prefill(self.chunks)
            self.left_out += len(self.gone)
        return self._session


class MemoryTier:
    def __init__(self, adapter, policy: CachePolicy, ledger: UnitLedger, make_scratch: Callable[[], ScratchMemory]):
        self.adapter, self.policy, self.ledger = adapter, policy, ledger
        self.make_scratch = make_scratch
        self.archive: Archive | None = None
        self.encoder: RetrievalEncoder | None = None  # the index's dual encoder (None: no index)
        self.key_layers: tuple[int, ...] = ()
        self.archive_ids: dict[int, int] = {}  # the ledger's chunk id -> the archive's, for standing answers
        # a question's partial chunks, per camera, until they add up to a whole one (``keep``)
        self.parts: dict[str, tuple[list, list[int], list[int]]] = {}
        self.chunk_frames = 0  # 0: parts stay as they are
        self.encode_whole = None  # (camera, frames) -> EncodedChunk: the vision encoder alone
        self.poses: PoseTrack | None = None  # where the robot was: each archived frame's pose (docs/places.md)
        self.saved_poses: dict = {}  # (camera, stamp) -> Pose: a loaded memory snapshot's
        self.late_poses = LatePoses()
        self.incomplete_answers = 0  # answers that could not read every part of their window (the desk counts)

    # -- the archive ------------------------------------------------------------------------------
    def attach(self, archive: Archive, key_layers: tuple[int, ...], encoder: RetrievalEncoder | None = None) -> None:
        """Every chunk kept from now on goes to ``archive``, with its key and frame vectors (docs/archive.md)."""
        if encoder is not None and encoder.calibration is None:  # how far its answers can be trusted
            encoder.calibrate(RETRIEVAL_DIR / CALIBRATION_FILE, shape_world=is_world_model(self.adapter.model_id))
        self.archive, self.key_layers, self.encoder = archive, tuple(key_layers), encoder
        self.archive_ids.clear()
        self.parts.clear()
        if encoder is not None:
            archive.use_index(encoder.identity)

    def index_status(self) -> IndexStatus | None:
        """The index in use, how far it is trusted, and the answers it left incomplete; None without one."""
        encoder = self.encoder
        if self.archive is None or encoder is None:
            return None
        calibration = encoder.calibration
        return IndexStatus(encoder.identity, encoder.trusted, encoder.describe(),
                           calibration.recall if calibration else 0.0, calibration.false_yes if calibration else 0.0,
                           self.incomplete_answers)

    def index_frames(self, frames: list) -> np.ndarray | None:
        """The index's vectors of a chunk's frames (ingest calls it); None without an index."""
        return None if self.archive is None or self.encoder is None else self.encoder.embed_frames(frames)

    def thumbnail_frames(self, frames: list) -> list[bytes] | None:
        """A JPEG of each of a chunk's frames for the archive; None without one, or thumbnails off (docs/show.md)."""
        if self.archive is None:
            return None
        return encode_thumbnails(frames, self.archive.settings.thumbnail_px)

    def detach(self) -> Archive | None:
        if self.archive is not None and self.poses is not None:  # the last poses late for their chunks
            self.late_poses.retry(self.archive, self.poses)
        archive, self.archive = self.archive, None
        self.archive_ids.clear()
        return archive

    def make_whole(self, chunk_frames: int, encode_whole) -> None:
        """A question's partial chunks, archived as they come, are replaced by one made again from their
        frames once they add up to ``chunk_frames`` (docs/archive.md "Questions never stop the cameras")."""
        self.chunk_frames, self.encode_whole = int(chunk_frames), encode_whole

    def keep(self, chunk: EncodedChunk, key, chunk_id: int, frames=None) -> None:
        """A chunk just booked into the working memory, into the archive (with its frames, when at hand)."""
        if self.archive is None:
            return
        kept = self._as_kept(chunk, frames)
        archived = self.archive.add(kept, key)
        if archived is None:  # the disk refused it: counted and named as a hole (archive/write_failures.py)
            return
        if self.poses is not None:  # a pose that came after its frames' chunk was written (late_poses.py)
            self.late_poses.note(archived, kept)
            self.late_poses.retry(self.archive, self.poses)
        self.archive_ids[chunk_id] = archived
        parts = self.parts.get(chunk.camera)
        whole = len(chunk.stamps) >= self.chunk_frames
        if frames is not None and self.encode_whole is not None and (parts or not whole):
            parts = self.parts.setdefault(chunk.camera, ([], [], []))
            parts[0].extend(frames)
            parts[1].append(self.archive_ids[chunk_id])
            parts[2].append(chunk_id)
            if len(parts[0]) >= self.chunk_frames:
                del self.parts[chunk.camera]
                try:
                    whole_chunk = self._as_kept(self.encode_whole(chunk.camera, parts[0]), parts[0])
                    merged = self.archive.replace(parts[1], whole_chunk, key)
                except Exception as err:  # noqa: BLE001 - the parts are on disk already: they stay as they are
                    log.warning("archive: the parts of a chunk (%d frames) stay apart: %s", len(parts[0]), err)
                    return
                for part in parts[2]:
                    self.archive_ids[part] = merged
        for old in [c for c in self.archive_ids if c < chunk_id - WATCHED_CHUNKS]:
            del self.archive_ids[old]

    def _as_kept(self, chunk: EncodedChunk, frames) -> EncodedChunk:
        """``chunk`` as the archive keeps it: as it is, or with archive_content frames (and its frames
        at hand) its frames' JPEGs at the model's input size in place of its embeddings."""
        if self.poses is not None and self.poses.catch_up(max(chunk.stamps)) is not None:
            chunk = dataclasses.replace(chunk, poses=self.poses.for_frames(chunk.stamps, chunk.camera),
                                        pose_frame=self.poses.frame_id)
        content = self.archive.settings.content
        if content == "embeddings" or not frames or len(frames) != len(chunk.stamps) or chunk.needs_encoding:
            return chunk
        if content == "auto" and chunk.embeds.numel() * 2 < FRAMES_FROM_BYTES * len(chunk.stamps):
            return chunk  # a small model's embeddings take less than its frames' JPEGs
        height, width = self.adapter.input_size(*frames[0][0].shape[:2])
        return dataclasses.replace(chunk, embeds=None, rel_positions=None,
                                   frames=[encode_at(frame, height, width) for frame, _ in frames])

    def note_watch(self, chunk_id: int, answers: dict[str, float]) -> None:
        if self.archive is not None and chunk_id in self.archive_ids:
            self.archive.note_watch(self.archive_ids[chunk_id], answers)

    def clear(self) -> int:
        """Forget the archive's chunks too (its owner clears the working memory); the chunks deleted."""
        deleted = self.archive.clear() if self.archive is not None else 0
        self.archive_ids.clear()
        self.parts.clear()
        self.late_poses.clear()
        return deleted

    # -- the working memory -----------------------------------------------------------------------
    def counts(self, units=None, window: Window | None = None) -> MemoryCounts:
        return self.ledger.counts(self.policy.unit_tokens(), self.policy.stats().kv_tokens, units, window)

    def sees(self, camera: str, window: Window | None) -> bool:
        """Whether the working memory holds a frame a question about ``camera`` over ``window`` sees."""
        try:
            self.ledger.visible(camera, window)
        except QuestionError:
            return False
        return True

    def seen_counts(self, camera: str, window: Window | None) -> MemoryCounts | None:
        """What the working memory holds of ``window`` for ``camera``; None when nothing."""
        return self.counts(self.ledger.visible(camera, window).units, window) if self.sees(camera, window) else None

    def whole_since(self, camera: str = "") -> float:
        """The oldest stamp from which the working memory holds every token of every frame of
        ``camera`` (all cameras when empty) up to now; +inf when not even the newest is whole."""
        ledger, held = self.ledger, self.policy.unit_tokens()
        column = {u: i for i, u in enumerate(held.units.tolist())}
        fewest = held.counts.min(dim=0).values.tolist() if held.counts.numel() else []
        units = sorted((u for u, info in ledger.units.items() if not camera or info.camera == camera), reverse=True)
        since, previous = math.inf, None
        for unit in units:
            info = ledger.units[unit]
            whole = unit in column and fewest[column[unit]] >= max(info.tokens, 1)
            if not whole or (previous is not None and unit != previous - 1 and not camera):
                break
            since, previous = min(since, min(info.stamps)), unit
        return since

    def timeline(self, camera: str, bank_names: list[str]) -> MemoryTimeline:
        """Every frame in the working memory (of ``camera``), oldest first, the share of it each layer
        (and H2SVC bank) holds, and its pose."""
        layer_tokens, layer_rows, bank_tokens, bank_rows = retention(self.policy.layer_stores(), self.ledger.next_unit)
        frames = self.ledger.timeline(layer_tokens, layer_rows, bank_tokens, bank_rows, camera)
        poses = self.poses_of([f.stamp for f in frames], [f.camera for f in frames])
        frames = [dataclasses.replace(f, pose=pose) for f, pose in zip(frames, poses)]
        banks = [bank_names[b] if b < len(bank_names) else str(b) for b in sorted(bank_tokens)]
        return MemoryTimeline(self.policy.name, len(layer_rows), banks, frames, self.holes_in(camera, None))

    def poses_of(self, stamps: list[float], cameras: list[str]) -> list:
        """Each frame's pose: the archive's, a loaded snapshot's, else the pose source's now (docs/places.md)."""
        if self.poses is not None and self.archive is not None:  # a pose late for its chunk is written first
            self.late_poses.retry(self.archive, self.poses)
        found = self.archive.poses_at(stamps, cameras) if self.archive is not None and stamps else [None] * len(stamps)
        found = [p or self.saved_poses.get((c, round(s, 4))) for p, s, c in zip(found, stamps, cameras)]
        if self.poses is not None:
            found = [pose if pose is not None else self.poses.at(stamp) for pose, stamp in zip(found, stamps)]
        return found

    # -- planning a question -----------------------------------------------------------------------
    def plan_ask(self, ids: list[int], camera: str, window: Window | None, clock: int | None,
                 question: str = "", about_now: bool = False, about_first: bool = False) -> Replay | None:
        """The replay a question needs, or None when the working memory answers it. With no window,
        what it reads is chosen by what it asks (docs/archive.md "Recall"): ``about_now``, what the
        cameras show now, reads the working memory, which always holds the newest frames whole;
        ``about_first``, the stream's beginning, replays each camera's first chunk alone; the rest
        replay the first, the best-ranked and the newest chunks."""
        if self.archive is None:
            return None
        whole_since = self.whole_since(camera)
        if window is not None:
            if not self._archive_reaches(window, camera, whole_since):
                return None
            keep = (lambda row: window.holds_any(row.stamps)) if window.placed else None
            held = [row for row in self.archive.rows(window.since, window.until, camera) if keep is None or keep(row)]
            rows = self.archive.window(window.since, window.until, camera, keep=keep, **self._ranking(
                ids, clock, question, camera, window, len(held)))
            return self._replay(rows, recalled=0, left_out=len(held) - len(rows))
        # a question with no window reads the day whenever the archive reaches past the working
        # memory, and always when that holds nothing of the camera (a node restarted on its archive)
        empty = not self.sees(camera, None)
        if not empty and (about_now or not self._archive_reaches(Window(), camera, whole_since)):
            return None
        if about_first:
            return self._replay(self.archive.first_chunks(camera), recalled=0)
        rows, recalled = self.archive.for_question(camera=camera, before=whole_since,
                                                   **self._ranking(ids, clock, question, camera, Window()))
        if empty or recalled or any(r.pinned for r in rows):
            return self._replay(rows, recalled=len(recalled))
        return None

    def _ranking(self, ids, clock, question: str, camera: str, window: Window, rows: int | None = None) -> dict:
        """How the archive ranks chunks for a question: by the index (each chunk's most likely
        frame) where every chunk is indexed, else by the keys; nothing to rank when all fit."""
        if rows is not None and rows <= self.archive.settings.max_replay_chunks:
            return {"question": None}
        scores = self.index_scores(question, camera, window) if question else None
        if scores is not None:
            if scores.within is not None:  # a place: its frames' scores alone rank their chunks
                scores = scores.inside(window.since, window.until, scores.within)
            return {"question": None, "chunk_scores": best_by_chunk(scores)}
        return {"question": self._question(ids, clock)}

    # -- the index ----------------------------------------------------------------------------------
    def index_scores(self, question: str, camera: str, window: Window, margin_frames: int = 0) -> FrameScores | None:
        """The index's P(yes) for every archived frame of ``window`` (of ``camera``), and of the
        ``margin_frames`` frames either side of it (a run of sightings cut by the window's edge is
        judged whole); None without an index, or when a chunk inside the window is not indexed
        (archived before the index, or by another dual encoder): then nothing is ranked by it."""
        if self.archive is None or self.encoder is None:
            return None
        ranked = self.archive.frame_cosines(self.encoder.embed_text(question), *window.bounds(), camera,
                                            margin=margin_frames)
        if ranked is None:
            return None
        stamps, chunk_ids, cameras, cosine, within = ranked
        if window.placed:  # a place: the window's frames taken inside it (docs/places.md)
            within = window.mask(stamps) if within is None else within & window.mask(stamps)
        return FrameScores(stamps, chunk_ids, self.encoder.probability(cosine), cameras, within)

    def replay_chunks(self, chunk_ids: list[int], scores: FrameScores) -> Replay | None:
        """A short replay of these archived chunks (a ``when`` verifying a candidate), as the archive
        holds them now: a part made whole since it was ranked is replayed as the whole, a chunk
        dropped since is left out (None when nothing is left)."""
        planned = []
        for chunk_id in chunk_ids:
            stamps = scores.chunk_stamps(chunk_id)
            planned.append(ArchivedChunk(int(chunk_id), scores.camera_of(chunk_id), min(stamps), max(stamps),
                                         stamps, [], 0))
        return self.replay_rows(planned)

    def sighting_frames(self, question: str, camera: str, window: Window, k: int) -> list[tuple[float, str, float]]:
        """(stamp, camera, P(yes)) of the ``k`` frames of ``window`` the index ranks most likely to
        show what ``question`` names, at or above its threshold, most likely first; none without an
        index (more evidence for a "did you see" answered yes, after the moment verified)."""
        scores = self.index_scores(question, camera, window) if k > 0 else None
        if scores is None:
            return []
        if scores.within is not None:  # a place: its frames alone
            scores = scores.inside(window.since, window.until, scores.within)
        best = [int(i) for i in np.argsort(-scores.probability, kind="stable")[:k]
                if scores.probability[i] >= self.encoder.settings.threshold]
        return [(float(scores.stamps[i]), "" if scores.cameras is None else str(scores.cameras[i]),
                 float(scores.probability[i])) for i in best]

    def replay_rows(self, rows: list[ArchivedChunk]) -> Replay | None:
        """A short replay of ``rows`` (light ones will do) as the archive holds them now."""
        held = self.archive.as_held_now(rows)
        return self._replay(held, recalled=len(held))

    def standing_answers(self, question: str, camera: str, window: Window) -> list[tuple[ArchivedChunk, float]] | None:
        """The P(yes) a standing question got over every archived chunk of ``window``, oldest first;
        None unless each chunk there has it (it stood for the whole window)."""
        if self.archive is None or not self.archive.watch_covers(question, *window.bounds(), camera):
            return None
        rows = self.archive.rows(*window.bounds(), camera)
        if not rows or any(question not in row.watch for row in rows):
            return None
        return [(row, row.watch[question]) for row in rows]

    def index_covers(self, camera: str, window: Window) -> bool:
        """Whether the index ranks every archived frame of ``window`` (a ``when`` then retrieves)."""
        return self.archive is not None and self.encoder is not None and self.archive.index_covers(*window.bounds(),
                                                                                                   camera)

    def plan_when(self, ids: list[int], camera: str, window: Window, clock: int | None,
                  mode: str) -> list[Replay] | None:
        """The replays a ``when`` search runs over, in the order it should try them (each prefilled as
        it is searched, off the turn lock); None when the working memory holds the window whole.
        ``last`` and ``first`` walk every archived chunk of the window (under a place, those with a
        frame there), newest (oldest) first, ``max_replay_chunks`` a replay, so no chunk is left
        unsearched; ``timeline`` runs over one replay of the most relevant (archive/plan.py)."""
        if self.archive is None or not self._archive_reaches(window, camera, self.whole_since(camera)):
            return None
        keep = (lambda row: window.holds_any(row.stamps)) if window.placed else None
        rows = [row for row in self.archive.rows(window.since, window.until, camera) if keep is None or keep(row)]
        if mode == "timeline":
            chosen = self.archive.window(window.since, window.until, camera, self._question(ids, clock), keep=keep)
            return [self._replay(chosen, 0, len(rows) - len(chosen))]
        size = self.archive.settings.max_replay_chunks
        batches = [rows[i:i + size] for i in range(0, len(rows), size)]
        return [self._replay(batch, 0) for batch in (reversed(batches) if mode == "last" else batches)]

    def _archive_reaches(self, window: Window, camera: str, whole_since: float) -> bool:
        """Whether the archive holds frames of ``window`` older than ``whole_since``, where the
        working memory stops holding every token."""
        return window.since < whole_since and self.archive.holds(window.since, min(window.until, whole_since - 1e-9),
                                                                 camera)

    def _question(self, ids: list[int], clock: int | None):
        """The question's vector at the key layers: its prompt run over the working memory (the
        tokens removed again), its queries read before the rotary embedding."""
        queries: dict[int, torch.Tensor] = {}

        def observe(layer, q, _k, _new):
            if layer in self.key_layers:
                queries[layer] = q.detach()
        policy, adapter = self.policy, self.adapter
        mark = policy.mark()
        try:
            adapter.forward(adapter.embed_text(ids), adapter.text_tokens(len(ids), clock=clock), policy, observe=observe)
        finally:
            policy.truncate(mark)
        return question_vector([queries[layer] for layer in self.key_layers], policy.geometry.num_kv_heads)

    def _replay(self, rows: list[ArchivedChunk], recalled: int, left_out: int = 0) -> Replay | None:
        return Replay(rows, recalled, max(left_out, 0), self._prefill) if rows else None

    def _prefill(self, rows: list[ArchivedChunk]) -> tuple[ScratchMemory, list[ArchivedChunk], list[ArchivedChunk]]:
        """(a scratch memory over ``rows`` as held now, the rows replayed, the rows gone), read
        through the archive's own read connection (``Archive.load``)."""
        loaded, gone = self.archive.load(rows)
        if gone:
            log.info("archive: %d planned chunk(s) were dropped by archive_max_bytes before a question read them",
                     len(gone))
        if not loaded:
            raise QuestionError(f"the {len(rows)} archived chunk(s) this question was to read were dropped by "
                                "archive_max_bytes while it ran: ask again")
        scratch = self.make_scratch()
        for row in loaded:
            chunk = row.chunk
            if chunk.needs_encoding:  # kept as frames: through the vision encoder again (docs/archive.md)
                chunk = self.encode_whole(row.camera, [(decode_jpeg(j), s) for j, s in zip(chunk.frames, chunk.stamps)],
                                          side_outputs=False)
            scratch.take_in(chunk)
            row.chunk = None  # payloads go as soon as they are prefilled
        return scratch, loaded, gone

    def span(self, camera: str, window: Window | None) -> tuple[float, float]:
        """(the oldest, the newest) frame stamp held inside ``window`` (of ``camera``), in the working
        memory or the archive; (0.0, 0.0) for none."""
        held = self.seen_counts(camera, window)
        stamps = [held.oldest_stamp, held.newest_stamp] if held is not None and held.frames else []
        if self.archive is not None:
            since, until = (window or Window()).bounds()
            stamps += [s for s in (self.archive.oldest_stamp(since, until, camera),
                                   self.archive.newest_stamp(since, until, camera)) if math.isfinite(s)]
        return (min(stamps), max(stamps)) if stamps else (0.0, 0.0)

    def frames_in_window(self, camera: str, window: Window | None, held: MemoryCounts | None) -> int:
        """Frames held inside ``window`` (of ``camera``): the archive's (every chunk goes there) or,
        without one, the working memory's ``held``."""
        in_memory = held.frames if held is not None else 0
        if self.archive is None:
            return in_memory
        return max(in_memory, self.archive.frames_between(*(window or Window()).bounds(), camera))

    # -- how far back an answer reaches -------------------------------------------------------------
    def holds(self, window: Window | None, camera: str = "") -> bool:
        """Whether the archive holds a frame of ``window`` (of ``camera`` when given)."""
        return self.archive is not None and self.archive.holds(*(window or Window()).bounds(), camera)

    def holes_in(self, camera: str, window: Window | None) -> list[Hole]:
        """The archive's holes overlapping ``window`` (of ``camera``), oldest first; none without it."""
        if self.archive is None:
            return []
        return [Hole(*hole) for hole in self.archive.holes(*(window or Window()).bounds(), camera)]

    def absence(self, camera: str, window: Window | None) -> str:
        """Why a question about ``camera`` over ``window`` sees nothing, for its refusal: what the
        archive and the working memory hold, and the holes that lie in the window."""
        window = window or Window()
        since, until = window.bounds()
        source = f" of camera '{camera}'" if camera else ""
        oldest, newest = self.archive.oldest_stamp(camera=camera), self.archive.newest_stamp(camera=camera)
        held = f"the archive holds frames{source} stamped {oldest:.3f} to {newest:.3f}"
        memory = self.seen_counts(camera, None)
        if memory is not None and memory.frames:
            held += f", the working memory {memory.oldest_stamp:.3f} to {memory.newest_stamp:.3f}"
        holes = self.holes_in(camera, window)
        if holes:
            why = "the window lies in " + "; ".join(
                f"a hole from {h.since:.3f} to {h.until:.3f} ({HOLE_REASONS.get(h.reason, h.reason)})" for h in holes)
        elif since > newest:
            why = f"nothing newer than {newest:.3f} has been seen yet"
        elif until < oldest:
            why = f"the oldest frame held is stamped {oldest:.3f}"
        else:
            why = "no frame was seen in that span"
        return (f"no frames{source} in memory between {Window.describe(since)} and {Window.describe(until)}: {why}; "
                f"{held}: widen since/until")

    def reads_archive(self, window: Window | None) -> bool:
        """Whether a question over ``window`` (None: none) could read the archive: with one
        attached, every question reaches it when it reaches past the working memory."""
        return self.archive is not None

    def reach(self, camera: str, window: Window | None, held: MemoryCounts | None,
              archive_read: bool) -> tuple[float, bool]:
        """(searched_since, evicted_before) of an answer that read ``held`` of the working memory (None:
        nothing of it), and the archive's frames of ``window`` when ``archive_read``: the oldest
        frame stamp it could read (0.0: none), and whether frames of ``camera`` older than that and
        inside the window were seen and are held nowhere the answer could read
        (docs/interfaces.md "How far back an answer reaches")."""
        window = window or Window()
        oldest = held.oldest_stamp if held is not None and held.frames else math.inf
        if archive_read and self.archive is not None:
            oldest = min(oldest, self.archive.oldest_stamp(*window.bounds(), camera))
        if oldest == math.inf:
            return 0.0, False
        seen_from = self.ledger.oldest_seen(camera)
        if self.archive is not None:  # after a restart the archive remembers older frames than the ledger
            seen_from = min(seen_from, self.archive.oldest_stamp(camera=camera))
        return oldest, window.since < oldest and seen_from < oldest
