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

from ...errors import ArchiveError
from .index_cache import IndexCache
from .record import ArchivedChunk, EncodedChunk, STORE_DTYPES, pack_tensor, unpack_tensor

FORMAT = 1
DB_NAME = "archive.sqlite"
LOCK_NAME = "archive.lock"
WAL_LIMIT_BYTES = 4 << 20
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
    vectors_shape TEXT
);
CREATE INDEX IF NOT EXISTS chunks_by_stamp ON chunks (last_stamp);
-- rows come oldest first: the first of a span (holds, the oldest stamp) without sorting a day
CREATE INDEX IF NOT EXISTS chunks_in_order ON chunks (first_stamp, id);
"""
ROW_COLUMNS = "id, camera, first_stamp, last_stamp, stamps, unit_frames, tokens_per_unit, pinned, bytes, watch"
INDEX_META = "index_model"  # which dual encoder made the frame vectors: another one's cannot be compared


class ChunkBuffer:
    """The newest chunks' payloads in RAM, bounded by bytes: recall of recent chunks reads no disk,
    and the RAM this takes never grows past ``max_bytes`` (every chunk is on disk already)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = int(max_bytes), 0
        self.items: OrderedDict[int, tuple[EncodedChunk, int]] = OrderedDict()

    def put(self, chunk_id: int, chunk: EncodedChunk, size: int) -> None:
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
             dtype: str = "float16", max_bytes: int = 1 << 30, buffer_bytes: int = 32 << 20) -> "ArchiveStore":
        """Open (or create) the archive in ``folder``. ArchiveError, with nothing changed, when the
        folder cannot be made, another process holds the archive, or it was written by another
        model (``identity``) or holds cameras not in ``cameras`` (when given)."""
        if dtype not in STORE_DTYPES:
            raise ArchiveError(f"archive dtype must be one of {', '.join(STORE_DTYPES)}, got '{dtype}'")
        if int(max_bytes) < 1:
            raise ArchiveError(f"archive_max_bytes must be >= 1, got {max_bytes}")
        folder = pathlib.Path(folder).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ArchiveError(f"archive_path '{folder}' cannot be used as a folder: {err.strerror or err}") from None
        if not folder.is_dir():
            raise ArchiveError(f"archive_path '{folder}' is not a folder")
        lock_file = _take_lock(folder, owner)
        try:
            warnings: list[str] = []
            db = _connect(folder / DB_NAME, warnings)
            _check_identity(db, folder, identity, cameras, dtype)
            return cls(folder, db, lock_file, dtype, max_bytes, buffer_bytes, warnings)
        except BaseException:
            lock_file.close()  # releases the lock: a refused open leaves the archive to others
            raise

    def close(self) -> None:
        if getattr(self, "reader", None) is not None:
            self.reader.close()
            self.reader = None
        if self.db is not None:
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
        size = len(embeds) + len(positions) + (len(key_blob) if key_blob else 0) + len(vectors_blob or b"")
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
                "vectors_shape, watch) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (chunk.camera, min(chunk.stamps), max(chunk.stamps), json.dumps(chunk.stamps),
                 json.dumps([list(u) for u in chunk.unit_frames]), chunk.tokens_per_unit, embeds, embeds_shape,
                 positions, positions_shape, key_blob, key_shape, int(pinned), size, vectors_blob, vectors_shape,
                 json.dumps(watch)))
        chunk_id = int(cursor.lastrowid)
        self._held_bytes += size - freed
        for part in replacing:
            self.buffer.drop(part)
            if self._index is not None:
                self._index.drop(part)
        # the buffer holds what the disk holds (the store's dtype), so a recall is the same from either
        stored = dataclasses.replace(chunk, embeds=unpack_tensor(embeds, embeds_shape, self.dtype), frame_vectors=None)
        self.buffer.put(chunk_id, stored, size)
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
        dropped = []
        with self.db:
            for chunk_id, size in self.db.execute("SELECT id, bytes FROM chunks WHERE pinned = 0 ORDER BY id").fetchall():
                if self._held_bytes <= self.max_bytes:
                    break
                self.db.execute("DELETE FROM chunks WHERE id = ?", (chunk_id,))
                self._held_bytes -= size
                dropped.append(chunk_id)
        for chunk_id in dropped:
            self.buffer.drop(chunk_id)
            if self._index is not None:
                self._index.drop(chunk_id)
        if dropped:
            # the freed pages go back to the file system, so the file stays near the bound
            self.db.execute("PRAGMA incremental_vacuum")

    def clear(self) -> None:
        """Forget every chunk (reset_memory); the file stays, small again."""
        with self.db:
            self.db.execute("DELETE FROM chunks")
        self.db.execute("PRAGMA incremental_vacuum")
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._held_bytes = 0
        self.buffer.clear()
        self._index = None

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
        query, args = self._span_query(columns, since, until, camera)
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
        query, args = self._span_query("COUNT(*), SUM(instr(watch, ?) = 0)", since, until, camera)
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
        query, args = self._span_query(columns, -math.inf, math.inf, camera)
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

    @staticmethod
    def _span_query(columns: str, since: float, until: float, camera: str) -> tuple[str, list]:
        query = f"SELECT {columns} FROM chunks WHERE last_stamp >= ? AND first_stamp <= ?"
        args: list = [_sql_stamp(since), _sql_stamp(until)]
        if camera:
            query += " AND camera = ?"
            args.append(camera)
        return query, args

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
        file_bytes = sum(p.stat().st_size for p in self.folder.glob(DB_NAME + "*") if p.is_file())
        try:
            disk_free = shutil.disk_usage(self.folder).free
        except OSError:  # the folder was removed under the node: the diagnostic then says the disk is full
            disk_free = 0
        return {"chunks": int(count), "bytes": self._held_bytes, "max_bytes": self.max_bytes, "file_bytes": file_bytes,
                "disk_free_bytes": disk_free, "oldest_stamp": float(oldest) if oldest is not None else 0.0,
                "newest_stamp": float(newest) if newest is not None else 0.0, "path": str(self.folder)}


# -- helpers ----------------------------------------------------------------------------------------
def _sql_stamp(stamp: float) -> float:
    return max(min(stamp, 1e300), -1e300)  # SQLite has no infinities


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


def _connect(path: pathlib.Path, warnings: list[str]) -> sqlite3.Connection:
    """The database, checked; a damaged one is salvaged (what reads is kept) with a warning."""
    try:
        db = _open_db(path)
        verdict = db.execute("PRAGMA quick_check").fetchone()[0]
        if verdict == "ok":
            return db
        db.close()
        reason = verdict
    except sqlite3.DatabaseError as err:
        reason = str(err)
    return _salvage(path, reason, warnings)


def _open_db(path: pathlib.Path) -> sqlite3.Connection:
    fresh = not path.exists()
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    db.isolation_level = "DEFERRED"  # ``with db`` makes one transaction
    if fresh:
        db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only before the first table
    db.execute("PRAGMA journal_mode = WAL")
    # NORMAL in WAL mode: a commit survives the process dying (kill -9); a power cut may lose the
    # last commits, never the file (docs/archive.md "Durability")
    db.execute("PRAGMA synchronous = NORMAL")
    # the write-ahead log is folded back every 1 MiB and cut to at most 4 MiB after, so the files on
    # disk stay near archive_max_bytes however long the node runs
    db.execute("PRAGMA wal_autocheckpoint = 256")
    db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
    db.executescript(SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(chunks)")}
    for column in ("frame_vectors BLOB", "vectors_shape TEXT"):  # files from before the index
        if column.split()[0] not in columns:
            db.execute(f"ALTER TABLE chunks ADD COLUMN {column}")
    return db


def _reader(path: pathlib.Path) -> sqlite3.Connection:
    reader = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    reader.execute("PRAGMA query_only = 1")
    return reader


def _salvage(path: pathlib.Path, reason: str, warnings: list[str]) -> sqlite3.Connection:
    """Copy every chunk that still reads, oldest first, up to the first that does not, into a new
    file; the damaged one is kept beside it for a person to look at."""
    kept_rows, meta, names = [], [], []
    try:
        old = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            meta = old.execute("SELECT key, value FROM meta").fetchall()
            names = [row[1] for row in old.execute("PRAGMA table_info(chunks)")]
            for (chunk_id,) in old.execute("SELECT id FROM chunks ORDER BY id").fetchall():
                kept_rows.append(old.execute("SELECT * FROM chunks WHERE id = ?", (chunk_id,)).fetchone())
        except sqlite3.DatabaseError:
            pass  # the damaged part: everything after it is cut
        finally:
            old.close()
    except sqlite3.DatabaseError:
        pass
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    for suffix in ("", "-wal", "-shm"):
        part = pathlib.Path(str(path) + suffix)
        if part.exists():
            part.rename(pathlib.Path(str(aside) + suffix))
    db = _open_db(path)
    with db:
        db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta)
        if kept_rows:
            marks = ", ".join("?" * len(kept_rows[0]))  # by name: a file from before the index has fewer columns
            db.executemany(f"INSERT INTO chunks ({', '.join(names)}) VALUES ({marks})", kept_rows)
    warnings.append(f"archive file '{path}' was damaged ({reason}): kept the {len(kept_rows)} chunk(s) that read, "
                    f"cut the rest; the damaged file is at '{aside}'")
    log.warning(warnings[-1])
    return db


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
