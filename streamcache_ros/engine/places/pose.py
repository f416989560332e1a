"""A robot's pose over time: kept as it arrives, read at a frame's stamp (docs/places.md "The pose
of a frame")."""
from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from dataclasses import dataclass


CATCH_UP_S = 1.0  # how long archiving a chunk waits for a pose source that is behind its frames
ALIVE_S = 2.0  # a source with no pose for this long is not waited for


@dataclass(frozen=True)
class Pose:
    """A pose in ``frame_id``: position in metres, orientation as a unit quaternion."""

    x: float
    y: float
    z: float = 0.0
    qx: float = 0.0
    qy: float = 0.0
    qz: float = 0.0
    qw: float = 1.0
    frame_id: str = ""

    @property
    def yaw(self) -> float:
        return math.atan2(2.0 * (self.qw * self.qz + self.qx * self.qy), 1.0 - 2.0 * (self.qy ** 2 + self.qz ** 2))

    def distance_to(self, x: float, y: float) -> float:
        return math.hypot(self.x - x, self.y - y)

    def as_list(self) -> list[float]:
        """What the archive keeps of it (its frame is the chunk's)."""
        return [round(v, 4) for v in (self.x, self.y, self.z)] + [round(v, 6) for v in
                                                                  (self.qx, self.qy, self.qz, self.qw)]

    @classmethod
    def from_list(cls, values, frame_id: str = "") -> "Pose":
        return cls(*(float(v) for v in values[:7]), frame_id=frame_id)

    @classmethod
    def planar(cls, x: float, y: float, yaw: float, frame_id: str = "") -> "Pose":
        return cls(x, y, 0.0, 0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2), frame_id)


def interpolate(before: Pose, after: Pose, share: float) -> Pose:
    """The pose ``share`` (0..1) of the way from ``before`` to ``after``: positions linearly, the
    orientation by spherical interpolation (the shorter way round)."""
    a = (before.qx, before.qy, before.qz, before.qw)
    b = (after.qx, after.qy, after.qz, after.qw)
    dot = sum(p * q for p, q in zip(a, b))
    if dot < 0:
        b, dot = tuple(-q for q in b), -dot
    if dot > 0.9995:  # nearly the same: linear, then normalised
        q = [p + share * (r - p) for p, r in zip(a, b)]
    else:
        theta = math.acos(min(1.0, dot))
        wa, wb = math.sin((1 - share) * theta) / math.sin(theta), math.sin(share * theta) / math.sin(theta)
        q = [wa * p + wb * r for p, r in zip(a, b)]
    norm = math.sqrt(sum(v * v for v in q)) or 1.0
    return Pose(before.x + share * (after.x - before.x), before.y + share * (after.y - before.y),
                before.z + share * (after.z - before.z), *(v / norm for v in q), frame_id=before.frame_id)


class PoseTrack:
    """The poses a source sent, by stamp, the newest ``capacity`` of them; ``at(stamp)`` interpolates
    between the two that bracket it when both lie within ``tolerance`` seconds of it, else takes the
    nearest one within ``tolerance``, else None (the frame is kept without a pose, and says so).
    Thread-safe: the pose callback adds while the encoder's thread reads."""

    def __init__(self, tolerance: float = 0.5, capacity: int = 100_000):
        if tolerance <= 0:
            raise ValueError(f"pose tolerance must be > 0 s, got {tolerance}")
        self.tolerance = float(tolerance)
        self._stamps: deque[float] = deque(maxlen=capacity)
        self._poses: deque[Pose] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._added = threading.Condition(self._lock)
        self._last_added = -math.inf  # monotonic time of the newest add: whether the source is alive
        self.received = 0
        self.out_of_order = 0
        self.frames_posed = 0  # frames archived with a pose, and without one (none near their stamp)
        self.frames_without = 0
        self._counted_until: dict[str, float] = {}  # per camera: a chunk made whole again is not counted twice

    def __len__(self) -> int:
        return len(self._stamps)

    def add(self, stamp: float, pose: Pose) -> None:
        with self._lock:
            self.received += 1
            self._last_added = time.monotonic()
            self._added.notify_all()
            if self._stamps and stamp < self._stamps[-1]:
                # a late pose (another publisher, a replay restarting): kept in order, a rare slow path
                self.out_of_order += 1
                if stamp < self._stamps[0]:
                    return
                stamps, poses = list(self._stamps), list(self._poses)
                i = bisect.bisect_right(stamps, stamp)
                stamps.insert(i, stamp)
                poses.insert(i, pose)
                self._stamps.clear(), self._poses.clear()
                self._stamps.extend(stamps), self._poses.extend(poses)
                return
            self._stamps.append(stamp)
            self._poses.append(pose)

    def clear(self) -> None:
        with self._lock:
            self._stamps.clear()
            self._poses.clear()

    @property
    def frame_id(self) -> str:
        """The frame the newest pose is in (a robot's pose source keeps one)."""
        with self._lock:
            return self._poses[-1].frame_id if self._poses else ""

    @property
    def newest_stamp(self) -> float | None:
        with self._lock:
            return self._stamps[-1] if self._stamps else None

    def at(self, stamp: float) -> Pose | None:
        with self._lock:
            if not self._stamps:
                return None
            stamps = self._stamps
            i = bisect.bisect_left(stamps, stamp)
            before = i - 1 if i > 0 else None
            after = i if i < len(stamps) else None
            if after is not None and stamps[after] == stamp:
                return self._poses[after]
            near_before = before is not None and stamp - stamps[before] <= self.tolerance
            near_after = after is not None and stamps[after] - stamp <= self.tolerance
            if near_before and near_after:
                share = (stamp - stamps[before]) / (stamps[after] - stamps[before])
                return interpolate(self._poses[before], self._poses[after], share)
            if near_before:
                return self._poses[before]
            if near_after:
                return self._poses[after]
            return None

    def catch_up(self, stamp: float, timeout: float = CATCH_UP_S) -> bool:
        """Wait, ``timeout`` seconds at most, for a pose at or past ``stamp`` while the source is alive
        (a pose came in the last ALIVE_S) but behind: a burst of odometry still in the queue when a
        chunk is archived would leave its newest frames without a pose. Whether one came."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._stamps or self._stamps[-1] < stamp:
                left = deadline - time.monotonic()
                if left <= 0 or time.monotonic() - self._last_added > ALIVE_S:
                    return False
                self._added.wait(min(left, 0.05))
            return True

    def for_frames(self, stamps: list[float], camera: str = "") -> list[list[float] | None]:
        """Each frame's pose as the archive keeps it (``Pose.as_list``), None where none is near;
        counted once per frame."""
        poses = [self.at(stamp) for stamp in stamps]
        counted = self._counted_until.get(camera, -math.inf)
        fresh = [pose for pose, stamp in zip(poses, stamps) if stamp > counted]
        self.frames_posed += sum(pose is not None for pose in fresh)
        self.frames_without += sum(pose is None for pose in fresh)
        if stamps:
            self._counted_until[camera] = max(counted, max(stamps))
        return [None if pose is None else pose.as_list() for pose in poses]


def snapshot_poses(tier) -> dict:
    """The poses of the working memory's frames, for a memory snapshot: a memory loaded where no
    archive or pose source holds them still says where each frame was taken (docs/places.md)."""
    frames = [(unit.camera, stamp) for unit in tier.ledger.units.values() for stamp in unit.stamps]
    poses = tier.poses_of([s for _, s in frames], [c for c, _ in frames]) if frames else []
    return {"frame_poses": [[c, float(s), p.frame_id, p.as_list()] for (c, s), p in zip(frames, poses)
                            if p is not None]}


def restored_poses(state: dict) -> dict[tuple[str, float], Pose]:
    """A snapshot's frame poses by (camera, stamp); none from a snapshot made before poses."""
    return {(str(c), round(float(s), 4)): Pose.from_list(v, str(f)) for c, s, f, v in state.get("frame_poses", [])}
