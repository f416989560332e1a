"""archive_content frames (docs/archive.md "What a chunk keeps"): a chunk kept as its frames' JPEGs at
the model's input size in place of its embeddings, encoded again when it is replayed. The same
questions over the same archived window are answered as from embeddings, within JPEG's loss; the bytes
a chunk takes are its JPEGs; an archive of embeddings opens beside it. The bundled world models."""
from __future__ import annotations

import numpy as np
import pytest

from streamcache_ros import world
from streamcache_ros.engine import build_session
from streamcache_ros.engine.errors import ConfigError

SEED = 800_000_349  # the tests' seed range (docs/world-models.md): no training run draws it
FRAMES = 96


@pytest.fixture(scope="module")
def stream():
    return world.make_stream(SEED, FRAMES, question_points=[FRAMES])


def archived(folder, content: str, model: str = "world-qwen2_5_vl"):
    return build_session({"model_path": model, "policy": "fifo", "budget_tokens": 48, "archive_path": str(folder),
                          "archive_content": content, "retrieval_model_path": "off", "archive_thumbnail_px": 0})


@pytest.mark.parametrize("model", ["world-qwen2_5_vl", "world-llava_onevision"])
def test_a_window_replayed_from_frames_is_answered_as_from_embeddings(model, stream, tmp_path):
    sessions = {content: archived(tmp_path / content, content, model) for content in ("embeddings", "frames")}
    for session in sessions.values():
        for i in range(FRAMES):
            session.add_frame(stream.frame(i), stream.stamp(i))
    questions = stream.window_questions(FRAMES, 0, 31, np.random.default_rng(5), ("now_count", "now_color", "seen"))
    for q in questions:
        answers = {content: s.ask(q.text, q.options, since=stream.stamp(0), until=stream.stamp(31))
                   for content, s in sessions.items()}
        embeds, frames = answers["embeddings"], answers["frames"]
        assert frames.recalled_chunks == embeds.recalled_chunks >= 1 or frames.found_by == embeds.found_by != ""
        assert frames.text == embeds.text, (q.text, embeds.text, frames.text)
        if embeds.option_probabilities and not embeds.found_by:
            assert np.allclose(frames.option_probabilities, embeds.option_probabilities, atol=0.1)
    stats = {content: s.status().archive for content, s in sessions.items()}
    assert stats["frames"].chunks == stats["embeddings"].chunks == FRAMES // 8
    row = sessions["frames"].memory.archive.store.reader.execute(
        "SELECT length(embeds), length(frames), bytes FROM chunks LIMIT 1").fetchone()
    assert row[0] == 0 and row[1] > 0 and row[2] >= row[1]  # the JPEGs in place of the embeddings, in the bound
    for session in sessions.values():
        session.close_archive()


def test_an_unknown_content_is_refused_naming_the_parameter(tmp_path):
    with pytest.raises(ConfigError, match="archive_content"):
        archived(tmp_path, "pixels")


def test_auto_keeps_frames_where_the_embeddings_are_large_and_embeddings_where_they_are_small(stream, tmp_path):
    """archive_content auto (the default): the bundled model's chunks (about 1 kB of embeddings a
    frame) are kept as embeddings; a chunk whose embeddings take 128 kB a frame or more (a 3B or 7B
    model's) as frames."""
    import torch

    from streamcache_ros.engine.recall.archive import EncodedChunk

    session = archived(tmp_path, "auto")
    for i in range(16):
        session.add_frame(stream.frame(i), stream.stamp(i))
    row = session.memory.archive.store.reader.execute("SELECT length(embeds), frames FROM chunks LIMIT 1").fetchone()
    assert row[0] > 0 and row[1] is None
    batch = [(stream.frame(i), stream.stamp(i)) for i in range(2)]
    large = EncodedChunk("", [s for _, s in batch], [(0, 1)], 32, torch.zeros(32, 4096), torch.zeros(3, 32))
    kept = session.memory._as_kept(large, batch)  # 32 x 4096 x 2 bytes over 2 frames: 128 kB a frame
    assert kept.needs_encoding and len(kept.frames) == 2
    small = EncodedChunk("", [s for _, s in batch], [(0, 1)], 32, torch.zeros(32, 4000), torch.zeros(3, 32))
    assert not session.memory._as_kept(small, batch).needs_encoding
    session.close_archive()
