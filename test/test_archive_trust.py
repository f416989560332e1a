"""An archive a robot can trust (docs/reliability.md, docs/archive.md "Holes"): a torn tail keeps the
chunks its intact pages hold, a clean close leaves one file, a reset shrinks it, a full disk is
counted, warned about once and named as a hole, the bound and a restart leave named holes, damaged
copies are bounded and counted apart, a backup is taken while the archive is written, and 12 random
kills during writes (each recorded where it landed) and 2 power cuts per archive_sync lose no acknowledged chunk
(bench/crash_kills.py, short). No model: chunks of random tensors; a Session where its rules need one."""
from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest
import torch

from streamcache_ros import world
from streamcache_ros.engine import failpoints
from streamcache_ros.engine.adapters.models import resolve_model_path
from streamcache_ros.engine.errors import ChunkError
from streamcache_ros.engine.factory import build_session
from streamcache_ros.engine.recall.archive import DB_NAME, Archive, ArchiveSettings
from streamcache_ros.engine.recall.archive.store import DAMAGED_COPIES, ChunkBuffer, ArchiveStore

from test_archive_store import IDENTITY, chunk, open_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def filled(folder, count: int, **kw) -> ArchiveStore:
    store = open_store(folder, dtype="float32", **kw)
    for i in range(count):
        store.append(chunk(i, hidden=64))
    return store


def test_a_torn_tail_keeps_the_chunks_its_intact_pages_hold(tmp_path):
    filled(tmp_path / "a", 200).close()
    whole = (tmp_path / "a" / DB_NAME).read_bytes()
    page = 4096
    cut = 10 * page
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / DB_NAME).write_bytes(whole[:-cut])
    store = open_store(tmp_path / "b", dtype="float32")
    kept = store.load(store.rows())
    # a chunk is about half a page: the ten pages cut held about twenty of them, no more
    assert 200 - 30 <= len(kept) < 200
    assert "kept the" in store.warnings[0] and "intact" in store.warnings[0]
    for row in kept:  # every chunk kept is bit for bit the one written
        assert torch.equal(row.chunk.embeds, chunk(int(row.stamps[0]) // 8, hidden=64).embeds)
    assert store.stats()["damaged_copies"] and store.stats()["damaged_bytes"] >= len(whole) - cut
    store.close()


def test_a_salvage_is_reported_once_by_whoever_opened_the_archive(tmp_path, caplog):
    (tmp_path / DB_NAME).write_bytes(b"garbage" * 1000)
    with caplog.at_level(logging.INFO):
        store = open_store(tmp_path)
    assert len(store.warnings) == 1 and "damaged" in store.warnings[0]
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]  # the node logs store.warnings, once
    store.close()


def test_a_damaged_page_in_the_middle_loses_only_its_rows(tmp_path):
    filled(tmp_path, 120).close()
    path = tmp_path / DB_NAME
    data = bytearray(path.read_bytes())
    data[20 * 4096:21 * 4096] = b"\xff" * 4096  # one page in the middle overwritten
    path.write_bytes(bytes(data))
    store = open_store(tmp_path, dtype="float32")
    assert 120 - 6 <= store.stats()["chunks"] < 120
    store.close()


def test_rows_of_a_crash_still_in_the_log_are_salvaged_from_it(tmp_path):
    """The main file torn while committed chunks are still in the write-ahead log: the log's
    frames stand in for the pages they hold."""
    store = filled(tmp_path / "a", 60)
    for suffix in ("", "-wal"):  # copied while the writer is open: as a crash leaves them
        shutil.copy(tmp_path / "a" / (DB_NAME + suffix), tmp_path / f"copy{suffix}")
    store.close()
    assert (tmp_path / "copy-wal").stat().st_size > 0
    (tmp_path / "b").mkdir()
    data = (tmp_path / "copy").read_bytes()
    (tmp_path / "b" / DB_NAME).write_bytes(data[:-4096])  # its last page torn
    shutil.copy(tmp_path / "copy-wal", tmp_path / "b" / (DB_NAME + "-wal"))
    store = open_store(tmp_path / "b", dtype="float32")
    assert store.stats()["chunks"] >= 56
    store.close()


def test_a_clean_close_leaves_every_chunk_in_one_file(tmp_path):
    filled(tmp_path / "a", 50).close()
    assert not (tmp_path / "a" / (DB_NAME + "-wal")).exists() or (tmp_path / "a" / (DB_NAME + "-wal")).stat().st_size == 0
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / DB_NAME, tmp_path / "b" / DB_NAME)  # the one file alone
    store = open_store(tmp_path / "b", dtype="float32")
    assert store.stats()["chunks"] == 50 and not store.warnings
    store.close()


def test_a_reset_shrinks_the_file_and_counts_the_chunks_it_deleted(tmp_path):
    store = filled(tmp_path, 300)
    big = (tmp_path / DB_NAME).stat().st_size
    assert big > 500_000
    assert store.clear() == 300
    small = sum(p.stat().st_size for p in tmp_path.glob(DB_NAME + "*"))
    # what is left is the schema's own pages: tables, indexes, the places R*Tree and its shadow tables
    assert small <= 96 * 1024, (big, small)
    store.close()


def test_the_bound_gives_its_pages_back(tmp_path):
    store = filled(tmp_path, 300, max_bytes=100_000)
    store.close()
    assert (tmp_path / DB_NAME).stat().st_size < 3 * 100_000


def test_a_zero_byte_file_is_a_new_archive_with_auto_vacuum(tmp_path):
    (tmp_path / DB_NAME).write_bytes(b"")
    store = open_store(tmp_path)
    assert store.db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    store.close()


def test_the_archive_folder_is_the_owners_alone(tmp_path):
    open_store(tmp_path / "new" / "archive").close()
    assert (tmp_path / "new" / "archive").stat().st_mode & 0o777 == 0o700


def test_the_ram_buffer_counts_the_bytes_it_holds():
    buffer = ChunkBuffer(1 << 20)
    c = chunk(0, hidden=64)  # float32 tensors, as the store keeps them in RAM
    buffer.put(1, c)
    assert buffer.bytes == c.embeds.numel() * 4 + c.rel_positions.numel() * 4
    small = ChunkBuffer(buffer.bytes * 2 - 1)
    small.put(1, c)
    small.put(2, chunk(1, hidden=64))
    assert list(small.items) == [2] and small.bytes <= small.max_bytes


def test_the_bound_leaves_one_hole_that_names_what_it_dropped(tmp_path):
    store = filled(tmp_path, 40, max_bytes=20_000)
    held = store.rows()
    dropped = 40 - len(held)
    assert dropped > 10 and held[0].pinned
    (hole,) = store.holes()
    camera, since, until, reason, chunks = hole
    assert reason == "bound" and chunks == dropped and camera == "/cam"
    assert since == 8.0  # chunk 1's first frame: chunk 0 is pinned
    assert until == held[1].first_stamp  # up to the oldest frame still held after it
    store.close()


def test_damaged_copies_are_bounded_and_counted_apart_from_the_archive(tmp_path):
    for round_ in range(DAMAGED_COPIES + 2):
        store = open_store(tmp_path)
        for i in range(3):
            store.append(chunk(i))
        store.close()
        (tmp_path / DB_NAME).write_bytes(b"not an archive" * 100)
        store = open_store(tmp_path)
        stats = store.stats()
        assert len(stats["damaged_copies"]) == min(round_ + 1, DAMAGED_COPIES)
        # the copies' bytes apart: file_bytes is the archive's own three files
        assert stats["damaged_bytes"] >= 1400 * len(stats["damaged_copies"])
        assert stats["file_bytes"] == sum(f.stat().st_size for f in tmp_path.glob(DB_NAME + "*") if "damaged" not in f.name)
        store.close()
        os.utime(stats["damaged_copies"][-1], ns=(round_ * 10**9, round_ * 10**9))  # order by age, not by name


def test_a_full_disk_is_counted_warned_about_once_and_named_as_a_hole(tmp_path, caplog):
    archive = Archive.open(ArchiveSettings(str(tmp_path)), IDENTITY)
    refusing = {"on": False}

    def disk(step, **_):
        if refusing["on"] and step == "insert":
            raise sqlite3.OperationalError("database or disk is full")

    with failpoints.armed(archive=disk), caplog.at_level(logging.INFO, "streamcache_ros.archive"):
        assert archive.add(chunk(0), None) is not None
        refusing["on"] = True
        assert [archive.add(chunk(i), None) for i in range(1, 5)] == [None] * 4
        assert archive.stats()["not_archived"] == 4 and archive.stats()["failing"]
        (pending,) = archive.holes()
        assert pending[3] == "disk" and pending[1:3] == (8.0, 39.0)
        refusing["on"] = False
        assert archive.add(chunk(5), None) is not None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "MiB free" in warnings[0].getMessage() and not warnings[0].exc_info
    assert "writing again after 4 chunk(s)" in warnings[1].getMessage()
    assert not archive.stats()["failing"] and archive.stats()["not_archived"] == 4
    assert archive.holes() == [("/cam", 8.0, 39.0, "disk", 4)]
    assert archive.stats()["holes"] == 1
    assert archive.store.rows()[-1].first_stamp == 40.0  # archiving went on
    archive.close()


def test_a_restart_after_a_gap_leaves_a_down_hole(tmp_path):
    archive = Archive.open(ArchiveSettings(str(tmp_path)), IDENTITY)
    for i in range(3):
        archive.add(chunk(i), None)
    archive.close()
    archive = Archive.open(ArchiveSettings(str(tmp_path)), IDENTITY)
    archive.add(chunk(10), None)  # frames 80.. after 23: the node was down in between
    archive.add(chunk(11), None)
    assert archive.holes() == [("/cam", 23.0, 80.0, "down", 0)]
    archive.close()
    archive = Archive.open(ArchiveSettings(str(tmp_path)), IDENTITY)
    archive.add(chunk(12), None)  # straight on: no hole
    assert len(archive.holes()) == 1
    assert archive.clear() == 6 and archive.holes() == []
    archive.close()


def test_a_backup_is_taken_while_the_archive_is_written(tmp_path):
    store = filled(tmp_path / "a", 20)
    (tmp_path / "copies").mkdir()
    target = store.backup(tmp_path / "copies")
    store.append(chunk(20, hidden=64))  # the node goes on
    copy = sqlite3.connect(str(target))
    assert copy.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert copy.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == 20
    assert copy.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one file
    copy.close()
    store.close()


def test_the_sessions_chunk_goes_on_when_the_disk_refuses_it(tmp_path):
    """A write the disk refuses never hides the chunk's own outcome: the chunk is in the working
    memory, its report comes back (its own error raised as it is), and it is counted."""
    stream = world.make_stream(800_000_321, 24, question_points=[24])
    session = build_session({"model_path": resolve_model_path("world-qwen2_5_vl"), "policy": "fifo",
                             "budget_tokens": 400, "archive_path": str(tmp_path), "chunk_frames": 4})

    def full(step, **_):
        if step == "insert":
            raise sqlite3.OperationalError("database or disk is full")

    def compress_fails(chunk, **_):
        if chunk == 3:
            raise RuntimeError("compress broke")

    with failpoints.armed(archive=full, compress=compress_fails):
        for i in range(8):
            session.add_frame(stream.frame(i), stream.stamp(i))
        with pytest.raises(ChunkError, match="compress broke"):
            for i in range(8, 12):
                session.add_frame(stream.frame(i), stream.stamp(i))
    status = session.status()
    assert status.chunks_encoded == 3 and status.archive.not_archived == 3 and status.archive.chunks == 0
    assert status.frames_in_memory == 12
    for i in range(12, 16):
        session.add_frame(stream.frame(i), stream.stamp(i))
    status = session.status()
    assert status.archive.chunks == 1 and status.archive.holes == 1
    answer = session.when("Did you see a red square?", "first")
    assert [h.reason for h in answer.holes] == ["disk"] and answer.evicted_before
    session.close_archive()


def test_twelve_random_kills_and_power_cuts_lose_no_acknowledged_chunk(tmp_path):
    out = tmp_path / "crash.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "crash_kills.py"), "--kills", "12",
                           "--power-cuts", "2", "--work", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    kills = report["kills"]
    assert kills["acknowledged_lost"] == 0 and kills["unopenable"] == 0 and kills["found_damaged"] == 0
    assert kills["columns_changed"] == 0 and kills["failures"] == []
    # twelve kills that landed while the child wrote, each recorded where it landed
    assert kills["kills_during_writes"] == 12 == sum(kills["landed"].values())
    assert all(r["landed"] != "after the last write" for r in kills["records"] if r["counted"])
    assert kills["acknowledged"] > 50
    if shutil.which("gcc"):
        cuts = {c["sync"]: c for c in report["power_cuts"]}
        assert cuts["full"]["acknowledged_lost"] == 0 and cuts["full"]["unopenable_or_damaged"] == 0
        assert cuts["normal"]["unopenable_or_damaged"] == 0
