"""The demo / test bag: written with rosbags (sqlite3 and mcap), read back with the fixed world
stream's pixels (docs/world.md) and the stamps it was made with; the same bytes every time."""
import io

import numpy as np
import pytest
from PIL import Image as PILImage
from rosbags.highlevel import AnyReader

from streamcache_ros import world
from streamcache_ros.tools import bagfile

START = bagfile.DEFAULT_START_NS
WIDTH, HEIGHT = 128, 96  # the smallest 4:3 frame the shape world draws (docs/world.md)


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_bag_holds_the_world_frames_with_their_stamps(tmp_path, storage):
    path = bagfile.make_bag(tmp_path / "bag", frames=6, fps=4.0, width=WIDTH, height=HEIGHT, storage=storage,
                            compressed=True, first_frame=10)
    assert bagfile.image_topics(path) == {"/camera/image_raw": bagfile.IMAGE,
                                          "/camera/image_raw/compressed": bagfile.COMPRESSED}
    messages = list(bagfile.read_images(path))
    raw = [m for m in messages if m.topic == "/camera/image_raw"]
    png = [m for m in messages if m.topic.endswith("/compressed")]
    assert len(raw) == len(png) == 6
    # frames at 4 fps: stamps 0.25 s apart from the fixed start, recorded at their stamps
    assert [m.stamp_ns for m in raw] == [START + i * 250_000_000 for i in range(6)]
    assert [m.log_time_ns for m in raw] == [m.stamp_ns for m in raw]
    with AnyReader([path]) as reader:
        for i, (connection, _, data) in enumerate(
                (c, t, d) for c, t, d in reader.messages() if c.topic == "/camera/image_raw"):
            msg = reader.deserialize(data, connection.msgtype)
            assert (msg.encoding, msg.width, msg.height, msg.step) == ("rgb8", WIDTH, HEIGHT, WIDTH * 3)
            np.testing.assert_array_equal(msg.data.reshape(HEIGHT, WIDTH, 3), world.world_frame(10 + i, HEIGHT, WIDTH))
            assert msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec == raw[i].stamp_ns
    with AnyReader([path]) as reader:
        first_png = next(d for c, _, d in reader.messages() if c.topic.endswith("/compressed"))
        msg = reader.deserialize(first_png, bagfile.COMPRESSED)
        assert msg.format == "png"
        np.testing.assert_array_equal(np.asarray(PILImage.open(io.BytesIO(msg.data.tobytes()))),
                                      world.world_frame(10, HEIGHT, WIDTH))


def test_the_bag_is_deterministic(tmp_path):
    a = [m.rawdata for m in bagfile.read_images(bagfile.make_bag(tmp_path / "a", frames=4))]
    b = [m.rawdata for m in bagfile.read_images(bagfile.make_bag(tmp_path / "b", frames=4))]
    assert a == b


def test_topic_selection_and_errors(tmp_path):
    path = bagfile.make_bag(tmp_path / "bag", frames=2, compressed=True)
    assert {m.topic for m in bagfile.read_images(path, ["/camera/image_raw/compressed"])} == {"/camera/image_raw/compressed"}
    with pytest.raises(ValueError, match="no image topic /nope"):
        list(bagfile.read_images(path, ["/nope"]))
    with pytest.raises(FileExistsError):
        bagfile.make_bag(path, frames=1)
    assert bagfile.make_bag(path, frames=1, overwrite=True) == path
    with pytest.raises(ValueError):
        bagfile.make_bag(tmp_path / "x", storage="rosbag1")
    with pytest.raises(ValueError, match="outside 96..1280 px"):  # a size the world does not draw
        bagfile.make_bag(tmp_path / "tiny", width=32, height=24)
    assert not (tmp_path / "tiny").exists()
    assert bagfile.main([str(tmp_path / "square"), "--width", "120", "--height", "120"]) == 2  # aspect 1:1


def test_header_stamp_is_read_from_the_cdr_bytes():
    # CDR little-endian: encapsulation 00 01 00 00, then int32 sec and uint32 nanosec
    data = bytes([0, 1, 0, 0]) + (1_700_000_123).to_bytes(4, "little") + (456).to_bytes(4, "little") + b"rest"
    assert bagfile.header_stamp_ns(data) == 1_700_000_123 * 10**9 + 456
    big = bytes([0, 0, 0, 0]) + (7).to_bytes(4, "big") + (8).to_bytes(4, "big")
    assert bagfile.header_stamp_ns(big) == 7 * 10**9 + 8


def test_make_bag_cli(tmp_path, capsys):
    assert bagfile.main([str(tmp_path / "bag"), "--frames", "3", "--storage", "mcap"]) == 0
    assert len(list(bagfile.read_images(tmp_path / "bag"))) == 3
    assert bagfile.main([str(tmp_path / "bag"), "--frames", "3"]) == 2  # exists
    assert "exists" in capsys.readouterr().err


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "jpeg"])
def test_world_bag_holds_the_stream_and_its_questions(tmp_path, encoding):
    from streamcache_ros import world
    from streamcache_ros.node.image_conversion import image_to_rgb as to_rgb

    look = world.Look(320, 240, (40, 50, 60), 0, 0, False, encoding, 92)
    bag = bagfile.make_world_bag(tmp_path / "w", seed=5, frames=24, ask_at=[12], look=look)
    stream = world.make_stream(5, 24, question_points=[12], look=look)
    messages = list(bagfile.read_images(bag))
    topic = "/camera/image_raw/compressed" if encoding == "jpeg" else "/camera/image_raw"
    assert [m.topic for m in messages] == [topic] * 24
    assert [m.stamp_ns - messages[0].stamp_ns for m in messages] == [i * 1_000_000_000 for i in range(24)]
    store = bagfile._typestore()
    msg = store.deserialize_cdr(messages[7].rawdata, messages[7].msgtype)
    rgb = to_rgb(msg)
    if encoding == "jpeg":
        assert np.abs(rgb.astype(int) - stream.raw_frame(7).astype(int)).mean() < 3
    else:
        assert msg.encoding == encoding and np.array_equal(rgb, stream.raw_frame(7))
    record = bagfile.read_world_questions(bag)
    expected = [q.to_dict() for n in (12, 24) for q in stream.questions(n)]
    assert [{k: q[k] for k in expected[0]} for q in record["questions"]] == expected
    assert {q["after_frames"] for q in record["questions"]} == {12, 24}
    for q in record["questions"]:
        assert q["asked_after_stamp_ns"] == messages[q["after_frames"] - 1].stamp_ns
    assert len(record["truth"]) == 24 and record["world"]["topic"] == topic


def test_world_bag_cli(tmp_path, capsys):
    assert bagfile.main([str(tmp_path / "w"), "--world", "--seed", "3", "--frames", "16", "--encoding", "jpeg",
                         "--width", "160", "--height", "120"]) == 0
    assert "world seed 3, 16 frames at 1 fps on /camera/image_raw/compressed (160x120 jpeg" in capsys.readouterr().out
    assert bagfile.main([str(tmp_path / "w"), "--world", "--frames", "16"]) == 2  # exists
    assert bagfile.main([str(tmp_path / "x"), "--world", "--frames", "16", "--ask-at", "2"]) == 2
