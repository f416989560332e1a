"""``Archive``: the archive tier over a ChunkStore (docs/archive.md): what to replay, the index's
reads, the write failures and holes, every chunk a question or ingest hands it."""
from __future__ import annotations

import logging
import math
import pathlib
from dataclasses import dataclass

import numpy as np

from ...errors import ArchiveError, ArchiveMismatch
from ...places import Place, Pose
from . import poses
from .chunk_store import ChunkStore
from .poses import PosedFrames
from .keys import relevance
from .plan import question_plan, window_plan
from .record import ArchivedChunk, EncodedChunk
from .write_failures import WRITE_ERRORS, WriteFailures
from .store import ArchiveStore, free_bytes
from .sqlite_file import set_aside
from .thumbnails import DEFAULT_THUMBNAIL_PX, Thumbnail

log = logging.getLogger("streamcache_ros.archive")
# a camera's gap after a restart longer than this (and than a few of its frames) was the node down
DOWN_GAP_S, DOWN_GAP_FRAMES = 2.0, 3
CONTENTS = ("auto", "embeddings", "frames")  # archive_content
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB: a day of the bundled model is about 0.18 GiB (docs/archive.md "The store")


@dataclass
class ArchiveSettings:
    path: str
    max_bytes: int = DEFAULT_MAX_BYTES
    # archived chunks a question with no window brings back for relevance, ranked by the index
    # (docs/archive.md "Recall")
    recall_chunks: int = 2
    recent_chunks: int = 2  # the newest chunks of each camera replayed beside them ("now")
    max_replay_chunks: int = 64  # one short replay: 512 frames at 8 a chunk, well inside the models' range
    dtype: str = "float16"  # of the stored embeddings; "float32" is exact
    buffer_bytes: int = 32 << 20  # the newest chunks' payloads kept in RAM
    sync: str = "normal"  # archive_sync: "full" syncs every commit (docs/archive.md "Durability")
    # every frame's JPEG at this longest side, counted in max_bytes; 0 = none (docs/show.md)
    thumbnail_px: int = DEFAULT_THUMBNAIL_PX
    # what a chunk keeps to be replayed (docs/archive.md "What a chunk keeps"): "embeddings" (the
    # vision encoder's output), "frames" (each frame's JPEG at the model's input size, encoded again
    # on a replay), or "auto" (frames where the embeddings take 128 kB a frame or more)
    content: str = "auto"


class Archive:
    def __init__(self, settings: ArchiveSettings, store: ChunkStore):
        self.settings, self.store = settings, store
        self.failures = WriteFailures()
        self._newest_at_open = store.newest_stamps()  # each camera's, for the hole a restart leaves

    @classmethod
    def open(cls, settings: ArchiveSettings, identity: dict, cameras: tuple[str, ...] = (), owner: str = "",
             opener=ArchiveStore.open, set_aside_mismatch: bool = False) -> "Archive":
        """The archive in ``settings.path``; ``opener`` opens its ChunkStore (default: SQLite).
        ``set_aside_mismatch``: an archive written by another model, or holding cameras this node
        does not have, is set aside (renamed, kept for a person, with a warning) and a new one begins,
        instead of the open being refused: the node's default archive_path, where a robot whose
        model or cameras changed must still start (docs/archive.md "Refusals")."""
        if settings.content not in CONTENTS:
            raise ArchiveError(f"archive_content must be one of {', '.join(CONTENTS)}, got '{settings.content}'")

        def open_store():
            return opener(settings.path, identity, cameras, owner, settings.dtype, settings.max_bytes,
                          settings.buffer_bytes, settings.sync)
        try:
            return cls(settings, open_store())
        except ArchiveMismatch as err:
            if not set_aside_mismatch:
                raise
            aside = set_aside(pathlib.Path(settings.path).expanduser(), "set-aside")
            archive = cls(settings, open_store())
            archive.warnings.append(f"{err}. On the default archive_path it was set aside as '{aside}' (kept for a "
                                    "person; at most two are kept) and a new archive begins")
            return archive

    @property
    def warnings(self) -> list[str]:
        return self.store.warnings

    def add(self, chunk: EncodedChunk, key: np.ndarray | None) -> int | None:
        """The chunk's id in the archive, or None when the disk refused it (counted, warned about
        once per episode, and named as a hole once a write succeeds: write_failures.py)."""
        try:
            chunk_id = self.store.append(chunk, key)
        except WRITE_ERRORS as err:
            self.failures.failed(chunk, err, free_bytes(self.settings.path))
            return None
        self._mark_restart_gap(chunk)
        for camera, since, until, chunks in self.failures.resumed():
            self._note_hole(camera, since, until, "disk", chunks)
        return chunk_id

    def _mark_restart_gap(self, chunk: EncodedChunk) -> None:
        """The first chunk of a camera after the archive opened: a gap since that camera's newest
        archived stamp longer than a few frames is the time the node was down, a hole."""
        newest = self._newest_at_open.pop(chunk.camera, None)
        if newest is None:
            return
        stamps = sorted(chunk.stamps)
        spacing = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else 0.0
        if stamps[0] - newest > max(DOWN_GAP_S, DOWN_GAP_FRAMES * spacing):
            self._note_hole(chunk.camera, newest, stamps[0], "down", 0)

    def _note_hole(self, camera: str, since: float, until: float, reason: str, chunks: int) -> None:
        try:
            self.store.note_hole(camera, since, until, reason, chunks)
        except WRITE_ERRORS as err:  # the disk refuses again: the next episode names it
            log.warning("archive: a hole (%s %.2f..%.2f s of '%s') could not be written: %s", reason, since, until,
                        camera, err)

    def holes(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> list[tuple]:
        """(camera, since, until, reason, chunks) of the holes overlapping since..until, oldest
        first: those written, and the chunks not written in the episode still going on."""
        pending = [(c, a, b, "disk", n) for c, a, b, n in self.failures.pending()
                   if b >= since and a <= until and (not camera or c == camera)]
        return sorted(self.store.holes(since, until, camera) + pending, key=lambda hole: hole[1])

    def holds(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> bool:
        """Whether a chunk with a frame stamped inside since..until (of ``camera``) is archived."""
        return self.store.holds(since, until, camera)

    def watch_covers(self, question: str, since: float = -math.inf, until: float = math.inf, camera: str = "") -> bool:
        return self.store.watch_covers(question, since, until, camera)

    def frames_between(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> int:
        return self.store.frames_between(since, until, camera)

    def note_watch(self, chunk_id: int, answers: dict[str, float]) -> None:
        try:
            self.store.note_watch(chunk_id, answers)
        except WRITE_ERRORS as err:  # the answers are lost, not the chunk: a when then replays it
            if not self.failures.in_episode:
                log.warning("archive: standing answers of chunk %d not written: %s", chunk_id, err)

    def replace(self, chunk_ids: list[int], chunk: EncodedChunk, key: np.ndarray | None) -> int:
        """``chunk`` in place of the chunks ``chunk_ids`` (its parts), in one transaction."""
        return self.store.replace(chunk_ids, chunk, key)

    def rows(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> list[ArchivedChunk]:
        """The chunks with a frame stamped inside since..until (of ``camera``), oldest first, light."""
        return self.store.rows(since, until, camera)

    def oldest_stamp(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> float:
        """The oldest archived frame stamp inside since..until (of ``camera`` when given); +inf for
        none (an answer's reach, docs/interfaces.md "How far back an answer reaches")."""
        return self.store.oldest_stamp(since, until, camera)

    def newest_stamp(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> float:
        """The newest archived frame stamp inside since..until (of ``camera``); -inf for none."""
        return self.store.newest_stamp(since, until, camera)

    def window(self, since: float = -math.inf, until: float = math.inf, camera: str = "",
               question: np.ndarray | None = None, chunk_scores: dict[int, float] | None = None,
               keep=None) -> list[ArchivedChunk]:
        """The chunks a question over since..until replays (``window_plan``), oldest first, ranked
        by ``chunk_scores`` (the index's, by chunk id) or else by the keys against ``question``;
        only those ``keep(row)`` is true of, when given (a place's)."""
        rows = self.store.rows(since, until, camera, with_keys=question is not None and chunk_scores is None)
        rows = rows if keep is None else [row for row in rows if keep(row)]
        scores = self._ranked(rows, question, chunk_scores)
        return window_plan(rows, scores, self.settings.max_replay_chunks)

    def for_question(self, question: np.ndarray | None, camera: str = "", before: float = math.inf,
                     chunk_scores: dict[int, float] | None = None) -> tuple[list[ArchivedChunk], list[ArchivedChunk]]:
        """(what a question with no window replays, the part recalled for relevance): the relevant
        ones drawn from chunks that end before ``before`` (what the working memory no longer holds
        whole), ranked as ``window`` ranks."""
        if chunk_scores is not None:
            rows = self._plan_candidates(camera, before, chunk_scores)
        else:
            rows = self.store.ranking_rows(camera, with_keys=question is not None)
        scores = self._ranked(rows, question, chunk_scores)
        scores = np.zeros(len(rows)) if scores is None else scores
        scores = np.where([row.last_stamp < before for row in rows], scores, -np.inf)
        replayed, recalled = question_plan(rows, scores, self.settings.recall_chunks, self.settings.recent_chunks)
        whole = {row.chunk_id: row for row in self.store.complete(replayed)}
        return [whole[row.chunk_id] for row in replayed], [whole[row.chunk_id] for row in recalled]

    def first_chunks(self, camera: str = "") -> list[ArchivedChunk]:
        """Each camera's first chunk (``camera``'s alone where given), whole, in time order: all a
        question about the stream's beginning replays (docs/archive.md "Recall")."""
        ids, cameras, firsts, lasts, pinned = self.store.chunk_table(camera)
        rows = []
        for name in sorted(set(cameras.tolist())):
            i = int(np.flatnonzero(cameras == name)[0])
            rows.append(ArchivedChunk(int(ids[i]), str(cameras[i]), float(firsts[i]), float(lasts[i]), [], [], 0,
                                      pinned=bool(pinned[i])))
        return sorted(self.store.complete(rows), key=lambda row: (row.first_stamp, row.chunk_id))

    def _plan_candidates(self, camera: str, before: float, chunk_scores: dict[int, float]) -> list[ArchivedChunk]:
        """The few rows ``question_plan`` can choose from, a day's ranking done on arrays: each
        camera's first and newest chunks, the pinned ones, and the best-ranked older ones (enough to
        fill ``recall_chunks`` past the ones it skips)."""
        ids, cameras, firsts, lasts, pinned = self.store.chunk_table(camera)
        if not len(ids):
            return []
        recent, keep = self.settings.recent_chunks, set(np.flatnonzero(pinned).tolist())
        names = sorted(set(cameras.tolist()))
        for name in names:
            own = np.flatnonzero(cameras == name)
            keep |= {int(own[0])} | (set(own[-recent:].tolist()) if recent else set())
        scores = np.array([chunk_scores.get(c, -np.inf) for c in ids.tolist()])
        scores[lasts >= before] = -np.inf
        wanted = self.settings.recall_chunks + (recent + 1) * len(names)
        keep |= set(np.argsort(-scores, kind="stable")[:wanted].tolist())
        return [ArchivedChunk(int(ids[i]), str(cameras[i]), float(firsts[i]), float(lasts[i]), [], [], 0,
                              pinned=bool(pinned[i])) for i in sorted(keep)]

    def ranked(self, question: np.ndarray, rows: list[ArchivedChunk]) -> np.ndarray:
        return self._scores(rows, question)

    def _ranked(self, rows: list[ArchivedChunk], question: np.ndarray | None,
                chunk_scores: dict[int, float] | None) -> np.ndarray | None:
        if chunk_scores is not None:
            return np.array([chunk_scores.get(row.chunk_id, -np.inf) for row in rows], dtype=np.float64)
        return self._scores(rows, question) if question is not None else None

    # -- the index --------------------------------------------------------------------------------
    def use_index(self, index_model: str) -> None:
        """Frames are indexed by ``index_model`` from now on (another model's vectors are dropped)."""
        self.store.use_index(index_model)

    def as_held_now(self, rows: list[ArchivedChunk]) -> list[ArchivedChunk]:
        """``rows`` (light ones will do: id, camera, the stamps planned) as held now, oldest first,
        payloads aside: a chunk made whole from its parts since is read as that whole, a chunk the
        bound dropped is left out (``ChunkStore.current``)."""
        return self.store.current(rows)[0]

    def frame_cosines(self, query: np.ndarray, since: float = -math.inf, until: float = math.inf, camera: str = "",
                      margin: int = 0):
        """``ChunkStore.frame_cosines``."""
        return self.store.frame_cosines(query, since, until, camera, margin)

    def index_covers(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> bool:
        return self.store.index_covers(since, until, camera)

    @staticmethod
    def _scores(rows: list[ArchivedChunk], question: np.ndarray) -> np.ndarray:
        keyed = [i for i, row in enumerate(rows) if row.key is not None]
        scores = np.full(len(rows), -np.inf)
        if keyed:
            scores[keyed] = relevance(question, [rows[i].key for i in keyed])
        return scores

    def load(self, rows: list[ArchivedChunk]) -> tuple[list[ArchivedChunk], list[ArchivedChunk]]:
        """(``rows`` as held now with their payloads, the rows gone since they were planned):
        ``ChunkStore.current``; a chunk dropped between that read and its payload's is gone too."""
        now, gone = self.store.current(rows)
        loaded = []
        for row in now:
            try:
                loaded += self.store.load([row])
            except ArchiveError:  # dropped by the bound between the two reads
                gone.append(row)
        return loaded, gone

    def reach(self) -> float | None:
        """The oldest stamp archived, None when empty."""
        stats = self.store.stats()
        return stats["oldest_stamp"] if stats["chunks"] else None

    def stats(self) -> dict:
        return {**self.store.stats(), "not_archived": self.failures.not_archived,
                "failing": self.failures.in_episode}

    def thumbnails_at(self, stamps: list[float], cameras: list[str] | None = None) -> list[Thumbnail | None]:
        """The archived thumbnail of each frame stamped ``stamps[i]`` (of ``cameras[i]``), None where none."""
        return self.store.thumbnails_at(stamps, cameras)

    def thumbnails_between(self, since: float = -math.inf, until: float = math.inf,
                           camera: str = "") -> list[Thumbnail]:
        return self.store.thumbnails_between(since, until, camera)

    # -- where: the poses kept with the frames (poses.py) ----------------------------------------------
    def frames_in_place(self, place: Place, since: float = -math.inf, until: float = math.inf,
                        camera: str = "") -> PosedFrames:
        return poses.frames_in_place(self.store.reader, place, since, until, camera)

    def posed_frames(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> PosedFrames:
        return poses.posed_frames(self.store.reader, since, until, camera)

    def nearest_pass(self, place: Place, since: float = -math.inf, until: float = math.inf,
                     camera: str = "") -> tuple[float, float] | None:
        return poses.nearest_pass(self.store.reader, place, since, until, camera)

    def poses_at(self, stamps: list[float], cameras: list[str] | None = None) -> list[Pose | None]:
        return poses.poses_at(self.store.reader, stamps, cameras)

    def fill_poses(self, chunk_id: int, frame_poses: list, pose_frame: str) -> int | None:
        return self.store.change(lambda db: poses.fill_poses(db, chunk_id, frame_poses, pose_frame))

    def pose_counts(self) -> tuple[int, int]:
        return poses.pose_counts(self.store.reader)

    def clear(self) -> int:
        """Forget every archived chunk and hole; returns the chunks deleted."""
        self._newest_at_open = {}
        return self.store.clear()

    def close(self) -> None:
        self.store.close()
