"""The archive's thumbnails (engine/recall/archive/thumbnails.py; docs/show.md): a rendered world frame
against its decoded thumbnail within JPEG error, their sizes, their bytes in the row and in the bound,
a file from before them, and the parameter through a Session."""
from __future__ import annotations

import io
import json
import sqlite3

import numpy as np
import pytest
from PIL import Image

from streamcache_ros import world
from streamcache_ros.engine.recall.archive import DB_NAME
from streamcache_ros.engine.recall.archive.thumbnails import decode, encode, encode_all, pack, unpack
from test_archive_store import chunk, open_store

LOOK = world.Look(640, 480, background=(60, 70, 50), noise=4, colour_jitter=10, jitter_per_frame=True,
                  encoding="rgb8")


def reference(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The frame brought to the thumbnail's size by an area average: what a perfect thumbnail holds."""
    return np.asarray(Image.fromarray(frame).resize(size, Image.BOX)).astype(np.float64)


@pytest.mark.parametrize("side", [64, 160, 320])
def test_a_world_frame_comes_back_from_its_thumbnail_within_jpeg_error(side):
    stream = world.make_stream(2, 20, look=LOOK)
    for index in (0, 12, 19):  # an empty scene, then two objects or more
        frame = stream.frame(index)
        jpeg = encode(frame, side)
        assert jpeg[:2] == b"\xff\xd8"  # a JPEG any viewer opens
        thumb = decode(jpeg).astype(np.float64)
        assert thumb.shape == (round(480 * side / 640), side, 3)
        ideal = reference(frame, (side, thumb.shape[0]))
        error = np.abs(thumb - ideal)
        assert error.mean() < 6.0, error.mean()  # quality 75 on flat shapes: a few levels
        assert 10 * np.log10(255 ** 2 / np.mean(error ** 2)) > 25.0
        # the objects are where they were, in their colours: off the background by far more than the error
        contrast = np.abs(ideal - np.asarray(LOOK.background, np.float64)).sum(axis=2)
        objects = contrast > 60
        assert objects.any() == bool(stream.truth[index])
        if objects.any():
            assert error.sum(axis=2)[objects].mean() < 0.25 * contrast[objects].mean()


def test_sizes_keep_the_aspect_never_enlarge_and_grey_frames_work():
    wide = np.zeros((90, 160, 3), np.uint8)
    assert decode(encode(wide, 64)).shape == (36, 64, 3)
    assert decode(encode(wide, 1000)).shape == (90, 160, 3)  # smaller than the side: kept as it is
    tall = np.full((200, 100), 128, np.uint8)
    assert decode(encode(tall, 50)).shape == (50, 25, 3)
    assert encode_all([wide], 0) is None  # 0: off


def test_pack_and_unpack_keep_each_frame_and_the_gaps():
    jpegs = [encode(np.full((8, 8, 3), v, np.uint8), 8) for v in (0, 255)]
    blob, sizes = pack([jpegs[0], b"", jpegs[1]])
    assert json.loads(sizes) == [len(jpegs[0]), 0, len(jpegs[1])]
    assert unpack(blob, sizes) == [jpegs[0], b"", jpegs[1]]
    assert pack(None) == (None, None) and unpack(None, None) == []


def with_thumbnails(index: int, side: int = 64, camera: str = "/cam"):
    encoded = chunk(index, camera)
    stream = world.make_stream(index, 8, look=LOOK)
    encoded.thumbnails = [encode(stream.frame(i), side) for i in range(8)]
    return encoded


def test_thumbnails_are_written_in_the_row_counted_in_its_bytes_and_read_by_stamp(tmp_path):
    bare, shown = open_store(tmp_path / "bare"), open_store(tmp_path / "shown")
    bare.append(chunk(3))
    original = with_thumbnails(3)
    shown.append(original)
    thumb_bytes = sum(len(j) for j in original.thumbnails)
    assert shown.stats()["bytes"] == bare.stats()["bytes"] + thumb_bytes
    (row,) = shown.rows()
    assert row.bytes == bare.rows()[0].bytes + thumb_bytes
    # by stamp: the exact frame, the nearest one, none past the tolerance
    found = shown.thumbnail_near(original.stamps[5])
    assert found.jpeg == original.thumbnails[5] and found.stamp == original.stamps[5] and found.camera == "/cam"
    assert shown.thumbnail_near(original.stamps[2] + 0.4).jpeg == original.thumbnails[2]
    assert shown.thumbnails_at([original.stamps[7], 1e6]) == [shown.thumbnail_near(original.stamps[7]), None]
    assert shown.thumbnail_near(original.stamps[0], camera="/other") is None
    assert [t.stamp for t in shown.thumbnails_between(26.0, 29.0)] == [26.0, 27.0, 28.0, 29.0]
    assert bare.thumbnail_near(original.stamps[0]) is None and bare.thumbnails_between() == []
    # the RAM buffer does not hold them: recall never reads them
    assert all(item[0].thumbnails is None for item in shown.buffer.items.values())
    bare.close(), shown.close()


def test_the_bound_counts_thumbnails_so_fewer_chunks_fit(tmp_path):
    bound = 6 * (len(chunk(0).embeds.numpy().astype(np.float16).tobytes()) + 4 * chunk(0).rel_positions.numel())
    bare, shown = open_store(tmp_path / "bare", max_bytes=bound), open_store(tmp_path / "shown", max_bytes=bound)
    for i in range(20):
        bare.append(chunk(i))
        shown.append(with_thumbnails(i, side=96))
    for store in (bare, shown):
        assert store.stats()["bytes"] <= bound + store.rows()[0].bytes  # the pinned first chunk may pass it
    assert len(shown.rows()) < len(bare.rows())
    bare.close(), shown.close()


def test_a_file_from_before_thumbnails_gains_the_columns_and_reads_none(tmp_path):
    store = open_store(tmp_path)
    store.append(chunk(0))
    store.close()
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.execute("ALTER TABLE chunks DROP COLUMN thumbnails")
    db.execute("ALTER TABLE chunks DROP COLUMN thumbnail_sizes")
    db.commit()
    db.close()
    store = open_store(tmp_path)
    assert store.thumbnail_near(0.0) is None
    store.append(with_thumbnails(1))
    assert store.thumbnail_near(9.0).stamp == 9.0
    store.close()


@pytest.mark.parametrize("side", [0, 48])
def test_the_parameter_sizes_or_turns_off_what_a_session_archives(tmp_path, side):
    from streamcache_ros.engine.factory import build_session

    session = build_session({"model_path": "world-qwen2_5_vl", "policy": "full", "archive_path": str(tmp_path),
                             "archive_thumbnail_px": side})
    stream = world.make_stream(9, 8, look=LOOK)
    for i in range(8):
        session.add_frame(stream.frame(i), stream.stamp(i))
    archive = session.memory.archive
    thumbs = archive.thumbnails_between()
    if side == 0:
        assert thumbs == []
    else:
        assert [t.stamp for t in thumbs] == [stream.stamp(i) for i in range(8)]
        rgb = thumbs[3].rgb()
        assert rgb.shape == (36, 48, 3)
        assert np.abs(rgb.astype(float) - reference(stream.frame(3), (48, 36))).mean() < 6.0
        assert Image.open(io.BytesIO(thumbs[3].jpeg)).format == "JPEG"
    session.close_archive()


def test_the_bench_gives_bytes_per_hour_beside_the_embeddings(tmp_path):
    from test_bench_smoke import load, run_script

    run_script("thumbnail_bytes.py", "--frames", "2", "--model-frames", "8", "--out", str(tmp_path))
    data = load(tmp_path / "thumbnail_bytes.json")
    assert data["machine"]["commit"] is not None and data["machine"]["date"]
    assert {r["longest_px"] for r in data["sides"]} == {96, 128, 160, 224, 320}
    for row in data["bundled_models"]:
        assert row["thumbnail_bytes_per_chunk"] > 0 and row["embeddings_etc_mib_per_hour"] > 0
    assert all(r["embeds_source"] == "computed from config shapes" for r in data["beside_7b"])
    assert all(r["thumbnails_share_of_embeds"] < 0.05 for r in data["beside_7b"])
