"""The archive's SQLite file: made, opened, checked, salvaged when damaged, backed up; the lock
that keeps it one writer's (docs/archive.md "The store", "Durability").

    lock = take_lock(folder, owner)                 # flock: released by the kernel however the process dies
    db = connect(folder / DB_NAME, warnings, sync)  # WAL, checked; a damaged file is salvaged
    check_identity(db, folder, identity, cameras, dtype)

Plain functions over a folder and ``sqlite3`` connections; ``store.py`` holds the rows.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import pathlib
import shutil
import sqlite3
import time

import numpy as np

from ...errors import ArchiveError, ArchiveMismatch
from .salvage import salvaged_rows

FORMAT = 1
DB_NAME = "archive.sqlite"
LOCK_NAME = "archive.lock"
WAL_LIMIT_BYTES = 4 << 20
DAMAGED_COPIES = 2  # damaged files kept for a person to look at: the newest ones, counted apart from the bound
SYNC_MODES = ("normal", "full")  # archive_sync (docs/archive.md "Durability")
INDEX_META = "index_model"  # which dual encoder made the frame vectors: another one's cannot be compared
# the id the next chunk takes: ids are never reused, not after a merge, the bound or a reset, so an
# id a question planned with names that chunk or none (docs/archive.md "The store")
NEXT_ID_META = "next_chunk_id"
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
    thumbnail_sizes TEXT,              -- JSON: each frame's JPEG byte count, 0 for none
    frames BLOB,                       -- archive_content frames: every frame's JPEG at the model's input
    frame_sizes TEXT,                  --   size, in place of the embeddings (docs/archive.md "What a chunk keeps")
    poses TEXT,                        -- JSON: every frame's [x, y, z, qx, qy, qz, qw] or null (docs/places.md)
    pose_frame TEXT                    --   the frame they are in
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
# the floor each chunk's frames were taken on, an R*Tree beside the rows: a place question reads the
# chunks whose extent meets its disc, not a day's rows. Triggers keep it in each chunk's own
# transaction, whatever writes or deletes the row (append, merge, bound, reset, salvage); poses
# filled in late write it themselves (poses.py). Short: salvage.py reads the schema from page 1 alone.
PLACES_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS chunk_extent USING rtree(id, min_x, max_x, min_y, max_y);
CREATE TRIGGER IF NOT EXISTS chunk_extent_added AFTER INSERT ON chunks
WHEN new.poses IS NOT NULL AND EXISTS (SELECT 1 FROM json_each(new.poses) WHERE type = 'array')
BEGIN
    INSERT INTO chunk_extent SELECT new.id, min(json_extract(value, '$[0]')), max(json_extract(value, '$[0]')),
        min(json_extract(value, '$[1]')), max(json_extract(value, '$[1]')) FROM json_each(new.poses)
        WHERE type = 'array';
END;
CREATE TRIGGER IF NOT EXISTS chunk_extent_gone AFTER DELETE ON chunks
BEGIN
    DELETE FROM chunk_extent WHERE id = old.id;
END;
"""


def take_lock(folder: pathlib.Path, owner: str):
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


def connect(path: pathlib.Path, warnings: list[str], sync: str = "normal") -> sqlite3.Connection:
    """The database, checked; a damaged one is salvaged (what reads is kept) with a warning."""
    try:
        db = open_db(path, sync)
        verdict = db.execute("PRAGMA quick_check").fetchone()[0]
        if verdict == "ok":
            return db
        db.close()
        reason = verdict
    except sqlite3.DatabaseError as err:
        reason = str(err)
    return salvage(path, reason, warnings, sync)


def open_db(path: pathlib.Path, sync: str = "normal") -> sqlite3.Connection:
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
    for column in ("frame_vectors BLOB", "vectors_shape TEXT", "thumbnails BLOB", "thumbnail_sizes TEXT", "frames BLOB",
                   "frame_sizes TEXT"):
        if column.split()[0] not in columns:
            db.execute(f"ALTER TABLE chunks ADD COLUMN {column}")
    for column in ("poses TEXT", "pose_frame TEXT"):  # files from before poses: their frames have none
        if column.split()[0] not in columns:
            db.execute(f"ALTER TABLE chunks ADD COLUMN {column}")
    db.executescript(PLACES_SCHEMA)
    return db


def reader(path: pathlib.Path) -> sqlite3.Connection:
    reader = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    reader.execute("PRAGMA query_only = 1")
    return reader


def salvage(path: pathlib.Path, reason: str, warnings: list[str], sync: str = "normal") -> sqlite3.Connection:
    """Every row whose pages are all still there, read page by page (salvage.py), streamed into a
    new file in small transactions (RAM holds a batch, not the archive); the damaged file is set
    aside for a person to look at (the newest DAMAGED_COPIES are kept, counted apart)."""
    aside = set_aside(path.parent, "damaged")
    db = open_db(path, sync)
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
            if table == "chunks" and not row_is_whole(dict(zip(names["chunks"], values))):
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


def row_is_whole(row: dict) -> bool:
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


def give_back_pages(db: sqlite3.Connection) -> None:
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


def file_size(path: pathlib.Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def damaged_copies(folder: pathlib.Path, kind: str = "damaged") -> list[pathlib.Path]:
    """The files set aside (``kind``: "damaged", or "set-aside" for another model's or cameras'),
    oldest first (their -wal/-shm go with them)."""
    return sorted((p for p in folder.glob(f"{DB_NAME}.{kind}-*") if not p.name.endswith(("-wal", "-shm"))),
                  key=lambda p: p.stat().st_mtime_ns)


def set_aside(folder: pathlib.Path, kind: str) -> pathlib.Path:
    """The archive's files renamed ``archive.sqlite.<kind>-<date>`` (its -wal and -shm with it), for
    a new archive to start in their place; returns the new name. At most ``DAMAGED_COPIES`` of a
    kind are kept (``keep_damaged_copies``)."""
    path = folder / DB_NAME
    aside = path.with_name(f"{path.name}.{kind}-{time.strftime('%Y%m%d-%H%M%S')}.{time.time_ns() % 10**9:09d}")
    for suffix in ("", "-wal", "-shm"):
        part = pathlib.Path(str(path) + suffix)
        if part.exists():
            part.rename(pathlib.Path(str(aside) + suffix))
    keep_damaged_copies(folder, DAMAGED_COPIES, kind)
    return aside


def copy_bytes(path: pathlib.Path) -> int:
    return sum(file_size(pathlib.Path(str(path) + suffix)) for suffix in ("", "-wal", "-shm"))


def keep_damaged_copies(folder: pathlib.Path, keep: int, kind: str = "damaged") -> None:
    """At most ``keep`` files set aside of a ``kind``: a robot whose disk keeps tearing, or whose model
    keeps changing, does not fill it with them."""
    copies = damaged_copies(folder, kind)
    for old in copies[:max(len(copies) - keep, 0)]:
        for suffix in ("", "-wal", "-shm"):
            pathlib.Path(str(old) + suffix).unlink(missing_ok=True)
        log.warning("archive: removed the older %s copy '%s' (at most %d are kept)", kind, old, keep)


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


def check_identity(db: sqlite3.Connection, folder: pathlib.Path, identity: dict, cameras: tuple[str, ...],
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
            raise ArchiveMismatch(f"archive '{folder}' was written with {key} '{stored.get(key)}', this node has '{value}': "
                               "its chunks cannot be recalled here; give this node another archive_path, or move "
                               "that folder away")
    if cameras:
        held = [c for (c,) in db.execute("SELECT DISTINCT camera FROM chunks").fetchall()]
        foreign = [c for c in held if c not in cameras]
        if foreign:
            raise ArchiveMismatch(f"archive '{folder}' holds frames of camera(s) {', '.join(repr(c) for c in foreign)} "
                               f"that this node does not have (its cameras: {', '.join(repr(c) for c in cameras)}); "
                               "give this node another archive_path, or configure those cameras")


def next_chunk_id(db: sqlite3.Connection) -> int:
    """The id the next chunk takes: past every id given so far (the meta row; an archive from before
    it, or one salvaged without it, from its newest row)."""
    stored = db.execute("SELECT value FROM meta WHERE key = ?", (NEXT_ID_META,)).fetchone()
    newest = int(db.execute("SELECT COALESCE(MAX(id), 0) FROM chunks").fetchone()[0])
    return max(int(stored[0]) if stored else 0, newest + 1)


def switch_index(db: sqlite3.Connection, folder: pathlib.Path, index_model: str) -> tuple[list[str], int]:
    """(what to warn of, rows whose vectors were dropped): the archive's frame vectors from now on
    come from ``index_model`` (a name @ a hash of its weights). Vectors another model made cannot be
    ranked against this one's questions: dropped. An archive indexed before identities held a hash
    names its model by folder alone: taken as this one when the names match (nothing else can be
    known of it), with a warning. The same weights in a folder of another name are the same index."""
    stored = db.execute("SELECT value FROM meta WHERE key = ?", (INDEX_META,)).fetchone()
    stored = stored[0] if stored is not None else None
    said, dropped = [], 0
    with db:
        if stored is not None and stored != index_model and not _same_weights(stored, index_model):
            if "@" not in stored and index_model.split("@")[0] == stored:
                said.append(f"archive '{folder}' was indexed by '{stored}' before indexes were known by their "
                            f"weights: taken as this node's '{index_model}'")
            else:
                dropped = db.execute("UPDATE chunks SET frame_vectors = NULL, vectors_shape = NULL "
                                     "WHERE frame_vectors IS NOT NULL").rowcount
            if dropped:
                said.append(f"archive '{folder}' was indexed by '{stored}', this node indexes with '{index_model}': "
                            f"the index of its {dropped} older chunk(s) is dropped, and a when over them walks them "
                            "instead")
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (INDEX_META, index_model))
    return said, dropped


def _same_weights(one: str, other: str) -> bool:
    """Whether two index identities (name@hash) name the same weights, in folders of any name."""
    return "@" in one and "@" in other and one.rpartition("@")[2] == other.rpartition("@")[2]
