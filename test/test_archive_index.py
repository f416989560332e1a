"""The archive's index (docs/archive.md "The index"): the dual encoder through transformers (real
classes, tiny random weights from real configs, and the bundled trained one), frame vectors written
with their chunk, read back by window, dropped when another encoder indexes, and the rules that
rank and order candidates."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest
import torch

from streamcache_ros import world
from streamcache_ros.engine.adapters.models import RETRIEVAL_DIR, WORLD_RETRIEVAL, resolve_model_path, \
    resolve_retrieval_path
from streamcache_ros.engine.errors import ConfigError
from streamcache_ros.engine.recall.archive import ArchiveStore, EncodedChunk
from streamcache_ros.engine.recall.archive.store import DB_NAME
from streamcache_ros.tools.other_encoders import tiny_dual_encoder  # noqa: F401 - other tests import it from here
from streamcache_ros.engine.recall.index import (FrameScores, RetrievalEncoder, candidate_chunks, precision_at,
                                                 rank_frames, recall_at)

BUNDLED = RETRIEVAL_DIR / WORLD_RETRIEVAL
IDENTITY = {"model_id": "m", "config_hash": "h"}


def frames(n: int, seed: int = 800_000_100):
    stream = world.make_stream(seed, n)
    return stream, [stream.frame(i) for i in range(n)]


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_a_tiny_random_dual_encoder_of_real_classes_embeds_frames_of_any_size_and_questions(kind, tmp_path):
    encoder = RetrievalEncoder.load(str(tiny_dual_encoder(kind, tmp_path / kind)))
    images = [np.full((h, w, 3), 60, np.uint8) for h, w in ((96, 128), (720, 1280), (240, 320))]
    vectors = encoder.embed_frames(images)
    query = encoder.embed_texts(["Did you see a red circle?", "Did you see a blue square?"])
    assert vectors.shape == (3, encoder.dim) and query.shape == (2, encoder.dim)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(query, axis=1), 1.0, atol=1e-5)
    p = encoder.probability(vectors @ query[0])
    assert ((p > 0) & (p < 1)).all()
    # SigLIP was trained as a sigmoid and pads its text to full length; CLIP gets a threshold cosine
    assert encoder.settings.padding == ("max_length" if kind == "siglip" else "longest")
    assert encoder.probability(np.array([encoder.cosine_at(0.5)]))[0] == pytest.approx(0.5)


def test_a_path_that_is_not_a_dual_encoder_is_refused_naming_the_parameter(tmp_path):
    with pytest.raises(ConfigError, match="retrieval_model_path.*no config.json"):
        RetrievalEncoder.load(str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="retrieval_model_path.*not a dual encoder"):
        RetrievalEncoder.load(resolve_model_path("world-qwen2_5_vl"))


def test_auto_is_the_bundled_index_for_a_world_model_and_none_for_another():
    assert resolve_retrieval_path("auto", "world-qwen2_5_vl") == str(BUNDLED)
    assert resolve_retrieval_path("auto", "Qwen/Qwen2.5-VL-7B-Instruct") == ""
    assert resolve_retrieval_path(WORLD_RETRIEVAL, "anything") == str(BUNDLED)
    assert resolve_retrieval_path("", "world-qwen2_5_vl") == ""


def test_the_bundled_index_ranks_the_asked_identity_first_in_held_out_frames():
    """Not a figure (bench/index_precision.py is): that the trained weights are the ones loaded.
    A floor far under what the bench measures, far over chance."""
    encoder = RetrievalEncoder.load(str(BUNDLED))
    stream, images = frames(96)
    vectors = encoder.embed_frames(images)
    hits = []
    for identity in {v.identity for views in stream.truth for v in views}:
        relevant = np.array([identity in {v.identity for v in views} for views in stream.truth])
        query = encoder.embed_text(world.SEEN_PROBE.format(shape=identity[0], colour=identity[1]))
        hits.append(precision_at(vectors @ query, relevant, 4))
    assert np.mean(hits) >= 0.75


def chunk(stamps, vectors=None, camera="cam"):
    return EncodedChunk(camera, list(stamps), [(i,) for i in range(len(stamps))], 2, torch.zeros(2 * len(stamps), 4),
                        torch.zeros(3, 2 * len(stamps)), vectors)


def unit_rows(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_frame_vectors_go_in_with_their_chunk_and_come_back_by_window(tmp_path):
    store = ArchiveStore.open(tmp_path, IDENTITY, dtype="float32")
    store.use_index("enc-a")
    a, b = unit_rows(4, seed=1), unit_rows(4, seed=2)
    store.append(chunk([0, 1, 2, 3], a))
    store.append(chunk([4, 5, 6, 7], b))
    store.append(chunk([8, 9, 10, 11]))  # no index for this one
    stamps, ids, vectors, unindexed = store.frame_index(2.0, 9.0)
    assert stamps.tolist() == [2, 3, 4, 5, 6, 7] and ids.tolist() == [1, 1, 2, 2, 2, 2] and unindexed == [3]
    np.testing.assert_allclose(vectors.astype(np.float32), np.concatenate([a[2:], b]), atol=1e-3)
    # the index counts in the bytes the bound holds: a chunk with vectors is bigger by them
    sizes = [r.bytes for r in store.rows()]
    assert sizes[0] - sizes[2] == 4 * 8 * 2
    store.close()
    # another dual encoder's vectors cannot be ranked against its questions: dropped, and said
    again = ArchiveStore.open(tmp_path, IDENTITY, dtype="float32")
    again.use_index("enc-b")
    assert any("indexed by 'enc-a'" in w for w in again.warnings)
    assert again.frame_index()[3] == [1, 2, 3]
    again.close()


def test_an_archive_from_before_the_index_opens_and_gets_the_columns(tmp_path):
    db = sqlite3.connect(tmp_path / DB_NAME)
    old_schema = ("CREATE TABLE chunks (id INTEGER PRIMARY KEY, camera TEXT NOT NULL, first_stamp REAL NOT NULL, "
                  "last_stamp REAL NOT NULL, stamps TEXT NOT NULL, unit_frames TEXT NOT NULL, tokens_per_unit INTEGER "
                  "NOT NULL, embeds BLOB NOT NULL, embeds_shape TEXT NOT NULL, positions BLOB NOT NULL, positions_shape "
                  "TEXT NOT NULL, retrieval_key BLOB, key_shape TEXT, watch TEXT NOT NULL DEFAULT '{}', pinned INTEGER "
                  "NOT NULL DEFAULT 0, bytes INTEGER NOT NULL)")
    db.execute(old_schema)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.executemany("INSERT INTO meta VALUES (?, ?)", [("format", "1"), ("dtype", "float32"), ("model_id", "m"),
                                                     ("config_hash", "h")])
    zeros = np.zeros((2, 4), np.float32).tobytes()
    db.execute("INSERT INTO chunks (camera, first_stamp, last_stamp, stamps, unit_frames, tokens_per_unit, embeds, "
               "embeds_shape, positions, positions_shape, bytes) VALUES ('cam', 0, 0, '[0.0]', '[[0]]', 2, ?, '[2, 4]', "
               "?, '[4, 2]', 64)", (zeros, zeros))
    db.commit()
    db.close()
    store = ArchiveStore.open(tmp_path, IDENTITY, dtype="float32")
    store.use_index("enc-a")
    store.append(chunk([1.0], unit_rows(1)))
    stamps, ids, _, unindexed = store.frame_index()
    assert stamps.tolist() == [1.0] and unindexed == [1]
    store.close()


def test_candidates_come_newest_first_for_last_and_oldest_first_for_first():
    scores = FrameScores(np.arange(12.0), np.repeat([1, 2, 3], 4), np.array(
        [0.1, 0.9, 0.8, 0.1, 0.2, 0.2, 0.3, 0.1, 0.1, 0.6, 0.7, 0.2]))
    last = candidate_chunks(scores, 0.5, newest_first=True)
    first = candidate_chunks(scores, 0.5, newest_first=False)
    assert [(c.chunk_id, c.stamp) for c in last] == [(3, 10.0), (1, 2.0)]
    assert [(c.chunk_id, c.stamp) for c in first] == [(1, 1.0), (3, 9.0)]
    assert last[1].probability == pytest.approx(0.9)
    assert candidate_chunks(scores, 0.95, newest_first=True) == []


def test_precision_and_recall_at_k():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.1])
    relevant = np.array([True, False, True, True, False])
    assert precision_at(scores, relevant, 4) == 0.75
    assert recall_at(scores, relevant, 2) == 0.5  # one of the two it could have held
    assert recall_at(scores, relevant, 16) == 1.0
    assert recall_at(scores, np.zeros(5, bool), 4) == 0.0
    p = rank_frames(unit_rows(3), unit_rows(1, seed=5)[0], lambda c: 1 / (1 + np.exp(-c)))
    assert p.shape == (3,) and ((p > 0) & (p < 1)).all()


def test_the_index_in_ram_keeps_in_step_with_appends_and_the_bound(tmp_path):
    store = ArchiveStore.open(tmp_path, IDENTITY, dtype="float32", max_bytes=10**9)
    store.use_index("enc-a")
    store.append(chunk([0, 1], unit_rows(2, seed=1)))
    assert store.frame_index()[0].tolist() == [0, 1]  # read from disk once, then kept in RAM
    store.append(chunk([2, 3], unit_rows(2, seed=2)))
    assert store.frame_index()[0].tolist() == [0, 1, 2, 3]
    size = store.rows()[-1].bytes
    store.max_bytes = 3 * size  # the bound drops the oldest unpinned chunks: their frames leave the index
    store.append(chunk([4, 5], unit_rows(2, seed=3)))
    store.append(chunk([6, 7], unit_rows(2, seed=4)))
    stamps, ids, _, _ = store.frame_index()
    assert stamps.tolist() == [0, 1, 4, 5, 6, 7] and 2 not in ids.tolist()  # the first chunk is pinned
    store.max_bytes = 10**9
    store.append(chunk([8, 9]))  # not indexed: still counted among the frames held
    assert store.frames_between() == 8 and store.frames_between(1.0, 5.0) == 3 and store.frames_between(8.5, 20) == 1
    assert store.frames_between(camera="other") == 0
    reopened = ArchiveStore.open(tmp_path / "again", IDENTITY, dtype="float32")
    reopened.close()
    store.clear()
    assert len(store.frame_index()[0]) == 0
    store.close()


def test_a_standing_question_covers_a_window_only_when_every_chunk_there_has_its_answer(tmp_path):
    store = ArchiveStore.open(tmp_path, IDENTITY, dtype="float32")
    ids = [store.append(chunk([2 * k, 2 * k + 1])) for k in range(3)]
    question = 'Did you see a "red" circle?'
    assert not store.watch_covers(question)
    store.note_watch(ids[1], {question: 0.9})
    store.note_watch(ids[2], {question: 0.1, "Did you see a red circle": 0.5})
    assert store.watch_covers(question, 2.0, 5.0) and not store.watch_covers(question)
    assert not store.watch_covers("Did you see a red circle?", 2.0, 5.0)  # a prefix of another is not it
    assert not store.watch_covers(question, 100.0, 200.0)  # no chunk there
    store.close()


def test_a_plain_questions_plan_from_the_index_arrays_is_the_plan_over_every_row(tmp_path):
    """A day's plan is made on arrays from the index's RAM copy; it must choose what the plan over
    every row chooses (archive/plan.py), for two cameras and any scores."""
    from streamcache_ros.engine.recall.archive import Archive, ArchiveSettings
    from streamcache_ros.engine.recall.archive.plan import question_plan

    store = ArchiveStore.open(tmp_path, IDENTITY, dtype="float32")
    for k in range(30):
        store.append(chunk([2.0 * k, 2.0 * k + 1], camera="front" if k % 3 else "rear"))
    archive = Archive(ArchiveSettings(str(tmp_path), recall_chunks=3, recent_chunks=2), store)
    rng = np.random.default_rng(0)
    for trial in range(20):
        scores = {c: float(p) for c, p in zip(range(1, 31), rng.random(30))}
        before = float(rng.integers(10, 60))
        camera = ["", "front", "rear"][trial % 3]
        replayed, recalled = archive.for_question(None, camera, before, chunk_scores=scores)
        rows = store.ranking_rows(camera, with_keys=False)
        ranked = np.where([r.last_stamp < before for r in rows], [scores[r.chunk_id] for r in rows], -np.inf)
        want_replayed, want_recalled = question_plan(rows, ranked, 3, 2)
        assert [r.chunk_id for r in replayed] == [r.chunk_id for r in want_replayed]
        assert [r.chunk_id for r in recalled] == [r.chunk_id for r in want_recalled]
    store.close()


def test_a_question_about_the_beginning_reads_each_cameras_first_chunk(tmp_path):
    """"the first object" reads each camera's first chunk alone (docs/archive.md "Recall"), whole,
    in time order, whatever the ids; a `when` "first" and other questions are not that rule's."""
    from streamcache_ros.engine.questions.checks import FIRST_WORDS
    from streamcache_ros.engine.recall.archive import Archive, ArchiveSettings

    store = ArchiveStore.open(tmp_path, IDENTITY, dtype="float32")
    store.append(chunk([10.0, 11.0], camera="rear"))
    for k in range(6):
        store.append(chunk([2.0 * k, 2.0 * k + 1], camera="front"))
    store.append(chunk([12.0, 13.0], camera="rear"))
    archive = Archive(ArchiveSettings(str(tmp_path)), store)
    assert [(r.camera, r.stamps) for r in archive.first_chunks()] == [("front", [0.0, 1.0]), ("rear", [10.0, 11.0])]
    assert [(r.camera, r.stamps) for r in archive.first_chunks("rear")] == [("rear", [10.0, 11.0])]
    assert all(r.chunk is None for r in archive.first_chunks())  # payloads are read at the replay
    assert archive.first_chunks("side") == []
    store.close()
    for question in ("What color was the first object you saw?", "What shape was the earliest thing you saw?",
                     "What was in view at the start?"):
        assert FIRST_WORDS.search(question), question
    for question in ("When did you first see a red circle?", "What color was the object you saw?",
                     "Which came first, the circle or the square?"):
        assert not FIRST_WORDS.search(question), question
