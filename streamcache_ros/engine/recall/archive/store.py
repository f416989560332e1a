"""The archive on disk: one SQLite file in WAL mode, a chunk a row, a transaction a chunk.

    store = ArchiveStore.open(folder, identity={"model_id": ..., "config_hash": ...}, cameras=(...))
    chunk_id = store.append(encoded, key)          # committed: survives kill -9 from here on
    rows = store.rows(since=10.0, until=40.0)      # what is held, without payloads
    store.load(rows)                               # payloads from the RAM buffer or the disk

Why SQLite (docs/archive.md "The store"): one file the ``sqlite3`` shell opens; a torn write is a
rolled-back transaction; WAL lets a reader look while the node writes; a damaged file is salvaged
(sqlite_file.py). One writer: a ``flock`` held while the node runs, released by the kernel however it dies.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import sqlite3
import threading
from collections.abc import Iterator

import numpy as np

from ... import failpoints
from ...errors import ArchiveError
from .buffer import ChunkBuffer
from .index_cache import IndexCache
from .record import ROW_COLUMNS, ArchivedChunk, EncodedChunk, STORE_DTYPES, key_of, packed_row, row_of, unpack_tensor
from .spans import span_query, sql_stamp
from .thumbnails import Thumbnail, frame_near, frames_between
from .thumbnails import unpack as unpack_thumbnails
# names the rest of the package (and older callers) read here
from .sqlite_file import (DAMAGED_COPIES, DB_NAME, LOCK_NAME, NEXT_ID_META, SYNC_MODES, WAL_LIMIT_BYTES,
                          backup_database, check_identity, connect, copy_bytes, damaged_copies, file_size, free_bytes,
                          give_back_pages, keep_damaged_copies, next_chunk_id, reader, switch_index, take_lock)

log = logging.getLogger("streamcache_ros.archive")
__all__ = ["ArchiveStore", "ChunkBuffer", "DAMAGED_COPIES", "DB_NAME", "LOCK_NAME", "WAL_LIMIT_BYTES", "backup_database",
           "free_bytes"]



class ArchiveStore:
    def __init__(self, folder: pathlib.Path, db: sqlite3.Connection, lock_file, dtype: str, max_bytes: int,
                 buffer_bytes: int, warnings: list[str]):
        self.folder, self.db, self._lock_file = folder, db, lock_file
        # reads go through a connection of their own: a question's replay reads off the turn lock
        # while ingest writes through ``db`` (WAL: a reader sees every committed chunk, never half one)
        self.reader = reader(folder / DB_NAME)
        self.dtype, self.max_bytes = dtype, int(max_bytes)
        self.buffer = ChunkBuffer(buffer_bytes)
        self.warnings = warnings  # what opening found and mended: the node logs each as a WARN
        self._held_bytes = int(db.execute("SELECT COALESCE(SUM(bytes), 0) FROM chunks").fetchone()[0])
        self._index: IndexCache | None = None  # read from disk at the first ranking, then kept in step
        # held by every write (the commit and the RAM index's update together) and while the RAM index
        # is first read: a read from a snapshot older than a commit would miss that chunk for good
        self._write_lock = threading.RLock()
        self._next_id = next_chunk_id(db)
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
        lock_file, db = take_lock(folder, owner), None
        try:
            warnings: list[str] = []
            db = connect(folder / DB_NAME, warnings, sync)
            check_identity(db, folder, identity, cameras, dtype)
            keep_damaged_copies(folder, DAMAGED_COPIES)
            return cls(folder, db, lock_file, dtype, max_bytes, buffer_bytes, warnings)
        except BaseException:
            if db is not None:
                db.close()  # its -wal and -shm go with it: a refused open leaves the folder as it was
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
                self.fold_log()
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
        """``chunk`` in place of its parts ``chunk_ids``, in one transaction (a reader sees the parts or
        the whole); pinned when a part was; its standing answers each question's best over the parts."""
        return self._write(chunk, key, [int(c) for c in chunk_ids])

    def _write(self, chunk: EncodedChunk, key: np.ndarray | None, replacing: list[int]) -> int:
        row = packed_row(chunk, key, self.dtype)
        with self._write_lock:
            chunk_id = self._commit(chunk.camera, row, replacing)
            for part in replacing:
                self.buffer.drop(part)
                if self._index is not None:
                    self._index.drop(part)
            # the buffer holds what the disk holds (the store's dtype), so a recall is the same from either
            embeds = None if chunk.needs_encoding else unpack_tensor(row["embeds"], row["embeds_shape"], self.dtype)
            stored = dataclasses.replace(chunk, embeds=embeds, frame_vectors=None,
                                         thumbnails=None)  # recall never reads them: not in RAM
            self.buffer.put(chunk_id, stored)
            if self._index is not None:
                vectors = row["frame_vectors"]
                self._index.add(chunk_id, chunk.camera, chunk.stamps, None if vectors is None else np.frombuffer(
                    vectors, np.float16).reshape(json.loads(row["vectors_shape"])), bool(row["pinned"]))
            self._keep_within_bound()
            self._keep_log_within_cap()
            return chunk_id

    def _keep_log_within_cap(self) -> None:
        """The write-ahead log folded back past half its cap: SQLite's own checkpoints cannot start it
        over while a reader is in it (it grew to 7.5 MB); TRUNCATE waits for the readers in flight."""
        try:
            size = os.path.getsize(self.folder / (DB_NAME + "-wal"))
        except OSError:
            return
        if size > WAL_LIMIT_BYTES // 2:
            self.fold_log()

    def _commit(self, camera: str, row: dict, replacing: list[int]) -> int:
        """``row`` (``_packed``) in one transaction, in place of the chunks ``replacing``; its id."""
        chunk_id, freed, watch = self._next_id, 0, {}
        with self.db:  # the chunk and its index entry in one transaction: never one without the other
            pinned = self.db.execute("SELECT 1 FROM chunks WHERE camera = ? LIMIT 1", (camera,)).fetchone() is None
            for part, part_pinned, part_watch, part_bytes in self.db.execute(
                    f"SELECT id, pinned, watch, bytes FROM chunks WHERE id IN ({', '.join('?' * len(replacing))})",
                    replacing).fetchall() if replacing else []:
                pinned = pinned or bool(part_pinned)
                for question, p in json.loads(part_watch).items():
                    watch[question] = max(watch.get(question, 0.0), p)
                freed += int(part_bytes)
                self.db.execute("DELETE FROM chunks WHERE id = ?", (part,))
            row.update(id=chunk_id, pinned=int(pinned), watch=json.dumps(watch))
            self.db.execute(f"INSERT INTO chunks ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (NEXT_ID_META, str(chunk_id + 1)))
            failpoints.hit("archive", step="insert")
        self._next_id = chunk_id + 1
        self._held_bytes += row["bytes"] - freed
        return chunk_id

    def change(self, write):
        """``write(db)`` in one transaction under the write lock (a chunk's poses filled in late: poses.py)."""
        with self._write_lock, self.db:
            return write(self.db)

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
        """The oldest unpinned chunks deleted until the bytes held are within the bound (under the
        write lock: the RAM index drops them in step)."""
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
            give_back_pages(self.db)

    def clear(self) -> int:
        """Forget every chunk and hole (reset_memory); the file stays, small again, and the ids go on
        from where they were. Returns the chunks deleted."""
        with self._write_lock:
            with self.db:
                deleted = self.db.execute("DELETE FROM chunks").rowcount
                self.db.execute("DELETE FROM holes")
            give_back_pages(self.db)
            self.fold_log()
            self._held_bytes = 0
            self.buffer.clear()
            self._index = IndexCache()  # known to be empty: kept in step from the next chunk on
            self._watched = None
            return int(deleted)

    def fold_log(self) -> None:
        """The write-ahead log folded back into the file and cut to nothing, after a write far larger
        than a chunk's (a reset, an index dropped): at rest the log stays inside WAL_LIMIT_BYTES."""
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

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
            chunk = row_of(row)
            if with_keys and row[10] is not None:
                chunk.key = key_of(row[10], row[11], shapes)
            if chunk.overlaps(since, until):
                yield chunk

    def use_index(self, index_model: str) -> None:
        """The frame vectors from now on come from ``index_model`` (the dual encoder's identity: its
        folder's name and a hash of its weights and config, ``RetrievalEncoder.identity``); another
        model's are dropped, and their chunks searched as unindexed ones are (``switch_index``)."""
        with self._write_lock:
            said, dropped = switch_index(self.db, self.folder, index_model)
            for line in said:
                self.warnings.append(line)
                log.warning(line)
            if dropped:
                self.fold_log()  # every indexed row was written again: a log of their size otherwise stays
            self._index = None

    def frame_index(self, since: float = -math.inf, until: float = math.inf,
                    camera: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """(stamps [N], chunk ids [N], vectors [N, dim] float16, unindexed chunk ids) of every archived
        frame stamped inside since..until (of ``camera``), oldest first; the chunks there without
        vectors are listed apart."""
        return self._cached_index().window(since, until, camera)

    def frame_cosines(self, query: np.ndarray, since: float = -math.inf, until: float = math.inf, camera: str = "",
                      margin: int = 0):
        """``IndexCache.cosines``: the window's (and ``margin`` frames either side) frames ranked
        against ``query``; None unless every chunk inside is indexed and one is there."""
        return self._cached_index().cosines(query, since, until, camera, margin)

    def index_covers(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> bool:
        return self._cached_index().covers(since, until, camera)

    def chunk_table(self, camera: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, cameras, first stamps, last stamps, pinned) of every chunk (of ``camera``), oldest first."""
        return self._cached_index().table(camera)

    def oldest_stamp(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> float:
        """The oldest archived frame stamp inside since..until (of ``camera``); +inf for none."""
        return self._cached_index().oldest(since, until, camera)

    def newest_stamp(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> float:
        """The newest archived frame stamp inside since..until (of ``camera``); -inf for none."""
        return self._cached_index().newest(since, until, camera)

    def _cached_index(self) -> IndexCache:
        index = self._index
        if index is not None:
            return index
        with self._write_lock:  # no commit between the read and the cache being there to keep in step
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
                chunk.key = key_of(row[5], row[6], shapes)
            out.append(chunk)
        return out

    def complete(self, rows: list[ArchivedChunk]) -> list[ArchivedChunk]:
        """``rows`` from ``ranking_rows`` as whole rows (their keys kept), in the same order."""
        if not rows:
            return []
        marks = ", ".join("?" * len(rows))
        found = {int(r[0]): row_of(r) for r in self.reader.execute(f"SELECT {ROW_COLUMNS} FROM chunks WHERE id IN ({marks})",
                                                              [row.chunk_id for row in rows])}
        missing = [row.chunk_id for row in rows if row.chunk_id not in found]
        if missing:
            raise ArchiveError(f"archived chunk(s) {missing} are gone (dropped by archive_max_bytes)")
        for row in rows:
            found[row.chunk_id].key = row.key
        return [found[row.chunk_id] for row in rows]

    def current(self, rows: list[ArchivedChunk]) -> tuple[list[ArchivedChunk], list[ArchivedChunk]]:
        """(``rows`` as the archive holds them now, the rows that are gone): a question plans its rows,
        then reads them off the turn lock, and meanwhile a chunk may have been made whole from its
        parts (its parts' rows replaced by one) or dropped by the bound. A part is read as the whole
        chunk that holds its frames now (once, however many of its parts were planned); a dropped
        chunk is gone. Whole rows, oldest first, payloads aside (docs/archive.md "Questions never
        stop the cameras")."""
        if not rows:
            return [], []
        marks = ", ".join("?" * len(rows))
        held = {int(r[0]): row_of(r) for r in self.reader.execute(
            f"SELECT {ROW_COLUMNS} FROM chunks WHERE id IN ({marks})", [row.chunk_id for row in rows])}
        now, gone = dict(held), []
        for row in rows:
            if row.chunk_id in held:
                continue
            query, args = span_query(ROW_COLUMNS, row.first_stamp, row.last_stamp, row.camera)
            wanted = set(row.stamps) or None  # light rows carry no stamps: their span decides
            holders = [row_of(r) for r in self.reader.execute(query, args)]
            holders = [h for h in holders if wanted is None or wanted & set(h.stamps)]
            if not holders:
                gone.append(row)
            for holder in holders:
                now.setdefault(holder.chunk_id, holder)
        return sorted(now.values(), key=lambda r: (r.first_stamp, r.chunk_id)), gone

    def load(self, rows: list[ArchivedChunk]) -> list[ArchivedChunk]:
        """``rows`` with their payloads (``chunk``), from the RAM buffer where it has them."""
        for row in rows:
            if row.chunk is not None:
                continue
            row.chunk = self.buffer.get(row.chunk_id)
            if row.chunk is not None:
                continue
            found = self.reader.execute("SELECT embeds, embeds_shape, positions, positions_shape, frames, frame_sizes "
                                        "FROM chunks WHERE id = ?", (row.chunk_id,)).fetchone()
            if found is None:
                raise ArchiveError(f"archived chunk {row.chunk_id} is gone (dropped by archive_max_bytes)")
            if found[4] is not None:  # kept as frames: encoded again by whoever replays it
                row.chunk = EncodedChunk(row.camera, row.stamps, row.unit_frames, row.tokens_per_unit, None, None,
                                         frames=unpack_thumbnails(found[4], found[5]))
                continue
            embeds = unpack_tensor(found[0], found[1], self.dtype)
            positions = unpack_tensor(found[2], found[3], "float32")
            row.chunk = EncodedChunk(row.camera, row.stamps, row.unit_frames, row.tokens_per_unit, embeds, positions)
        return rows

    def stats(self) -> dict:
        """Chunks, bytes held (payloads), the bound, the files' bytes on disk, the free bytes of their
        file system, the oldest and newest stamps, and the folder (the fields of ArchiveStatus)."""
        count, oldest, newest = self.reader.execute("SELECT COUNT(*), MIN(first_stamp), MAX(last_stamp) FROM chunks").fetchone()
        file_bytes = sum(file_size(self.folder / (DB_NAME + suffix)) for suffix in ("", "-wal", "-shm"))
        damaged = damaged_copies(self.folder)
        disk_free = free_bytes(self.folder)
        return {"chunks": int(count), "bytes": self._held_bytes, "max_bytes": self.max_bytes, "file_bytes": file_bytes,
                "disk_free_bytes": disk_free, "oldest_stamp": float(oldest) if oldest is not None else 0.0,
                "newest_stamp": float(newest) if newest is not None else 0.0, "path": str(self.folder),
                # damaged files kept for a person (at most DAMAGED_COPIES), counted apart from the bound
                "damaged_copies": [str(p) for p in damaged], "damaged_bytes": sum(copy_bytes(p) for p in damaged),
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
