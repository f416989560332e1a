"""rosbag2 files of camera images, written and read with the pure-Python ``rosbags`` package.

    streamcache-make-bag data/demo_bag                      # the demo / test bag (deterministic)
    streamcache-make-bag /tmp/clip --storage mcap --frames 600 --fps 10 --compressed

The bag holds the synthetic clip (streamcache_ros/clip.py: moving coloured shapes, scene changes)
as sensor_msgs/Image (rgb8) on /camera/image_raw, stamped from a fixed start so every run makes the
same bytes; ``--compressed`` adds sensor_msgs/CompressedImage (PNG) on /camera/image_raw/compressed.
No rclpy here: ``streamcache-replay`` (node/replay.py) publishes what ``read_images`` yields.
"""
from __future__ import annotations

import argparse
import io
import pathlib
import shutil
import struct
import sys
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .. import clip

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED = "sensor_msgs/msg/CompressedImage"
IMAGE_TYPES = (IMAGE, COMPRESSED)
DEFAULT_TOPIC = "/camera/image_raw"
# 2023-11-14T22:13:20Z: stamps like a real recording, fixed so the bag is reproducible
DEFAULT_START_NS = 1_700_000_000 * 1_000_000_000
STORAGES = ("sqlite3", "mcap")


def _typestore():
    from rosbags.typesys import Stores, get_typestore  # noqa: PLC0415

    return get_typestore(Stores.ROS2_JAZZY)


def _png(rgb: np.ndarray) -> bytes:
    from PIL import Image  # noqa: PLC0415

    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="PNG", optimize=False)
    return out.getvalue()


def make_bag(path: str | pathlib.Path, frames: int = 120, fps: float = 2.0, width: int = 160, height: int = 120,
             topic: str = DEFAULT_TOPIC, storage: str = "sqlite3", start_ns: int = DEFAULT_START_NS,
             compressed: bool = False, first_frame: int = 0, overwrite: bool = False) -> pathlib.Path:
    """Write ``frames`` clip frames at ``fps`` (stamps start_ns + i / fps) to a new bag at ``path``."""
    from rosbags.rosbag2 import StoragePlugin, Writer  # noqa: PLC0415

    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got '{storage}'")
    if frames < 1 or fps <= 0:
        raise ValueError("frames must be >= 1 and fps > 0")
    path = pathlib.Path(path)
    if path.exists():
        if not overwrite:
            raise FileExistsError(f"{path} exists (use overwrite)")
        shutil.rmtree(path)
    store = _typestore()
    Image, CompressedImage = store.types[IMAGE], store.types[COMPRESSED]
    Header, Time = store.types["std_msgs/msg/Header"], store.types["builtin_interfaces/msg/Time"]
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        raw_conn = writer.add_connection(topic, IMAGE, typestore=store)
        png_conn = writer.add_connection(topic + "/compressed", COMPRESSED, typestore=store) if compressed else None
        for i, rgb in enumerate(clip.clip(frames, height=height, width=width, start=first_frame)):
            stamp_ns = start_ns + int(round(i * 1e9 / fps))
            header = Header(stamp=Time(sec=stamp_ns // 1_000_000_000, nanosec=stamp_ns % 1_000_000_000),
                            frame_id="camera")
            msg = Image(header=header, height=height, width=width, encoding="rgb8", is_bigendian=0,
                        step=width * 3, data=rgb.reshape(-1))
            writer.write(raw_conn, stamp_ns, store.serialize_cdr(msg, IMAGE))
            if png_conn is not None:
                cmsg = CompressedImage(header=header, format="png",
                                       data=np.frombuffer(_png(rgb), dtype=np.uint8))
                writer.write(png_conn, stamp_ns, store.serialize_cdr(cmsg, COMPRESSED))
    return path


@dataclass
class BagMessage:
    topic: str
    msgtype: str
    log_time_ns: int  # when it was recorded: replay timing
    stamp_ns: int  # header.stamp: what the node samples by
    rawdata: bytes  # CDR with its encapsulation header, as rmw publishes it


def header_stamp_ns(rawdata: bytes) -> int:
    """header.stamp of a CDR-serialised message that starts with a std_msgs/Header (Image and
    CompressedImage do): 4 bytes of encapsulation, then int32 sec and uint32 nanosec."""
    little = rawdata[1] == 1  # encapsulation kind 0x0001: CDR little-endian
    sec, nanosec = struct.unpack_from("<iI" if little else ">iI", rawdata, 4)
    return sec * 1_000_000_000 + nanosec


def image_topics(path: str | pathlib.Path) -> dict[str, str]:
    """Image and CompressedImage topics in the bag -> message type."""
    from rosbags.highlevel import AnyReader  # noqa: PLC0415

    with AnyReader([pathlib.Path(path)], default_typestore=_typestore()) as reader:
        return {c.topic: c.msgtype for c in reader.connections if c.msgtype in IMAGE_TYPES}


def read_images(path: str | pathlib.Path, topics: list[str] | None = None) -> Iterator[BagMessage]:
    """The bag's image messages (sqlite3 or mcap), in recording order."""
    from rosbags.highlevel import AnyReader  # noqa: PLC0415

    with AnyReader([pathlib.Path(path)], default_typestore=_typestore()) as reader:
        connections = [c for c in reader.connections
                       if c.msgtype in IMAGE_TYPES and (topics is None or c.topic in topics)]
        if topics is not None:
            missing = sorted(set(topics) - {c.topic for c in connections})
            if missing:
                raise ValueError(f"no image topic {', '.join(missing)} in {path}")
        for connection, log_time, rawdata in reader.messages(connections=connections):
            yield BagMessage(connection.topic, connection.msgtype, log_time, header_stamp_ns(rawdata), bytes(rawdata))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamcache-make-bag",
                                     description="Write the synthetic clip to a rosbag2 (sqlite3 or mcap).")
    parser.add_argument("path", help="the bag directory to create")
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--fps", type=float, default=2.0, help="camera rate: stamps are 1/fps apart")
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--height", type=int, default=120)
    parser.add_argument("--topic", default=DEFAULT_TOPIC)
    parser.add_argument("--storage", choices=STORAGES, default="sqlite3")
    parser.add_argument("--compressed", action="store_true", help="also write <topic>/compressed (PNG)")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        path = make_bag(args.path, args.frames, args.fps, args.width, args.height, args.topic, args.storage,
                        compressed=args.compressed, overwrite=args.overwrite)
    except (ValueError, FileExistsError) as err:
        print(f"streamcache-make-bag: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}: {args.frames} frames at {args.fps} fps on {args.topic} ({args.storage})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
