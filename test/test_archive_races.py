"""A question reads the archive off the turn lock while ingest writes it (docs/archive.md "Questions
never stop the cameras"): a chunk it planned may meanwhile be made whole from its parts, made again,
or dropped by the bound. Each is re-read as the archive holds it then, or skipped with the reason;
never an error to the client. Ids are never reused (a merge, the bound, a reset), and the index's
RAM copy stays in step however its first read and a commit interleave.

Deterministic: each change is made at the exact point between a question's plan and its read (a
hook where the engine reads), not raced against a clock."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from streamcache_ros import world
from streamcache_ros.engine.recall.archive import ArchivedChunk
from streamcache_ros.engine.errors import QuestionError
from test_archive_store import chunk, open_store
from test_when_index import archived, probe

SEED = 800_000_333  # the tests' seed range (docs/world-models.md): no training run draws it
FRAMES = 96


# -- the store ----------------------------------------------------------------------------------
def test_ids_are_never_reused_after_a_merge_a_reset_or_a_restart(tmp_path):
    store = open_store(tmp_path)
    first, second, third = (store.append(chunk(i)) for i in range(3))
    whole = store.replace([second, third], chunk(1, frames=16))
    assert whole not in (first, second, third) and whole > third
    store.clear()
    after_reset = store.append(chunk(5))
    assert after_reset > whole
    store.close()
    store = open_store(tmp_path)
    assert store.append(chunk(6)) > after_reset
    store.close()


def test_a_part_made_whole_is_read_as_the_whole_and_a_dropped_chunk_is_gone(tmp_path):
    store = open_store(tmp_path)
    ids = [store.append(chunk(i)) for i in range(4)]
    planned = store.rows()
    merged = chunk(1, frames=16)
    merged.stamps = [8.0 + i for i in range(16)]  # the frames of parts 1 and 2, made one chunk
    whole = store.replace(ids[1:3], merged)
    now, gone = store.current(planned)
    assert [r.chunk_id for r in now] == [ids[0], whole, ids[3]] and gone == []
    # a light row (an id, a camera and the stamps a ranking saw) finds its whole too
    light = ArchivedChunk(ids[1], "/cam", 8.0, 9.0, [8.0, 9.0], [], 0)
    assert [r.chunk_id for r in store.current([light])[0]] == [whole]
    store.max_bytes = 1  # the bound drops every chunk but the pinned first
    store.append(chunk(7))
    now, gone = store.current(planned)
    assert [r.chunk_id for r in now] == [ids[0]] and {r.chunk_id for r in gone} == set(ids[1:])
    store.close()


def indexed(index: int):
    c = chunk(index)
    c.frame_vectors = np.random.default_rng(index).standard_normal((len(c.stamps), 8)).astype(np.float32)
    return c


def test_a_commit_during_the_first_read_of_the_index_is_not_lost(tmp_path):
    """The first ranking reads every row's vectors into RAM; a chunk committed after that read's
    snapshot and before the copy is kept in step would be missing from it for good. The write waits
    for the read instead (the hook pauses the read after its snapshot: a guard, not a timing)."""
    store = open_store(tmp_path)
    for i in range(3):
        store.append(indexed(i))
    store.clear()  # a reset: the copy in RAM is known to be empty and kept in step from here
    assert store.frame_index()[0].size == 0
    store.append(indexed(3))
    assert store.frame_index()[0].tolist() == chunk(3).stamps
    store._index = None  # as after opening: the first ranking reads from disk
    read_done, release = threading.Event(), threading.Event()
    read = store._read_index

    def paused_read():
        copy = read()
        read_done.set()
        release.wait(timeout=60)
        return copy
    store._read_index = paused_read
    reader = threading.Thread(target=store.frame_index)
    reader.start()
    assert read_done.wait(timeout=60)
    writer = threading.Thread(target=store.append, args=(indexed(4),))
    writer.start()
    writer.join(timeout=2)  # the write is held back by the read in progress (or, before, went through)
    release.set()
    reader.join(timeout=60)
    writer.join(timeout=60)
    assert store.frame_index()[0].tolist() == chunk(3).stamps + chunk(4).stamps
    store.close()


def test_reading_the_index_again_after_it_was_dropped_leaves_no_log_at_rest(tmp_path):
    store = open_store(tmp_path)
    for i in range(40):
        c = chunk(i)
        c.frame_vectors = np.random.default_rng(i).standard_normal((len(c.stamps), 512)).astype(np.float32)
        store.append(c)  # 8 KiB of vectors a chunk: dropping them rewrites 320 KiB of rows
    store.use_index("one-encoder@aaaa")
    store.close()
    store = open_store(tmp_path)
    store.use_index("another-encoder@bbbb")  # every row written again: its vectors dropped
    assert any("index of its 40 older chunk(s) is dropped" in w for w in store.warnings)
    wal = tmp_path / "archive.sqlite-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    store.close()


def test_an_index_of_the_same_folder_name_with_other_weights_is_another_index(tmp_path):
    store = open_store(tmp_path)
    c = chunk(0)
    c.frame_vectors = np.ones((len(c.stamps), 4), np.float32)
    store.use_index("retrieval@1111")
    store.append(c)
    store.use_index("retrieval@2222")
    assert store.frame_index()[3] == [1]  # the vectors dropped: the chunk is unindexed
    legacy = open_store(tmp_path / "legacy")
    legacy.use_index("retrieval")  # as an archive written before identities held a hash
    legacy.append(c)
    legacy.use_index("retrieval@2222")  # taken as the same, with a warning
    assert legacy.frame_index()[3] == [] and any("before indexes were known" in w for w in legacy.warnings)
    store.close()
    legacy.close()


# -- a question and a write between its plan and its read --------------------------------------
@pytest.fixture(scope="module")
def stream():
    return world.make_stream(SEED, FRAMES, question_points=[FRAMES])


@pytest.fixture
def session(stream, tmp_path):
    from streamcache_ros.engine.adapters.models import RETRIEVAL_DIR, WORLD_RETRIEVAL
    from streamcache_ros.engine.recall.index import RetrievalEncoder

    memory = archived(tmp_path, RetrievalEncoder.load(str(RETRIEVAL_DIR / WORLD_RETRIEVAL)))
    for i in range(FRAMES):
        memory.add_frame(stream.frame(i), stream.stamp(i))
    yield memory
    memory.close_archive()


def remake(archive, rows) -> None:
    """Each of ``rows`` written again as a chunk of its own (what a merge of parts does to a part:
    its row replaced, in one transaction, by one holding its frames)."""
    loaded, _ = archive.load(rows)
    for row in loaded:
        archive.replace([row.chunk_id], row.chunk, None)


def drop_unpinned(archive) -> None:
    """The bound drops every chunk but each camera's first (a write past a tiny bound)."""
    archive.store.max_bytes = 1
    archive.store._keep_within_bound()


def shown_identity(stream, first: int, last: int):
    return next(v.identity for f in stream.truth[first:last + 1] for v in f)


@pytest.mark.parametrize("change", ["remade", "dropped"])
def test_a_verified_when_whose_candidate_changes_before_its_replay(change, session, stream):
    identity = shown_identity(stream, 40, 80)
    truth = stream.identity_frames(identity, FRAMES)
    tier = session.memory
    rank = tier.index_scores

    def rank_then_change(question, camera, window, **kw):
        scores = rank(question, camera, window, **kw)
        rows = tier.archive.rows(*window.bounds(), camera)
        if change == "remade":
            remake(tier.archive, rows)
        else:
            drop_unpinned(tier.archive)
        return scores
    tier.index_scores = rank_then_change
    found = session.when(probe(identity), "last")
    if change == "remade":  # verified on the chunk that holds the candidate's frames now
        assert found.found_by == "index" and found.found and abs(found.stamp - stream.stamp(truth[-1])) <= 2
    else:  # the candidates are gone: what is left (the pinned first chunk) is read, and the reply
        # says the window lost frames
        assert found.evicted_before and found.holes
        assert not found.found or int(round(found.stamp)) in [f for f in truth if f < 8]


@pytest.mark.parametrize("change", ["remade", "dropped"])
def test_a_windowed_ask_whose_chunks_change_before_its_replay_reads_them(change, session, stream):
    prefill = session.memory._prefill

    def change_then_prefill(rows):
        if change == "remade":
            remake(session.memory.archive, rows)
        else:
            drop_unpinned(session.memory.archive)
        return prefill(rows)
    session.memory._prefill = change_then_prefill
    since, until = stream.stamp(0), stream.stamp(31)
    answer = session.ask("How many objects are in view now?", ["0", "1", "2"], since=since, until=until)
    assert answer.recalled_chunks >= 1
    if change == "remade":
        assert answer.recalled_chunks == 4 and not answer.holes
    else:  # the pinned first chunk is still there; the rest were skipped, and the reply says so
        assert answer.recalled_chunks == 1 and answer.evicted_before


def test_a_plain_ask_whose_every_chunk_is_dropped_before_its_replay_is_refused_with_the_reason(session, stream):
    prefill = session.memory._prefill

    def drop_everything_then_prefill(rows):
        archive = session.memory.archive
        archive.store.max_bytes = 1
        with archive.store.db:
            archive.store.db.execute("UPDATE chunks SET pinned = 0")
        archive.store._keep_within_bound()
        return prefill(rows)
    session.memory._prefill = drop_everything_then_prefill
    with pytest.raises(QuestionError, match="dropped by archive_max_bytes while it ran"):
        session.ask("How many objects are in view now?", ["0", "1", "2"], since=stream.stamp(0),
                    until=stream.stamp(31))
    answer = session.ask("How many objects are in view now?", ["0", "1", "2"])  # the memory goes on
    assert answer.text in ("0", "1", "2")


def test_the_log_stays_within_its_cap_while_readers_read_and_is_gone_at_rest(tmp_path):
    """20 MB of chunks appended while another thread reads the archive as questions do (its rows,
    the index, payloads, stats): the write-ahead log never passes WAL_LIMIT_BYTES; closed, it is gone."""
    from streamcache_ros.engine.recall.archive.store import WAL_LIMIT_BYTES

    store = open_store(tmp_path, buffer_bytes=0)  # every read of a payload goes to the file
    wal = tmp_path / "archive.sqlite-wal"
    stop, reads = threading.Event(), [0]

    def read_as_questions_do():
        while not stop.is_set():
            rows = store.rows()
            store.frame_index()
            store.stats()
            if rows:
                store.load(rows[-2:])
            reads[0] += 1
    reader = threading.Thread(target=read_as_questions_do)
    reader.start()
    largest = 0
    try:
        for i in range(200):
            store.append(chunk(i, hidden=4096))  # about 100 kB a chunk
            largest = max(largest, wal.stat().st_size if wal.exists() else 0)
    finally:
        stop.set()
        reader.join(timeout=60)
    assert reads[0] > 10 and store.stats()["chunks"] == 200
    assert largest <= WAL_LIMIT_BYTES, largest  # 7.5 MB before the store folded it back itself
    store.close()
    assert not wal.exists() or wal.stat().st_size == 0
