"""What goes into a request and comes out of a reply, as plain Python: a time window's stamps, the
evidence frames' pictures as arrays (docs/interfaces.md "Time windows and evidence", docs/show.md)."""
from __future__ import annotations

import math

from dataclasses import dataclass

import numpy as np


def to_time(value):
    """A ``since`` / ``until``: None or 0 (open), seconds (float, as the camera stamps), or a
    builtin_interfaces/Time as it is."""
    from builtin_interfaces.msg import Time  # noqa: PLC0415

    if value is None:
        return Time()
    if isinstance(value, Time):
        return value
    ns = int(round(float(value) * 1e9))
    if ns < 0:
        raise ValueError(f"a stamp must be >= 0, got {value}")
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def time_request(since=None, until=None, evidence_k: int = 0, with_images: bool = False, place=None) -> dict:
    """The Ask request's (and goal's) time fields (docs/interfaces.md "Time windows and evidence"),
    and its place (``place_request``)."""
    return {"since": to_time(since), "until": to_time(until), "evidence_k": int(evidence_k),
            "with_images": bool(with_images), **place_request(place)}


def place_request(place=None) -> dict:
    """A request's place fields (docs/places.md): ``place`` a name from the node's places_file, or
    (x, y, radius) in metres in the pose frame; None: anywhere."""
    from geometry_msgs.msg import Point  # noqa: PLC0415

    if place is None or place == "":
        return {}
    if isinstance(place, str):
        return {"place": place}
    x, y, radius = (float(v) for v in place)
    return {"place_center": Point(x=x, y=y, z=0.0), "place_radius": radius}


@dataclass
class FramePose:
    """Where the robot was when it took a frame: x, y (metres), yaw (radians) in ``frame_id``."""

    stamp: float
    x: float
    y: float
    yaw: float
    frame_id: str


def frame_pose(pose_stamped) -> FramePose | None:
    """A reply's PoseStamped as a FramePose; None for a frame with no pose (an empty frame_id)."""
    if not pose_stamped.header.frame_id:
        return None
    p, q = pose_stamped.pose.position, pose_stamped.pose.orientation
    yaw = math.atan2(2.0 * (q.w * q.z + q.x * q.y), 1.0 - 2.0 * (q.y * q.y + q.z * q.z))
    stamp = pose_stamped.header.stamp.sec + pose_stamped.header.stamp.nanosec * 1e-9
    return FramePose(stamp, p.x, p.y, yaw, pose_stamped.header.frame_id)


def evidence_poses(reply) -> list[FramePose | None]:
    """An Ask reply's evidence poses, one per evidence frame (None where the frame has none)."""
    return [frame_pose(p) for p in reply.evidence_poses]


@dataclass
class EvidenceImage:
    """One of a reply's evidence_images: the frame's stamp (seconds), its camera, RGB uint8 [H, W, 3]."""

    stamp: float
    camera: str
    rgb: np.ndarray
    jpeg: bytes


def evidence_images(reply) -> list[EvidenceImage]:
    """A reply's ``evidence_images`` (Ask or When asked ``with_images=True``) decoded to arrays, in
    the reply's order (docs/show.md)."""
    import io  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415 - only a caller that wants pictures pays for the import

    out = []
    for msg in getattr(reply, "evidence_images", []):
        data = bytes(msg.data)
        with Image.open(io.BytesIO(data)) as image:
            rgb = np.asarray(image.convert("RGB"))
        out.append(EvidenceImage(msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9, msg.header.frame_id, rgb, data))
    return out
