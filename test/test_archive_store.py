"""The archive's store on real files (engine/recall/archive/store.py): chunks round-trip, the bound drops the
oldest while the bytes stay flat, the first chunk stays, one node at a time, refusals, a damaged file
cut with a warning. No model: chunks of random tensors."""
from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from streamcache_ros.engine.recall.archive import DB_NAME, Archive, ArchiveSettings, EncodedChunk
from streamcache_ros.engine.recall.archive.store import WAL_LIMIT_BYTES, ArchiveStore
from streamcache_ros.engine.errors import ArchiveError

IDENTITY = {"model_id": "world-test", "config_hash": "abc123"}


def chunk(index: int, camera: str = "/cam", frames: int = 8, tokens_per_unit: int = 3, hidden: int = 16) -> EncodedChunk:
    rng = torch.Generator().manual_seed(index)
    units = frames // 2
    return EncodedChunk(camera, [float(index * frames + i) for i in range(frames)],
                        [(2 * u, 2 * u + 1) for u in range(units)], tokens_per_unit,
                        torch.randn(units * tokens_per_unit, hidden, generator=rng),
                        torch.arange(3 * units * tokens_per_unit, dtype=torch.float32).view(3, -1))


def open_store(folder, **kw) -> ArchiveStore:
    return ArchiveStore.open(folder, IDENTITY, owner="/test/node", **kw)


def test_a_chunk_comes_back_as_it_went_in_exact_in_fp32(tmp_path):
    store = open_store(tmp_path, dtype="float32")
    original = chunk(0)
    key = np.ones((1, 4, 2, 8), dtype=np.float16)
    chunk_id = store.append(original, key)
    store.close()
    store = open_store(tmp_path, dtype="float32")  # from disk, not the RAM buffer
    (row,) = store.load(store.rows(with_keys=True))
    assert row.chunk_id == chunk_id and row.camera == "/cam" and row.pinned
    assert row.stamps == original.stamps and row.unit_frames == original.unit_frames
    assert torch.equal(row.chunk.embeds, original.embeds)
    assert torch.equal(row.chunk.rel_positions, original.rel_positions)
    assert row.key.shape == key.shape
    store.close()


def test_fp16_halves_the_bytes_within_its_rounding(tmp_path):
    half, full = open_store(tmp_path / "h"), open_store(tmp_path / "f", dtype="float32")
    for store in (half, full):
        store.append(chunk(1))
    assert half.stats()["bytes"] < 0.7 * full.stats()["bytes"]
    half.buffer.clear()
    (row,) = half.load(half.rows())
    assert torch.allclose(row.chunk.embeds, chunk(1).embeds, atol=2e-3, rtol=1e-3)
    half.close(), full.close()


def test_windows_select_chunks_by_their_frames_stamps(tmp_path):
    store = open_store(tmp_path)
    for i in range(6):  # frames 0..47, 8 a chunk
        store.append(chunk(i))
    assert [r.chunk_id for r in store.rows(10.0, 15.0)] == [2]
    assert [r.chunk_id for r in store.rows(10.0, 17.0)] == [2, 3]
    assert [r.chunk_id for r in store.rows(7.0, 8.0)] == [1, 2]
    assert [r.chunk_id for r in store.rows(until=math.inf)] == [1, 2, 3, 4, 5, 6]
    assert store.rows(100.0, 200.0) == [] and store.rows(7.5, 7.6) == []
    store.close()


def test_the_bound_drops_the_oldest_keeps_the_first_and_the_file_flat(tmp_path):
    size = len(chunk(0).embeds.numpy().astype(np.float16).tobytes()) + 4 * chunk(0).rel_positions.numel()
    store = open_store(tmp_path, max_bytes=10 * size)
    files = []
    for i in range(120):
        store.append(chunk(i))
        assert store.stats()["file_bytes"] - (tmp_path / DB_NAME).stat().st_size <= WAL_LIMIT_BYTES + 64 * 1024
        if i % 10 == 9:
            store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            files.append((tmp_path / DB_NAME).stat().st_size)
    stats = store.stats()
    ids = [r.chunk_id for r in store.rows()]
    assert stats["chunks"] == 10 and stats["bytes"] <= 10 * size
    assert ids[0] == 1 and ids[1:] == list(range(112, 121))  # the first chunk stays: "first" questions
    assert max(files[6:]) <= max(files[2:4]) + 8192  # the file does not grow with the stream
    store.close()


def test_a_second_node_is_refused_while_the_first_holds_it(tmp_path):
    first = open_store(tmp_path)
    with pytest.raises(ArchiveError, match=r"in use by /test/node \(pid"):
        open_store(tmp_path)
    first.close()
    open_store(tmp_path).close()  # released with the first


def test_a_killed_holder_releases_the_archive(tmp_path):
    """The lock goes with the process, however it ends (flock): kill -9 leaves no stale lock."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from streamcache_ros.engine.recall.archive.store import WAL_LIMIT_BYTES, ArchiveStore
        store = ArchiveStore.open({str(tmp_path)!r}, {IDENTITY!r}, owner="/holder")
        print("held", flush=True)
        time.sleep(60)
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ArchiveError, match="/holder"):
            open_store(tmp_path)
        holder.kill()
        holder.wait(timeout=30)
        open_store(tmp_path).close()
    finally:
        holder.kill()


def test_another_model_or_other_cameras_are_refused_and_nothing_changes(tmp_path):
    store = open_store(tmp_path)
    store.append(chunk(0, camera="/front"))
    store.close()
    before = (tmp_path / DB_NAME).read_bytes()
    with pytest.raises(ArchiveError, match="config_hash 'abc123', this node has 'other'"):
        ArchiveStore.open(tmp_path, {**IDENTITY, "config_hash": "other"})
    with pytest.raises(ArchiveError, match="camera.*'/front'.*does not have"):
        ArchiveStore.open(tmp_path, IDENTITY, cameras=("/left",))
    with pytest.raises(ArchiveError, match="dtype 'float16', this node has 'float32'"):
        ArchiveStore.open(tmp_path, IDENTITY, dtype="float32")
    assert (tmp_path / DB_NAME).read_bytes() == before
    open_store(tmp_path).close()  # none of the refusals kept the lock


def test_a_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ArchiveError, match="cannot be used as a folder|is not a folder"):
        open_store(tmp_path / "afile")


def test_a_truncated_file_is_cut_with_a_warning_never_a_crash(tmp_path):
    store = open_store(tmp_path)
    for i in range(40):
        store.append(chunk(i, hidden=256))
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    path = tmp_path / DB_NAME
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(int(size * 0.6))
    store = open_store(tmp_path)
    assert store.warnings and "damaged" in store.warnings[0]
    kept = [r.chunk_id for r in store.rows()]
    assert kept == list(range(1, len(kept) + 1))  # a prefix: only the tail is cut
    store.append(chunk(99))  # and it goes on
    assert store.stats()["chunks"] == len(kept) + 1
    assert list(tmp_path.glob(DB_NAME + ".damaged-*"))  # kept for a person to look at
    store.close()


def test_garbage_in_place_of_the_file_starts_a_new_one_with_a_warning(tmp_path):
    (tmp_path / DB_NAME).write_bytes(os.urandom(5000))
    store = open_store(tmp_path)
    assert store.warnings and store.stats()["chunks"] == 0
    store.close()


def test_a_person_can_read_it_with_sqlite(tmp_path):
    store = open_store(tmp_path)
    store.append(chunk(0, camera="/front"))
    store.note_watch(1, {"Did you see a red circle?": 0.91})
    db = sqlite3.connect(tmp_path / DB_NAME)
    camera, first, last, watch = db.execute("SELECT camera, first_stamp, last_stamp, watch FROM chunks").fetchone()
    assert (camera, first, last) == ("/front", 0.0, 7.0) and "red circle" in watch
    assert dict(db.execute("SELECT key, value FROM meta"))["model_id"] == "world-test"
    db.close()
    store.close()


def test_clear_forgets_every_chunk(tmp_path):
    archive = Archive.open(ArchiveSettings(str(tmp_path)), IDENTITY)
    for i in range(5):
        archive.add(chunk(i), None)
    archive.clear()
    assert archive.stats()["chunks"] == 0 and archive.reach() is None
    archive.add(chunk(9), None)
    assert archive.store.rows()[0].pinned  # the stream begins again
    archive.close()


def test_the_ram_buffer_stays_within_its_bytes(tmp_path):
    store = open_store(tmp_path, buffer_bytes=4000)
    for i in range(50):
        store.append(chunk(i))
    assert store.buffer.bytes <= 4000 and 0 < len(store.buffer.items) < 50
    store.close()


def test_relevance_scores_each_chunk_by_its_best_unit_whatever_the_mix_of_shapes():
    from streamcache_ros.engine.recall.archive import relevance

    rng = np.random.default_rng(3)
    question = rng.normal(size=(2, 2, 8)).astype(np.float32)  # [layers, kv_heads, d]
    keys = [rng.normal(size=(2, units, 2, 8)).astype(np.float16) for units in (4, 4, 3, 4, 1, 3)]

    def one_by_one(key):  # the rule written out for one chunk: best unit of the mean over heads, per layer
        return [max(float((key[layer, u].astype(np.float32) * question[layer]).sum(-1).mean()) / np.sqrt(8)
                    for u in range(key.shape[1])) for layer in range(2)]
    raw = np.array([one_by_one(k) for k in keys]).T  # [layers, chunks]
    expected = ((raw - raw.mean(1, keepdims=True)) / raw.std(1, keepdims=True)).mean(0)
    assert np.allclose(relevance(question, keys), expected, atol=1e-4)
    best = keys[2].copy()
    best[:, 1] = (question * 10).astype(np.float16)  # one unit that matches the question closely
    assert int(np.argmax(relevance(question, keys[:2] + [best] + keys[3:]))) == 2
