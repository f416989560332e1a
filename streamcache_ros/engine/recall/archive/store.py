"""The archive on disk: one SQLite file in WAL mode, a chunk a row, a transaction a chunk.

    store = ArchiveStore.open(folder, identity={"model_id": ..., "config_hash": ...}, cameras=(...))
    chunk_id = store.append(encoded, key)          # committed: survives kill -9 from here on
    rows = store.rows(since=10.0, until=40.0)      # what is held, without payloads
    store.load(rows)                               # payloads from the RAM buffer or the disk

Why SQLite (docs/archive.md "The store"): one file a robotics engineer opens with the ``sqlite3``
shell; a torn write is a rolled-back transaction, never a half chunk; WAL lets a reader look while
the node writes; ``PRAGMA integrity_check`` on open finds a damaged file, and what can still be read
is kept (``_salvage``). One writer: a lock file held with ``flock`` for as long as the node runs, which
the kernel releases when the process dies, however it dies.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import math
import os
import pathlib
import shutil
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from ... import failpoints
from ...errors import ArchiveError
from .index_cache import IndexCache
from .record import ArchivedChunk, EncodedChunk, STORE_DTYPES, pack_tensor, unpack_tensor
from .salvage import salvaged_rows
from .spans import span_query, sql_stamp
from .thumbnails import Thumbnail, frame_near, frames_between
from .thumbnails import pack as pack_thumbnails

FORMAT = 1
DB_NAME = "archive.sqlite"
LOCK_NAME = "archive.lock"
WAL_LIMIT_BYTES = 4 << 20
DAMAGED_COPIES = 2  # damaged files kept for a person to look at: the newest ones, counted apart from the bound
SYNC_MODES = ("normal", "full")  # archive_sync (docs/archive.md "Durability")
log = logging.getLogger("streamcache_ros.archive")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,            -- arrival order, never reused
    camera TEXT NOT NULL,
    first_stamp REAL NOT NULL,         -- seconds, the stream's own clock
    last_stamp REAL NOT NULL,
    stamps TEXT NOT NULL,              -- JSON: every frame's stamp
    unit_frames TEXT NOT NULL,         -- JSON: per unit, the indices of its frames in stamps
    tokens_per_unit INTEGER NOT NULL,
    embeds BLOB NOT NULL,              -- the visual embeddings [tokens, hidden] in meta.dtype
    embeds_shape TEXT NOT NULL,
    positions BLOB NOT NULL,           -- chunk-relative positions [axes, tokens], float32
    positions_shape TEXT NOT NULL,
    retrieval_key BLOB,                -- float16, what recall ranks by (docs/archive.md "Recall")
    key_shape TEXT,
    watch TEXT NOT NULL DEFAULT '{}',  -- JSON: standing question -> P(yes) over this chunk
    pinned INTEGER NOT NULL DEFAULT 0, -- the first chunk of its camera: kept past the bound
    bytes INTEGER NOT NULL,
    frame_vectors BLOB,                -- float16 [frames, dim]: the index (docs/archive.md "The index")
    vectors_shape TEXT,
    thumbnails BLOB,                   -- every frame's JPEG, concatenated (docs/show.md)
    thumbnail_sizes TEXT               -- JSON: each frame's JPEG byte count, 0 for none
);
CREATE INDEX IF NOT EXISTS chunks_by_stamp ON chunks (last_stamp);
-- rows come oldest first: the first of a span (holds, the oldest stamp) without sorting a day
CREATE INDEX IF NOT EXISTS chunks_in_order ON chunks (first_stamp, id);
-- spans where frames were seen and are held nowhere (docs/archive.md "Holes")
CREATE TABLE IF NOT EXISTS holes (
    id INTEGER PRIMARY KEY,
    camera TEXT NOT NULL,
    since REAL NOT NULL,               -- the last stamp held before the hole (or the hole's first)
    until REAL NOT NULL,               -- the first stamp held after it (or the hole's last)
    reason TEXT NOT NULL,              -- bound | disk | down
    chunks INTEGER NOT NULL DEFAULT 0  -- chunks lost in it (0: unknown, the node was down)
);
"""
ROW_COLUMNS = "id, camera, first_stamp, last_stamp, stamps, unit_frames, tokens_per_unit, pinned, bytes, watch"
INDEX_META = "index_model"  # which dual encoder made the frame vectors: another one's cannot be compared


class ChunkBuffer:
    """The newest chunks' payloads in RAM, bounded by bytes: recall of recent chunks reads no disk,
    and the RAM this takes never grows past ``max_bytes`` (every chunk is on disk already)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = int(max_bytes), 0
        self.items: OrderedDict[int, tuple[EncodedChunk, int]] = OrderedDict()

    def put(self, chunk_id: int, chunk: EncodedChunk) -> None:
        # the bytes held in RAM, not the row's bytes on disk: the buffer keeps float32 tensors
        size = int(chunk.embeds.nelement() * chunk.embeds.element_size()
                   + chunk.rel_positions.nelement() * chunk.rel_positions.element_size())
        if size > self.max_bytes:
            return
        self.items[chunk_id] = (chunk, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self.items.popitem(last=False)
            self.bytes -= dropped

    def get(self, chunk_id: int) -> EncodedChunk | None:
        item = self.items.get(chunk_id)
        return item[0] if item else None

    def drop(self, chunk_id: int) -> None:
        item = self.items.pop(chunk_id, None)
        if item:
            self.bytes -= item[1]

    def clear(self) -> None:
        self.items.clear()
        self.bytes = 0


class ArchiveStore:
    def __init__(self, folder: pathlib.Path, db: sqlite3.Connection, lock_file, dtype: str, max_bytes: int,
                 buffer_bytes: int, warnings: list[str]):
        self.folder, self.db, self._lock_file = folder, db, lock_file
        # reads go through a connection of their own: a question's replay reads off the turn lock
        # while ingest writes through ``db`` (WAL: a reader sees every committed chunk, never half one)
        self.reader = _reader(folder / DB_NAME)
        self.dtype, self.max_bytes = dtype, int(max_bytes)
        self.buffer = ChunkBuffer(buffer_bytes)
        self.warnings = warnings  # what opening found and mended: the node logs each as a WARN
        self._held_bytes = int(db.execute("SELECT COALESCE(SUM(bytes), 0) FROM chunks").fetchone()[0])
        self._index: IndexCache | None = None  # read from disk at the first ranking, then kept in step
        self._watched: set[str] | None = None  # the standing questions noted on any chunk

    # -- opening ----------------------------------------------------------------------------------
    @classmethod
    def open(cls, folder: str | os.PathLike, identity: dict, cameras: tuple[str, ...] = (), owner: str = "",
             dtype: str = "float16", max_bytes: int = 1 << 30, buffer_bytes: int = 32 << 20,
             sync: str = "normal") -> "ArchiveStore":
        """Open (or create) the archive in ``folder``. ArchiveError, with nothing changed, when the
        folder cannot be made, another process holds the archive, or it was written by another
        model (``identity``) or holds cameras not in ``cameras`` (when given)."""
        if dtype not in STORE_DTYPES:
            raise ArchiveError(f"archive dtype must be one of {', '.join(STORE_DTYPES)}, got '{dtype}'")
        if int(max_bytes) < 1:
            raise ArchiveError(f"archive_max_bytes must be >= 1, got {max_bytes}")
        if sync not in SYNC_MODES:
            raise ArchiveError(f"archive_sync must be one of {', '.join(SYNC_MODES)}, got '{sync}'")
        folder = pathlib.Path(folder).expanduser()
        try:
            # what the robot saw is private: the folder is the owner's alone, as snapshot_dir is
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise ArchiveError(f"archive_path '{folder}' cannot be used as a folder: {err.strerror or err}") from None
        if not folder.is_dir():
            raise ArchiveError(f"archive_path '{folder}' is not a folder")
        lock_file = _take_lock(folder, owner)
        try:
            warnings: list[str] = []
            db = _connect(folder / DB_NAME, warnings, sync)
            _check_identity(db, folder, identity, cameras, dtype)
            _keep_damaged_copies(folder, DAMAGED_COPIES)
            return cls(folder, db, lock_file, dtype, max_bytes, buffer_bytes, warnings)
        except BaseException:
            lock_file.close()  # releases the lock: a refused open leaves the archive to others
            raise

    def close(self) -> None:
        """Closed as one file: the write-ahead log folded back and cut to nothing, so a copy of
        ``archive.sqlite`` alone holds every chunk (docs/archive.md "Durability")."""
        if getattr(self, "reader", None) is not None:
            self.reader.close()
            self.reader = None
        if self.db is not None:
            failpoints.hit("archive", step="checkpoint")
            try:
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error as err:  # a full disk: the log stays beside the file, still committed
                log.warning("archive: the write-ahead log could not be folded back at close (%s): keep "
                            "archive.sqlite-wal beside archive.sqlite when copying the archive", err)
            self.db.close()
            self.db = None
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
        self.buffer.clear()

    # -- writing ----------------------------------------------------------------------------------
    def append(self, chunk: EncodedChunk, key: np.ndarray | None = None) -> int:
        """Write one chunk in one transaction, then drop the oldest unpinned chunks past the bound;
        returns the chunk's id. The first chunk of a camera is pinned: "first" questions need it."""
        return self._write(chunk, key, [])

    def replace(self, chunk_ids: list[int], chunk: EncodedChunk, key: np.ndarray | None = None) -> int:
        """``chunk`` in place of the chunks ``chunk_ids`` (the parts it was made again from), in one
        transaction: a reader sees the parts or the whole, never both or neither. Pinned when a part
        was; its standing answers each question's best over the parts."""
        return self._write(chunk, key, [int(c) for c in chunk_ids])

    def _write(self, chunk: EncodedChunk, key: np.ndarray | None, replacing: list[int]) -> int:
        embeds, embeds_shape = pack_tensor(chunk.embeds, self.dtype)
        positions, positions_shape = pack_tensor(chunk.rel_positions, "float32")
        key_blob = key_shape = None
        if key is not None:
            key16 = np.asarray(key, dtype=np.float16)
            key_blob, key_shape = key16.tobytes(), json.dumps(list(key16.shape))
        vectors_blob = vectors_shape = None
        if chunk.frame_vectors is not None:
            vectors16 = np.asarray(chunk.frame_vectors, dtype=np.float16)
            vectors_blob, vectors_shape = vectors16.tobytes(), json.dumps(list(vectors16.shape))
        thumbs_blob, thumbs_sizes = pack_thumbnails(chunk.thumbnails)
        # the thumbnails count in the bound: archive_max_bytes bounds what is on disk (docs/show.md)
        size = (len(embeds) + len(positions) + (len(key_blob) if key_blob else 0) + len(vectors_blob or b"")
                + len(thumbs_blob or b""))
        freed, watch = 0, {}
        with self.db:  # the chunk and its index entry in one transaction: never one without the other
            pinned = self.db.execute("SELECT 1 FROM chunks WHERE camera = ? LIMIT 1", (chunk.camera,)).fetchone() is None
            for part, part_pinned, part_watch, part_bytes in self.db.execute(
                    f"SELECT id, pinned, watch, bytes FROM chunks WHERE id IN ({', '.join('?' * len(replacing))})",
                    replacing).fetchall() if replacing else []:
                pinned = pinned or bool(part_pinned)
                for question, p in json.loads(part_watch).items():
                    watch[question] = max(watch.get(question, 0.0), p)
                freed += int(part_bytes)
                self.db.execute("DELETE FROM chunks WHERE id = ?", (part,))
            cursor = self.db.execute(
                "INSERT INTO chunks (camera, first_stamp, last_stamp, stamps, unit_frames, tokens_per_unit, embeds, "
                "embeds_shape, positions, positions_shape, retrieval_key, key_shape, pinned, bytes, frame_vectors, "
                "vectors_shape, watch, thumbnails, thumbnail_sizes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "?, ?, ?)",
                (chunk.camera, min(chunk.stamps), max(chunk.stamps), json.dumps(chunk.stamps),
                 json.dumps([list(u) for u in chunk.unit_frames]), chunk.tokens_per_unit, embeds, embeds_shape,
                 positions, positions_shape, key_blob, key_shape, int(pinned), size, vectors_blob, vectors_shape,
                 json.dumps(watch), thumbs_blob, thumbs_sizes))
            failpoints.hit("archive", step="insert")
        chunk_id = int(cursor.lastrowid)
        self._held_bytes += size - freed
        for part in replacing:
            self.buffer.drop(part)
            if self._index is not None:
                self._index.drop(part)
        # the buffer holds what the disk holds (the store's dtype), so a recall is the same from either
        stored = dataclasses.replace(chunk, embeds=unpack_tensor(embeds, embeds_shape, self.dtype), frame_vectors=None,
                                     thumbnails=None)  # recall never reads them: not held in RAM
        self.buffer.put(chunk_id, stored)
        if self._index is not None:
            self._index.add(chunk_id, chunk.camera, chunk.stamps,
                            None if vectors_blob is None else np.frombuffer(vectors_blob, np.float16).reshape(
                                np.asarray(chunk.frame_vectors).shape), pinned)
        self._keep_within_bound()
        return chunk_id

    def note_watch(self, chunk_id: int, answers: dict[str, float]) -> None:
        """The standing questions' P(yes) over a chunk, kept beside it (recall reads them)."""
        with self.db:
            row = self.db.execute("SELECT watch FROM chunks WHERE id = ?", (chunk_id,)).fetchone()
            if row is None:
                return  # dropped by the bound meanwhile
            if self._watched is not None:
                self._watched |= set(answers)
            merged = json.loads(row[0])  # a chunk made of parts keeps each question's best answer
            for q, p in answers.items():
                merged[q] = max(merged.get(q, 0.0), round(float(p), 4))
            self.db.execute("UPDATE chunks SET watch = ? WHERE id = ?", (json.dumps(merged), chunk_id))

    def _keep_within_bound(self) -> None:
        if self._held_bytes <= self.max_bytes:
            return
        dropped, held = [], self._held_bytes
        with self.db:
            for chunk_id, size, camera, first, last in self.db.execute(
                    "SELECT id, bytes, camera, first_stamp, last_stamp FROM chunks WHERE pinned = 0 ORDER BY id").fetchall():
                if held <= self.max_bytes:
                    break
                self.db.execute("DELETE FROM chunks WHERE id = ?", (chunk_id,))
                # the hole runs to the next frame still held, so the next chunk dropped grows it
                after = self.db.execute("SELECT MIN(first_stamp) FROM chunks WHERE camera = ? AND first_stamp > ?",
                                        (camera, last)).fetchone()[0]
                self._note_hole(camera, first, last if after is None else after, "bound", 1)
                failpoints.hit("archive", step="bound")
                held -= size
                dropped.append(chunk_id)
        self._held_bytes = held  # counted once the deletions committed
        for chunk_id in dropped:
            self.buffer.drop(chunk_id)
            if self._index is not None:
                self._index.drop(chunk_id)
        if dropped:
            _give_back_pages(self.db)

    def clear(self) -> int:
        """Forget every chunk and hole (reset_memory); the file stays, small again. Returns the
        chunks deleted."""
        with self.db:
            deleted = self.db.execute("DELETE FROM chunks").rowcount
            self.db.execute("DELETE FROM holes")
        _give_back_pages(self.db)
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        self._held_bytes = 0
        self.buffer.clear()
        self._index = None
        self._watched = None
        return int(deleted)

    # -- holes (docs/archive.md "Holes") -----------------------------------------------------------
    def note_hole(self, camera: str, since: float, until: float, reason: str, chunks: int = 0) -> None:
        """A span of ``camera`` where frames were seen and are held nowhere; one of the same reason
        that touches it grows instead (a bound that drops chunk after chunk makes one hole)."""
        with self.db:
            self._note_hole(camera, since, until, reason, chunks)

    def _note_hole(self, camera: str, since: float, until: float, reason: str, chunks: int) -> None:
        row = self.db.execute("SELECT id, since, until, chunks FROM holes WHERE camera = ? AND reason = ? AND "
                              "until >= ? AND since <= ? ORDER BY id DESC LIMIT 1",
                              (camera, reason, float(since), float(until))).fetchone()
        if row is None:
            self.db.execute("INSERT INTO holes (camera, since, until, reason, chunks) VALUES (?, ?, ?, ?, ?)",
                            (camera, float(since), float(until), reason, int(chunks)))
        else:
            self.db.execute("UPDATE holes SET since = ?, until = ?, chunks = ? WHERE id = ?",
                            (min(row[1], since), max(row[2], until), row[3] + int(chunks), row[0]))

    def holes(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> list[tuple]:
        """(camera, since, until, reason, chunks) of every hole overlapping since..until (of
        ``camera``), oldest first."""
        query = "SELECT camera, since, until, reason, chunks FROM holes WHERE until >= ? AND since <= ?"
        args: list = [sql_stamp(since), sql_stamp(until)]
        if camera:
            query += " AND camera = ?"
            args.append(camera)
        return [(c, float(a), float(b), r, int(n)) for c, a, b, r, n in self.reader.execute(query + " ORDER BY since", args)]

    def newest_stamps(self) -> dict[str, float]:
        """Each camera's newest archived stamp (a restart's hole starts there)."""
        return {c: float(s) for c, s in self.reader.execute("SELECT camera, MAX(last_stamp) FROM chunks GROUP BY camera")}

    def backup(self, destination: str | os.PathLike) -> pathlib.Path:
        """A consistent copy of the archive at ``destination`` (a file, or a folder to put
        archive.sqlite in) through SQLite's online backup: safe while the node writes."""
        return backup_database(self.folder / DB_NAME, destination)

    # -- reading ----------------------------------------------------------------------------------
    def rows(self, since: float = -math.inf, until: float = math.inf, camera: str = "",
             with_keys: bool = False) -> list[ArchivedChunk]:
        """The chunks with a frame stamped inside since..until (of ``camera`` when given), oldest
        first, without payloads."""
        return list(self.iter_rows(since, until, camera, with_keys))

    def iter_rows(self, since: float = -math.inf, until: float = math.inf, camera: str = "",
                  with_keys: bool = False) -> Iterator[ArchivedChunk]:
        """``rows``, one at a time: a caller that needs only the first (``holds``, the oldest
        stamp) reads one row, not a day's ten thousand."""
        columns = ROW_COLUMNS + (", retrieval_key, key_shape" if with_keys else "")
        query, args = span_query(columns, since, until, camera)
        shapes: dict[str, tuple] = {}  # a day's keys come in a few shapes: each parsed once
        for row in self.reader.execute(query + " ORDER BY first_stamp, id", args):
            chunk = _row(row)
            if with_keys and row[10] is not None:
                chunk.key = _key(row[10], row[11], shapes)
            if chunk.overlaps(since, until):
                yield chunk

    def use_index(self, index_model: str) -> None:
        """The frame vectors from now on come from ``index_model``. Vectors another model made
        cannot be ranked against this one's questions: they are dropped (a warning says so), and
        their chunks are searched as unindexed ones are."""
        stored = self.db.execute("SELECT value FROM meta WHERE key = ?", (INDEX_META,)).fetchone()
        with self.db:
            if stored is not None and stored[0] != index_model:
                dropped = self.db.execute("UPDATE chunks SET frame_vectors = NULL, vectors_shape = NULL "
                                          "WHERE frame_vectors IS NOT NULL").rowcount
                if dropped:
                    self.warnings.append(f"archive '{self.folder}' was indexed by '{stored[0]}', this node indexes with "
                                         f"'{index_model}': the index of its {dropped} older chunk(s) is dropped, and "
                                         "a when over them walks them instead")
                    log.warning(self.warnings[-1])
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (INDEX_META, index_model))
        self._index = None

    def frame_index(self, since: float = -math.inf, until: float = math.inf,
                    camera: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """(stamps [N], chunk ids [N], vectors [N, dim] float16, unindexed chunk ids) of every archived
        frame stamped inside since..until (of ``camera``), oldest first; the chunks there without
        vectors are listed apart."""
        return self._cached_index().window(since, until, camera)

    def chunk_table(self, camera: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, cameras, first stamps, last stamps, pinned) of every chunk (of ``camera``), oldest first."""
        return self._cached_index().table(camera)

    def oldest_stamp(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> float:
        """The oldest archived frame stamp inside since..until (of ``camera``); +inf for none."""
        return self._cached_index().oldest(since, until, camera)

    def _cached_index(self) -> IndexCache:
        if self._index is None:
            self._index = self._read_index()
        return self._index

    def _read_index(self) -> IndexCache:
        """Every chunk's frame vectors from disk, once (a day: 0.3 s), into RAM."""
        cache = IndexCache()
        for chunk_id, camera, stamp_text, blob, shape, pinned in self.reader.execute(
                "SELECT id, camera, stamps, frame_vectors, vectors_shape, pinned FROM chunks"):
            vectors = None if blob is None else np.frombuffer(blob, dtype=np.float16).reshape(tuple(json.loads(shape)))
            cache.add(chunk_id, camera, json.loads(stamp_text), vectors, bool(pinned))
        return cache

    def watch_covers(self, question: str, since: float = -math.inf, until: float = math.inf,
                     camera: str = "") -> bool:
        """Whether every chunk with a frame inside since..until (of ``camera``) has a standing answer
        to ``question`` (and there is one): asked in SQL, so a question that never stood costs no
        row's parsing. ``note_watch`` writes each answer as ``"question": p``."""
        if self._watched is None:  # every question that ever stood, read once
            self._watched = {q for (text,) in self.reader.execute("SELECT watch FROM chunks WHERE watch != '{}'")
                             for q in json.loads(text)}
        if question not in self._watched:
            return False
        query, args = span_query("COUNT(*), SUM(instr(watch, ?) = 0)", since, until, camera)
        count, missing = self.reader.execute(query, [json.dumps(question) + ":"] + args).fetchone()
        return bool(count) and not missing

    def frames_between(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> int:
        """How many archived frames are stamped inside since..until (of ``camera``): counted in the
        index's RAM copy, which holds every chunk's stamps (read once, like the vectors)."""
        return self._cached_index().count(since, until, camera)

    def holds(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> bool:
        """Whether a chunk with a frame stamped inside since..until (of ``camera``) is archived."""
        return self._cached_index().count(since, until, camera) > 0

    def ranking_rows(self, camera: str = "", with_keys: bool = True) -> list[ArchivedChunk]:
        """Every chunk (of ``camera``), oldest first, with only what ranking and planning read (id,
        camera, first and last stamp, pinned, key): a question with no window ranks a whole day,
        and parsing every row's stamps for that cost more than the question (docs/archive.md
        "Measured"). ``complete`` fills in the few chosen."""
        if not with_keys:  # the index ranks: the chunks' places come from its RAM copy, no day's read
            return [ArchivedChunk(chunk_id=int(c), camera=str(cam), first_stamp=float(first), last_stamp=float(last),
                                  stamps=[], unit_frames=[], tokens_per_unit=0, pinned=bool(pinned))
                    for c, cam, first, last, pinned in zip(*self._cached_index().table(camera))]
        columns = "id, camera, first_stamp, last_stamp, pinned" + (", retrieval_key, key_shape" if with_keys else "")
        query, args = span_query(columns, -math.inf, math.inf, camera)
        out, shapes = [], {}
        for row in self.reader.execute(query + " ORDER BY first_stamp, id", args):
            chunk = ArchivedChunk(chunk_id=int(row[0]), camera=row[1], first_stamp=float(row[2]),
                                  last_stamp=float(row[3]), stamps=[], unit_frames=[], tokens_per_unit=0,
                                  pinned=bool(row[4]))
            if with_keys and row[5] is not None:
                chunk.key = _key(row[5], row[6], shapes)
            out.append(chunk)
        return out

    def complete(self, rows: list[ArchivedChunk]) -> list[ArchivedChunk]:
        """``rows`` from ``ranking_rows`` as whole rows (their keys kept), in the same order."""
        if not rows:
            return []
        marks = ", ".join("?" * len(rows))
        found = {int(r[0]): _row(r) for r in self.reader.execute(f"SELECT {ROW_COLUMNS} FROM chunks WHERE id IN ({marks})",
                                                              [row.chunk_id for row in rows])}
        missing = [row.chunk_id for row in rows if row.chunk_id not in found]
        if missing:
            raise ArchiveError(f"archived chunk(s) {missing} are gone (dropped by archive_max_bytes)")
        for row in rows:
            found[row.chunk_id].key = row.key
        return [found[row.chunk_id] for row in rows]


    def load(self, rows: list[ArchivedChunk]) -> list[ArchivedChunk]:
        """``rows`` with their payloads (``chunk``), from the RAM buffer where it has them."""
        for row in rows:
            if row.chunk is not None:
                continue
            row.chunk = self.buffer.get(row.chunk_id)
            if row.chunk is not None:
                continue
            found = self.reader.execute("SELECT embeds, embeds_shape, positions, positions_shape FROM chunks WHERE id = ?",
                                    (row.chunk_id,)).fetchone()
            if found is None:
                raise ArchiveError(f"archived chunk {row.chunk_id} is gone (dropped by archive_max_bytes)")
            embeds = unpack_tensor(found[0], found[1], self.dtype)
            positions = unpack_tensor(found[2], found[3], "float32")
            row.chunk = EncodedChunk(row.camera, row.stamps, row.unit_frames, row.tokens_per_unit, embeds, positions)
        return rows

    def stats(self) -> dict:
        """Chunks, bytes held (payloads), the bound, the files' bytes on disk, the free bytes of their
        file system, the oldest and newest stamps, and the folder (the fields of ArchiveStatus)."""
        count, oldest, newest = self.reader.execute("SELECT COUNT(*), MIN(first_stamp), MAX(last_stamp) FROM chunks").fetchone()
        file_bytes = sum(_size(self.folder / (DB_NAME + suffix)) for suffix in ("", "-wal", "-shm"))
        damaged = _damaged_copies(self.folder)
        disk_free = free_bytes(self.folder)
        return {"chunks": int(count), "bytes": self._held_bytes, "max_bytes": self.max_bytes, "file_bytes": file_bytes,
                "disk_free_bytes": disk_free, "oldest_stamp": float(oldest) if oldest is not None else 0.0,
                "newest_stamp": float(newest) if newest is not None else 0.0, "path": str(self.folder),
                # damaged files kept for a person (at most DAMAGED_COPIES), counted apart from the bound
                "damaged_copies": [str(p) for p in damaged], "damaged_bytes": sum(_copy_bytes(p) for p in damaged),
                "holes": int(self.reader.execute("SELECT COUNT(*) FROM holes").fetchone()[0])}

    # -- thumbnails (docs/show.md) ----------------------------------------------------------------
    def thumbnail_near(self, stamp: float, camera: str = "", tolerance: float = math.inf) -> Thumbnail | None:
        """The thumbnail of the archived frame (of ``camera``) nearest ``stamp`` within ``tolerance``
        seconds; None without one. One frame's bytes are read, through the reader connection."""
        return frame_near(self.reader, float(stamp), camera, tolerance)

    def thumbnails_at(self, stamps: list[float], cameras: list[str] | None = None,
                      tolerance: float = 1e-3) -> list[Thumbnail | None]:
        """The thumbnail of each frame stamped ``stamps[i]`` (of ``cameras[i]`` when given, "" any),
        None where the archive has none (dropped by the bound, thumbnails off)."""
        cameras = list(cameras or [])
        return [frame_near(self.reader, float(s), cameras[i] if i < len(cameras) else "", tolerance)
                for i, s in enumerate(stamps)]

    def thumbnails_between(self, since: float = -math.inf, until: float = math.inf,
                           camera: str = "") -> list[Thumbnail]:
        """Every archived thumbnail stamped inside since..until (of ``camera``), oldest first."""
        return frames_between(self.reader, since, until, camera)


# -- helpers ----------------------------------------------------------------------------------------
def _key(blob: bytes, shape: str, shapes: dict[str, tuple]) -> np.ndarray:
    if shape not in shapes:
        shapes[shape] = tuple(json.loads(shape))
    return np.frombuffer(blob, dtype=np.float16).reshape(shapes[shape])


def _row(row) -> ArchivedChunk:
    return ArchivedChunk(chunk_id=int(row[0]), camera=row[1], first_stamp=float(row[2]), last_stamp=float(row[3]),
                         stamps=[float(s) for s in json.loads(row[4])],
                         unit_frames=[tuple(u) for u in json.loads(row[5])], tokens_per_unit=int(row[6]),
                         pinned=bool(row[7]), bytes=int(row[8]), watch=json.loads(row[9]))


def _take_lock(folder: pathlib.Path, owner: str):
    path = folder / LOCK_NAME
    lock_file = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the archive's life
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock_file.seek(0)
        holder = lock_file.read().strip() or "another process"
        lock_file.close()
        raise ArchiveError(f"archive '{folder}' is in use by {holder}: each node needs an archive_path of its own "
                           "(the default is one per node name)") from None
    lock_file.seek(0)
    lock_file.truncate()
    lock_file.write(f"{owner or 'a node'} (pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
    lock_file.flush()
    return lock_file


def _connect(path: pathlib.Path, warnings: list[str], sync: str = "normal") -> sqlite3.Connection:
    """The database, checked; a damaged one is salvaged (what reads is kept) with a warning."""
    try:
        db = _open_db(path, sync)
        verdict = db.execute("PRAGMA quick_check").fetchone()[0]
        if verdict == "ok":
            return db
        db.close()
        reason = verdict
    except sqlite3.DatabaseError as err:
        reason = str(err)
    return _salvage(path, reason, warnings, sync)


def _open_db(path: pathlib.Path, sync: str = "normal") -> sqlite3.Connection:
    fresh = not path.exists() or path.stat().st_size == 0  # a zero-byte file is a new archive: it gets auto_vacuum
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    db.isolation_level = "DEFERRED"  # ``with db`` makes one transaction
    if fresh:
        db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only before the first table
    db.execute("PRAGMA journal_mode = WAL")
    # NORMAL in WAL mode: a commit survives the process dying (kill -9); a power cut may lose the
    # commits since the last checkpoint, never the file. FULL syncs every commit (docs/archive.md "Durability")
    db.execute(f"PRAGMA synchronous = {sync.upper()}")
    # the write-ahead log is folded back every 1 MiB and cut to at most 4 MiB after, so the files on
    # disk stay near archive_max_bytes however long the node runs
    db.execute("PRAGMA wal_autocheckpoint = 256")
    db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
    db.executescript(SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(chunks)")}
    # files from before the index, and from before the thumbnails
    for column in ("frame_vectors BLOB", "vectors_shape TEXT", "thumbnails BLOB", "thumbnail_sizes TEXT"):
        if column.split()[0] not in columns:
            db.execute(f"ALTER TABLE chunks ADD COLUMN {column}")
    return db


def _reader(path: pathlib.Path) -> sqlite3.Connection:
    reader = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    reader.execute("PRAGMA query_only = 1")
    return reader


def _salvage(path: pathlib.Path, reason: str, warnings: list[str], sync: str = "normal") -> sqlite3.Connection:
    """Every row whose pages are all still there, read page by page (salvage.py), streamed into a
    new file in small transactions (RAM holds a batch, not the archive); the damaged file is set
    aside for a person to look at (the newest DAMAGED_COPIES are kept, counted apart)."""
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}.{time.time_ns() % 10**9:09d}")
    for suffix in ("", "-wal", "-shm"):
        part = pathlib.Path(str(path) + suffix)
        if part.exists():
            part.rename(pathlib.Path(str(aside) + suffix))
    db = _open_db(path, sync)
    names = {table: [row[1] for row in db.execute(f"PRAGMA table_info({table})")] for table in ("meta", "chunks", "holes")}
    kept, bad, batch = 0, 0, []

    def write(rows) -> None:
        with db:
            for table, values in rows:
                columns = names[table][:len(values)]  # a row from before a column was added has fewer
                db.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                           values)

    try:
        for table, rowid, values in salvaged_rows(aside):
            if table not in names or len(values) > len(names[table]):
                continue
            if table in ("chunks", "holes"):
                values = [rowid] + values[1:]  # the id column is the rowid: the record holds NULL there
            if table == "chunks" and not _row_is_whole(dict(zip(names["chunks"], values))):
                bad += 1
                continue
            kept += table == "chunks"
            batch.append((table, values))
            if len(batch) >= 16:
                write(batch)
                batch = []
        write(batch)
    except ValueError as err:  # not an SQLite file at all: nothing to read
        reason = f"{reason}; {err}"
    warnings.append(f"archive file '{path}' was damaged ({reason}): kept the {kept} chunk(s) whose pages are intact"
                    + (f", {bad} more had damaged bytes" if bad else "")
                    + f"; the damaged file is at '{aside}' (remove it once looked at: until then /diagnostics "
                    "says the archive was damaged)")
    return db  # the warning is the opener's to log (the node logs each once)


def free_bytes(folder: str | os.PathLike) -> int:
    """The free bytes of the file system ``folder`` is on; 0 when it cannot be read (the folder was
    removed under the node: the diagnostic then says the disk is full)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


def _row_is_whole(row: dict) -> bool:
    """Whether a salvaged chunk's payloads have the bytes their shapes say (a page may read and
    still hold another row's bytes)."""
    try:
        for blob, shape, width in (("embeds", "embeds_shape", None), ("positions", "positions_shape", 4)):
            dims = json.loads(row[shape])
            count = int(np.prod(dims))
            if width is None:
                if len(row[blob]) not in (2 * count, 4 * count):
                    return False
            elif len(row[blob]) != width * count:
                return False
        json.loads(row["stamps"])
        json.loads(row["unit_frames"])
        return isinstance(row["camera"], str)
    except (KeyError, TypeError, ValueError):
        return False


def _give_back_pages(db: sqlite3.Connection) -> None:
    """Free pages back to the file system (docs/archive.md "Space"). ``incremental_vacuum`` frees
    one page per step of its statement, and Python's sqlite3 steps a statement without result
    columns once: so one statement per free page, all in one transaction (one commit)."""
    free = int(db.execute("PRAGMA freelist_count").fetchone()[0])
    if not free:
        return
    db.execute("BEGIN")
    try:
        for _ in range(free):
            db.execute("PRAGMA incremental_vacuum(1)")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _size(path: pathlib.Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _damaged_copies(folder: pathlib.Path) -> list[pathlib.Path]:
    """The damaged files set aside, oldest first (their -wal/-shm go with them)."""
    return sorted((p for p in folder.glob(DB_NAME + ".damaged-*") if not p.name.endswith(("-wal", "-shm"))),
                  key=lambda p: p.stat().st_mtime_ns)


def _copy_bytes(path: pathlib.Path) -> int:
    return sum(_size(pathlib.Path(str(path) + suffix)) for suffix in ("", "-wal", "-shm"))


def _keep_damaged_copies(folder: pathlib.Path, keep: int) -> None:
    """At most ``keep`` damaged files: a robot whose disk keeps tearing does not fill it with them."""
    copies = _damaged_copies(folder)
    for old in copies[:max(len(copies) - keep, 0)]:
        for suffix in ("", "-wal", "-shm"):
            pathlib.Path(str(old) + suffix).unlink(missing_ok=True)
        log.warning("archive: removed the older damaged copy '%s' (at most %d are kept)", old, keep)


def backup_database(source: pathlib.Path, destination: str | os.PathLike) -> pathlib.Path:
    """SQLite's online backup of ``source`` into ``destination`` (a file, or a folder, named or
    without a suffix, for archive.sqlite): a consistent copy of every committed chunk while a writer
    goes on. Returns the file written; ArchiveError when it cannot be."""
    target = pathlib.Path(destination).expanduser()
    if target.is_dir() or not target.suffix:  # a folder: what a node, or streamcache-archive, opens
        target = target / DB_NAME
    if target.resolve() == source.resolve():
        raise ArchiveError(f"backup destination '{target}' is the archive itself")
    partial = target.with_name(target.name + ".partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
        dst = sqlite3.connect(str(partial))
        try:
            # in one step: the snapshot of one read transaction. In steps, every commit the node
            # makes meanwhile restarts the copy, and under a steady stream it might never end
            src.backup(dst)
            dst.execute("PRAGMA journal_mode = DELETE")  # a backup is one file, WAL or not
        finally:
            dst.close()
            src.close()
        partial.replace(target)  # never a half copy under the final name
    except (sqlite3.Error, OSError) as err:
        partial.unlink(missing_ok=True)
        raise ArchiveError(f"archive backup to '{target}' failed: {err}") from None
    return target


def _check_identity(db: sqlite3.Connection, folder: pathlib.Path, identity: dict, cameras: tuple[str, ...],
                    dtype: str) -> None:
    """A new archive takes this model's identity; an old one must have it, and hold no camera this
    node does not have."""
    stored = dict(db.execute("SELECT key, value FROM meta").fetchall())
    wanted = {"format": str(FORMAT), "dtype": dtype, **{k: str(v) for k, v in identity.items()}}
    if not stored:
        with db:
            db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", sorted(wanted.items()))
        return
    for key, value in wanted.items():
        if stored.get(key) != value:
            raise ArchiveError(f"archive '{folder}' was written with {key} '{stored.get(key)}', this node has '{value}': "
                               "its chunks cannot be recalled here; give this node another archive_path, or move "
                               "that folder away")
    if cameras:
        held = [c for (c,) in db.execute("SELECT DISTINCT camera FROM chunks").fetchall()]
        foreign = [c for c in held if c not in cameras]
        if foreign:
            raise ArchiveError(f"archive '{folder}' holds frames of camera(s) {', '.join(repr(c) for c in foreign)} "
                               f"that this node does not have (its cameras: {', '.join(repr(c) for c in cameras)}); "
                               "give this node another archive_path, or configure those cameras")
