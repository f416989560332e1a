"""The demo / test bag: written with rosbags (sqlite3 and mcap), read back with the clip's pixels and
the stamps it was made with; the same bytes every time."""
import io

import numpy as np
import pytest
from PIL import Image as PILImage
from rosbags.highlevel import AnyReader

from streamcache_ros import clip
from streamcache_ros.tools import bagfile

START = bagfile.DEFAULT_START_NS


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_bag_holds_the_clip_with_its_stamps(tmp_path, storage):
    path = bagfile.make_bag(tmp_path / "bag", frames=6, fps=4.0, width=32, height=24, storage=storage,
                            compressed=True)
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
            assert (msg.encoding, msg.width, msg.height, msg.step) == ("rgb8", 32, 24, 96)
            np.testing.assert_array_equal(msg.data.reshape(24, 32, 3), clip.frame(i, 24, 32))
            assert msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec == raw[i].stamp_ns
    with AnyReader([path]) as reader:
        first_png = next(d for c, _, d in reader.messages() if c.topic.endswith("/compressed"))
        msg = reader.deserialize(first_png, bagfile.COMPRESSED)
        assert msg.format == "png"
        np.testing.assert_array_equal(np.asarray(PILImage.open(io.BytesIO(msg.data.tobytes()))), clip.frame(0, 24, 32))


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
