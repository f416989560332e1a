"""rosbag2 files of camera images, written and read with the pure-Python ``rosbags`` package.

    streamcache-make-bag data/demo_bag                      # the demo / test bag (deterministic)
    streamcache-make-bag /tmp/frames --storage mcap --frames 600 --fps 10 --compressed
    streamcache-make-bag /tmp/world --world --seed 7 --frames 512 --ask-at 32 64 128
    streamcache-make-bag /tmp/patrol --world --patrol --seed 7 --frames 900 --width 320 --height 240

The bag holds frames of one fixed shape-world stream (docs/world.md: coloured shapes that appear,
leave, move and change colour; ``world.world_frames``) as sensor_msgs/Image (rgb8) on
/camera/image_raw, stamped from a fixed start so every run makes the same bytes; ``--compressed``
adds sensor_msgs/CompressedImage (PNG) on /camera/image_raw/compressed. ``--world`` writes a seeded
stream of its own with its questions instead (``make_world_bag``); ``--patrol`` makes it a patrol
stream with the robot's odometry on /odom and the map's places (``make_patrol_bag``, docs/world.md
"The patrol world").
No rclpy here: ``streamcache-replay`` (node/replay.py) publishes what ``read_images`` yields.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import pathlib
import shutil
import struct
import sys
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .. import world

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED = "sensor_msgs/msg/CompressedImage"
IMAGE_TYPES = (IMAGE, COMPRESSED)
DEFAULT_TOPIC = "/camera/image_raw"
# 2023-11-14T22:13:20Z: stamps like a real recording, fixed so the bag is reproducible
DEFAULT_START_NS = 1_700_000_000 * 1_000_000_000
STORAGES = ("sqlite3", "mcap")
ODOMETRY = "nav_msgs/msg/Odometry"
# what a node's pose_topic takes, and what a patrol bag can carry its poses as
POSE_TYPES = (ODOMETRY, "geometry_msgs/msg/PoseStamped", "geometry_msgs/msg/PoseWithCovarianceStamped")
ODOM_TOPIC = "/odom"
ODOM_RATE_HZ = 4.0
# odometry is stamped off the frames' stamps, as on a robot: a node must interpolate between samples
ODOM_PHASE_S = 0.13
PLACES_FILE = "places.yaml"


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
    """Write ``frames`` frames of the fixed world stream, from its frame ``first_frame``, at ``fps``
    (stamps start_ns + i / fps) to a new bag at ``path``. The size must be one the world draws
    (docs/world.md: 96..1280 px, aspect 4:3..16:9)."""
    from rosbags.rosbag2 import StoragePlugin, Writer  # noqa: PLC0415

    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got '{storage}'")
    if frames < 1 or fps <= 0:
        raise ValueError("frames must be >= 1 and fps > 0")
    world.fixed_look(height, width)  # a size the world cannot draw fails here, before the bag exists
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
        for i, rgb in enumerate(world.world_frames(frames, first_frame, height, width)):
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


WORLD_QUESTIONS_FILE = "world_questions.json"


def _header(store, stamp_ns: int, frame_id: str):
    Header, Time = store.types["std_msgs/msg/Header"], store.types["builtin_interfaces/msg/Time"]
    return Header(stamp=Time(sec=stamp_ns // 1_000_000_000, nanosec=stamp_ns % 1_000_000_000), frame_id=frame_id)


def _image_message(store, stamp_ns: int, rgb: np.ndarray, encoding: str, jpeg: bytes | None = None):
    header = _header(store, stamp_ns, "camera")
    if encoding == "jpeg":
        return store.types[COMPRESSED](header=header, format="jpeg", data=np.frombuffer(jpeg, dtype=np.uint8))
    pixels = rgb[:, :, ::-1] if encoding == "bgr8" else rgb
    height, width = rgb.shape[:2]
    return store.types[IMAGE](header=header, height=height, width=width, encoding=encoding, is_bigendian=0,
                              step=width * 3, data=np.ascontiguousarray(pixels).reshape(-1))


def make_world_bag(path: str | pathlib.Path, seed: int, frames: int, ask_at=(), look=None,
                   topic: str = DEFAULT_TOPIC, storage: str = "sqlite3", start_ns: int = DEFAULT_START_NS,
                   overwrite: bool = False, absent: tuple[tuple[str, str], ...] = ()) -> pathlib.Path:
    """A shape-world stream (docs/world.md) at 1 frame per second, as the camera would publish it:
    ``rgb8`` / ``bgr8`` Images on ``topic``, or JPEG CompressedImages on ``<topic>/compressed``. Beside
    the frames, ``world_questions.json`` in the bag's folder holds the stream's per-frame truth and
    every question whose precondition holds after each of ``ask_at`` frames and at the end, with
    its true option, so a replay can be scored. ``absent``: identities the stream never shows
    (``world.make_stream``)."""
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got '{storage}'")
    points = _question_points(ask_at, frames)
    stream = world.make_stream(seed, frames, question_points=points, look=look, absent=absent)
    path = _fresh(pathlib.Path(path), overwrite)
    stamps = [start_ns + i * 1_000_000_000 for i in range(frames)]
    camera_topic = _write_frames(path, stream, range(frames), stamps, topic, storage)
    _write_record(path / WORLD_QUESTIONS_FILE, stream, seed, points, stamps, camera_topic, start_ns)
    return path


def make_patrol_bag(path: str | pathlib.Path, seed: int, frames: int, ask_at=(), look=None,
                    topic: str = DEFAULT_TOPIC, storage: str = "sqlite3", start_ns: int = DEFAULT_START_NS,
                    overwrite: bool = False, absent: tuple[tuple[str, str], ...] = (), place_count: int = 6,
                    odom_topic: str = ODOM_TOPIC, pose_type: str = ODOMETRY) -> pathlib.Path:
    """A patrol stream (docs/world.md "The patrol world") as ``make_world_bag`` writes a world stream,
    plus nav_msgs/Odometry on ``odom_topic`` at 4 Hz (frame "map", child "base_link"), stamped
    0.13 s off the frames; ``pose_type`` one of POSE_TYPES for a PoseStamped or an AMCL-style
    PoseWithCovarianceStamped instead. ``world_questions.json`` also holds the places, the route and
    each frame's pose; ``places.yaml`` beside it is the node's ``places_file`` for the map."""
    if pose_type not in POSE_TYPES:
        raise ValueError(f"pose_type must be one of {POSE_TYPES}, got '{pose_type}'")
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got '{storage}'")
    points = _question_points(ask_at, frames)
    places = world.patrol_map(seed, place_count)
    stream = world.make_long_patrol_stream(seed, frames, points, look, absent, places)
    path = _fresh(pathlib.Path(path), overwrite)
    stamps = [start_ns + i * 1_000_000_000 for i in range(frames)]
    last = math.ceil((frames - 1 - ODOM_PHASE_S) * ODOM_RATE_HZ)
    odometry = [(start_ns + round(t * 1e9), *stream.pose_at(t), stream.speed_at(t))
                for t in (ODOM_PHASE_S + k / ODOM_RATE_HZ for k in range(-1, last + 1))]
    camera_topic = _write_frames(path, stream, range(frames), stamps, topic, storage, odometry, odom_topic, pose_type)
    patrol = {"frame_id": world.MAP_FRAME, "odom_topic": odom_topic, "odom_rate_hz": ODOM_RATE_HZ,
              "odom_phase_s": ODOM_PHASE_S, "places_file": PLACES_FILE,
              "places": [{"name": p.name, "x": p.x, "y": p.y, "radius": p.radius} for p in stream.places],
              "route": list(stream.route), "relocations": stream.patrol.relocations,
              "poses": [[round(v, 4) for v in stream.pose(i)] for i in range(frames)],
              "place_at": [stream.place_at(i) for i in range(frames)]}
    _write_record(path / WORLD_QUESTIONS_FILE, stream, seed, points, stamps, camera_topic, start_ns, {"patrol": patrol})
    (path / PLACES_FILE).write_text(world.places_yaml(stream.places))
    return path


def _odometry_message(store, stamp_ns: int, x: float, y: float, yaw: float, speed: float):
    t = store.types
    zero = t["geometry_msgs/msg/Vector3"](x=0.0, y=0.0, z=0.0)
    pose = t["geometry_msgs/msg/Pose"](position=t["geometry_msgs/msg/Point"](x=x, y=y, z=0.0),
                                       orientation=t["geometry_msgs/msg/Quaternion"](
                                           x=0.0, y=0.0, z=math.sin(yaw / 2), w=math.cos(yaw / 2)))
    twist = t["geometry_msgs/msg/Twist"](linear=t["geometry_msgs/msg/Vector3"](x=speed, y=0.0, z=0.0), angular=zero)
    return t[ODOMETRY](header=_header(store, stamp_ns, world.MAP_FRAME), child_frame_id="base_link",
                       pose=t["geometry_msgs/msg/PoseWithCovariance"](pose=pose, covariance=np.zeros(36)),
                       twist=t["geometry_msgs/msg/TwistWithCovariance"](twist=twist, covariance=np.zeros(36)))


def _pose_message(store, pose_type: str, stamp_ns: int, x: float, y: float, yaw: float, speed: float):
    """A pose sample as ``pose_type``: Odometry, PoseStamped or PoseWithCovarianceStamped."""
    if pose_type == ODOMETRY:
        return _odometry_message(store, stamp_ns, x, y, yaw, speed)
    odometry = _odometry_message(store, stamp_ns, x, y, yaw, speed)
    if pose_type == "geometry_msgs/msg/PoseStamped":
        return store.types[pose_type](header=odometry.header, pose=odometry.pose.pose)
    return store.types[pose_type](header=odometry.header, pose=odometry.pose)


def read_odometry(path: str | pathlib.Path, topic: str = ODOM_TOPIC) -> list[tuple[int, float, float, float]]:
    """(stamp ns, x, y, yaw) of each Odometry message on ``topic``, in recording order."""
    from rosbags.highlevel import AnyReader  # noqa: PLC0415

    out = []
    with AnyReader([pathlib.Path(path)], default_typestore=_typestore()) as reader:
        connections = [c for c in reader.connections if c.topic == topic and c.msgtype == ODOMETRY]
        for connection, _, rawdata in reader.messages(connections=connections):
            msg = reader.deserialize(rawdata, connection.msgtype)
            q = msg.pose.pose.orientation
            out.append((header_stamp_ns(bytes(rawdata)), msg.pose.pose.position.x, msg.pose.pose.position.y,
                        2 * math.atan2(q.z, q.w)))
    return out


def make_world_segments(folder: str | pathlib.Path, seed: int, frames: int, segment_frames: int, look=None,
                        topic: str = DEFAULT_TOPIC, start_ns: int = DEFAULT_START_NS,
                        overwrite: bool = False, absent: tuple[tuple[str, str], ...] = ()) -> list[pathlib.Path]:
    """One world stream of ``frames`` frames written as consecutive bags of ``segment_frames`` each
    (``<folder>/segment000`` ...; stamps run on from bag to bag), with the questions asked at the end
    of every segment in ``<folder>/world_questions.json``: a long stream replayed a segment at a
    time, questions in between (bench/hour_soak.py)."""
    stream = world_segments_stream(seed, frames, segment_frames, look, absent)
    points = _question_points(range(segment_frames, frames + 1, segment_frames), frames)
    folder = _fresh(pathlib.Path(folder), overwrite)
    stamps = [start_ns + i * 1_000_000_000 for i in range(frames)]
    bags, camera_topic = [], topic
    for k, first in enumerate(range(0, frames, segment_frames)):
        indices = range(first, min(first + segment_frames, frames))
        bags.append(folder / f"segment{k:03d}")
        camera_topic = _write_frames(bags[-1], stream, indices, [stamps[i] for i in indices], topic, "sqlite3")
    _write_record(folder / WORLD_QUESTIONS_FILE, stream, seed, points, stamps, camera_topic, start_ns)
    return bags


def world_segments_stream(seed: int, frames: int, segment_frames: int, look=None,
                          absent: tuple[tuple[str, str], ...] = ()) -> world.WorldStream:
    """The world stream ``make_world_segments`` writes: still at every segment's end, so that
    questions may be asked there (bench/archive_restarts.py asks its own of it); ``absent``:
    identities it never shows."""
    points = _question_points(range(segment_frames, frames + 1, segment_frames), frames)
    return world.make_stream(seed, frames, question_points=points, look=look, absent=absent)


def _question_points(ask_at, frames: int) -> list[int]:
    points = sorted({int(n) for n in ask_at} | {frames})
    if any(not world.STABLE_FRAMES <= n <= frames for n in points):
        raise ValueError(f"questions can be asked after {world.STABLE_FRAMES}..{frames} frames, got {points}")
    return points


def _fresh(path: pathlib.Path, overwrite: bool) -> pathlib.Path:
    if path.exists():
        if not overwrite:
            raise FileExistsError(f"{path} exists (use overwrite)")
        shutil.rmtree(path)
    return path


def _write_frames(path: pathlib.Path, stream, indices, stamps: list[int], topic: str, storage: str,
                  odometry=(), odom_topic: str = ODOM_TOPIC, pose_type: str = ODOMETRY) -> str:
    """The frames ``indices`` of ``stream`` as a bag at ``path``, and ``odometry`` ((stamp ns, x, y,
    yaw, speed) each) on ``odom_topic`` in stamp order among them; returns the camera topic written."""
    from rosbags.rosbag2 import StoragePlugin, Writer  # noqa: PLC0415

    store = _typestore()
    encoding = stream.look.encoding
    camera_topic = topic + "/compressed" if encoding == "jpeg" else topic
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        msgtype = COMPRESSED if encoding == "jpeg" else IMAGE
        conn = writer.add_connection(camera_topic, msgtype, typestore=store)
        odom_conn = writer.add_connection(odom_topic, pose_type, typestore=store) if odometry else None
        pending = list(odometry)[::-1]

        def write_odometry(until_ns: float) -> None:
            while pending and pending[-1][0] <= until_ns:
                sample = pending.pop()
                writer.write(odom_conn, sample[0], store.serialize_cdr(_pose_message(store, pose_type, *sample), pose_type))

        for i, stamp_ns in zip(indices, stamps):
            write_odometry(stamp_ns)
            raw = stream.raw_frame(i)
            msg = _image_message(store, stamp_ns, raw, encoding, stream.jpeg(i, raw) if encoding == "jpeg" else None)
            writer.write(conn, stamp_ns, store.serialize_cdr(msg, msgtype))
        write_odometry(math.inf)
    return camera_topic


def _write_record(path: pathlib.Path, stream, seed: int, points: list[int], stamps: list[int], camera_topic: str,
                  start_ns: int, extra: dict | None = None) -> None:
    """The stream's truth and every question at ``points`` with its true option (and stamps)."""
    questions = [q.to_dict() for n in points for q in stream.questions(n)]
    for q in questions:
        q["asked_after_stamp_ns"] = stamps[q["after_frames"] - 1]
        q["answer_stamp_ns"] = stamps[q["answer_frame"]] if q["answer_frame"] >= 0 else 0
    record = {"world": {"seed": seed, "frames": len(stream), "topic": camera_topic, "start_ns": start_ns,
                        "frame_period_s": world.FRAME_PERIOD_S, "look": dict(stream.look.__dict__)},
              "questions": questions,
              "truth": [[{"object": v.obj, "shape": v.shape, "colour": v.colour,
                          "box": [round(v.x0, 1), round(v.y0, 1), round(v.side, 1)]} for v in f] for f in stream.truth],
              **(extra or {})}
    path.write_text(json.dumps(record, indent=1) + "\n")


def read_world_questions(path: str | pathlib.Path) -> dict:
    """What ``make_world_bag`` wrote beside a world bag's frames (FileNotFoundError for another bag)."""
    return json.loads((pathlib.Path(path) / WORLD_QUESTIONS_FILE).read_text())


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


def pose_topics(path: str | pathlib.Path) -> dict[str, str]:
    """Odometry and pose topics in the bag -> message type (what a node's pose_topic reads)."""
    from rosbags.highlevel import AnyReader  # noqa: PLC0415

    with AnyReader([pathlib.Path(path)], default_typestore=_typestore()) as reader:
        return {c.topic: c.msgtype for c in reader.connections if c.msgtype in POSE_TYPES}


def read_poses(path: str | pathlib.Path, topics: list[str]) -> list[BagMessage]:
    """The bag's messages on the pose ``topics``, in recording order (a day of 4 Hz odometry is a
    few MB: read at once, so a replay can send each frame's poses ahead of it)."""
    from rosbags.highlevel import AnyReader  # noqa: PLC0415

    with AnyReader([pathlib.Path(path)], default_typestore=_typestore()) as reader:
        connections = [c for c in reader.connections if c.topic in topics]
        return [BagMessage(c.topic, c.msgtype, log_time, header_stamp_ns(raw), bytes(raw))
                for c, log_time, raw in reader.messages(connections=connections)]


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
                                     description="Write frames of the fixed shape-world stream, or a seeded world "
                                                 "stream with its questions, to a rosbag2 (sqlite3 or mcap).")
    parser.add_argument("path", help="the bag directory to create")
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--fps", type=float, default=2.0, help="camera rate: stamps are 1/fps apart")
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--height", type=int, default=120)
    parser.add_argument("--topic", default=DEFAULT_TOPIC)
    parser.add_argument("--storage", choices=STORAGES, default="sqlite3")
    parser.add_argument("--compressed", action="store_true", help="also write <topic>/compressed (PNG)")
    parser.add_argument("--overwrite", action="store_true")
    world_args = parser.add_argument_group("world mode: a shape-world stream with its questions (docs/world.md)")
    world_args.add_argument("--world", action="store_true",
                            help="write a seeded shape-world stream at 1 fps and world_questions.json beside it")
    world_args.add_argument("--seed", type=int, default=0)
    world_args.add_argument("--ask-at", type=int, nargs="*", default=[],
                            help="frame counts after which questions are asked (the end is always one)")
    world_args.add_argument("--patrol", action="store_true",
                            help="world mode: a patrol stream (docs/world.md), with Odometry on /odom and places.yaml")
    world_args.add_argument("--patrol-places", type=int, default=6, help="patrol mode: how many places on the map")
    world_args.add_argument("--encoding", choices=("rgb8", "bgr8", "jpeg"),
                            help="world mode: how frames are sent (default: drawn from the seed, as the size is)")
    args = parser.parse_args(argv)
    try:
        if args.patrol and not args.world:
            raise ValueError("--patrol needs --world")
        if args.world:
            look = None
            if args.encoding or "--width" in (argv or sys.argv) or "--height" in (argv or sys.argv):
                drawn = world.random_look(np.random.default_rng((args.seed, 0)))
                look = world.Look(**{**drawn.__dict__, "width": args.width, "height": args.height,
                                     "encoding": args.encoding or drawn.encoding})
            if args.patrol:
                path = make_patrol_bag(args.path, args.seed, args.frames, args.ask_at, look, args.topic, args.storage,
                                       overwrite=args.overwrite, place_count=args.patrol_places)
            else:
                path = make_world_bag(args.path, args.seed, args.frames, args.ask_at, look, args.topic, args.storage,
                                      overwrite=args.overwrite)
            record = read_world_questions(path)
            if args.patrol:
                route = " -> ".join(record["patrol"]["route"])
                print(f"patrol: {len(record['patrol']['places'])} places, route {route}; Odometry on {ODOM_TOPIC} "
                      f"at {ODOM_RATE_HZ:g} Hz; {path / PLACES_FILE}")
            print(f"wrote {path}: world seed {args.seed}, {args.frames} frames at 1 fps on {record['world']['topic']} "
                  f"({record['world']['look']['width']}x{record['world']['look']['height']} "
                  f"{record['world']['look']['encoding']}, {args.storage}); {len(record['questions'])} questions "
                  f"in {path / WORLD_QUESTIONS_FILE}")
            return 0
        path = make_bag(args.path, args.frames, args.fps, args.width, args.height, args.topic, args.storage,
                        compressed=args.compressed, overwrite=args.overwrite)
    except (ValueError, FileExistsError) as err:
        print(f"streamcache-make-bag: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}: {args.frames} frames at {args.fps} fps on {args.topic} ({args.storage})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
