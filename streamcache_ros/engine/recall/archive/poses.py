"""The poses the archive keeps with its frames, read back: a frame's pose, the frames taken within a
place (through the R*Tree of chunk extents), the robot's path (docs/places.md "In the archive").

Plain functions over a reader connection, as thumbnails.py reads the thumbnails."""
from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass

import numpy as np

from ...places import Place, Pose
from .spans import span_query, sql_stamp


@dataclass
class PosedFrames:
    """Archived frames with their poses, oldest first: parallel arrays."""

    stamps: np.ndarray  # float64
    cameras: np.ndarray  # str
    chunk_ids: np.ndarray  # int64
    xy: np.ndarray  # [n, 2] float64
    frame_id: str = ""

    def __len__(self) -> int:
        return len(self.stamps)

    @classmethod
    def empty(cls) -> "PosedFrames":
        return cls(np.zeros(0), np.zeros(0, dtype=object), np.zeros(0, np.int64), np.zeros((0, 2)))


def _frames(rows, since: float, until: float) -> PosedFrames:
    stamps, cameras, ids, xy, frame_id = [], [], [], [], ""
    for chunk_id, camera, stamps_json, poses_json, pose_frame in rows:
        if poses_json is None:
            continue
        frame_id = frame_id or (pose_frame or "")
        for stamp, pose in zip(json.loads(stamps_json), json.loads(poses_json)):
            if pose is not None and since <= stamp <= until:
                stamps.append(float(stamp)), cameras.append(camera), ids.append(int(chunk_id))
                xy.append((float(pose[0]), float(pose[1])))
    if not stamps:
        return PosedFrames.empty()
    order = np.argsort(np.asarray(stamps), kind="stable")
    return PosedFrames(np.asarray(stamps)[order], np.asarray(cameras, dtype=object)[order],
                       np.asarray(ids, np.int64)[order], np.asarray(xy, float).reshape(-1, 2)[order], frame_id)


def frames_in_place(db: sqlite3.Connection, place: Place, since: float = -math.inf, until: float = math.inf,
                    camera: str = "") -> PosedFrames:
    """The archived frames of since..until (of ``camera``) taken within ``place``: the R*Tree names
    the chunks whose extent meets the place's square, their poses say which frames lie in its disc."""
    query = ("SELECT c.id, c.camera, c.stamps, c.poses, c.pose_frame FROM chunk_extent e JOIN chunks c ON c.id = e.id "
             "WHERE e.max_x >= ? AND e.min_x <= ? AND e.max_y >= ? AND e.min_y <= ? "
             "AND c.last_stamp >= ? AND c.first_stamp <= ?")
    args: list = [place.x - place.radius, place.x + place.radius, place.y - place.radius, place.y + place.radius,
                  sql_stamp(since), sql_stamp(until)]
    if camera:
        query += " AND c.camera = ?"
        args.append(camera)
    found = _frames(db.execute(query, args), since, until)
    if not len(found):
        return found
    inside = place.contains(found.xy[:, 0], found.xy[:, 1])
    return PosedFrames(found.stamps[inside], found.cameras[inside], found.chunk_ids[inside], found.xy[inside],
                       found.frame_id)


def posed_frames(db: sqlite3.Connection, since: float = -math.inf, until: float = math.inf,
                 camera: str = "") -> PosedFrames:
    """Every archived frame of since..until (of ``camera``) that has a pose: the robot's path."""
    query, args = span_query("id, camera, stamps, poses, pose_frame", since, until, camera)
    return _frames(db.execute(query + " AND poses IS NOT NULL", args), since, until)


def nearest_pass(db: sqlite3.Connection, place: Place, since: float = -math.inf, until: float = math.inf,
                 camera: str = "") -> tuple[float, float] | None:
    """(the least distance from the place's centre at which a frame was taken, that frame's stamp),
    over since..until; None when no frame there has a pose (what a refusal says)."""
    path = posed_frames(db, since, until, camera)
    if not len(path):
        return None
    distance = np.hypot(path.xy[:, 0] - place.x, path.xy[:, 1] - place.y)
    i = int(np.argmin(distance))
    return float(distance[i]), float(path.stamps[i])


def poses_at(db: sqlite3.Connection, stamps: list[float], cameras: list[str] | None = None,
             tolerance: float = 1e-3) -> list[Pose | None]:
    """The archived pose of each frame stamped ``stamps[i]`` (of ``cameras[i]`` when given), None
    where the frame has none or the archive no longer holds it."""
    cameras = list(cameras or [])
    found: list[Pose | None] = []
    for i, stamp in enumerate(stamps):
        camera = cameras[i] if i < len(cameras) else ""
        query = ("SELECT stamps, poses, pose_frame FROM chunks WHERE first_stamp <= ? AND last_stamp >= ? "
                 "AND poses IS NOT NULL" + (" AND camera = ?" if camera else ""))
        args = [float(stamp) + tolerance, float(stamp) - tolerance] + ([camera] if camera else [])
        pose = None
        for stamps_json, poses_json, pose_frame in db.execute(query, args):
            for s, p in zip(json.loads(stamps_json), json.loads(poses_json)):
                if p is not None and abs(s - stamp) <= tolerance:
                    pose = Pose.from_list(p, pose_frame or "")
                    break
            if pose is not None:
                break
        found.append(pose)
    return found


def pose_counts(db: sqlite3.Connection) -> tuple[int, int]:
    """(frames archived with a pose, bytes their poses take)."""
    posed, size = 0, 0
    for (poses_json,) in db.execute("SELECT poses FROM chunks WHERE poses IS NOT NULL"):
        posed += sum(p is not None for p in json.loads(poses_json))
        size += len(poses_json)
    return posed, size


def fill_poses(db: sqlite3.Connection, chunk_id: int, poses: list, pose_frame: str) -> int | None:
    """A chunk's frames without a pose given those that came after it was archived (``poses``: one
    per frame, None where still none), its R*Tree extent and bytes with them; the
    frames filled, None when the row is gone (write connection, inside the caller's transaction)."""
    found = db.execute("SELECT poses FROM chunks WHERE id = ?", (chunk_id,)).fetchone()
    if found is None:
        return None
    before = json.loads(found[0]) if found[0] else [None] * len(poses)
    merged = [old if old is not None else new for old, new in zip(before, poses)]
    filled = sum(old is None and new is not None for old, new in zip(before, merged))
    if filled:
        text = json.dumps(merged)
        db.execute("UPDATE chunks SET poses = ?, pose_frame = ?, bytes = bytes + ? WHERE id = ?",
                   (text, pose_frame, len(text) - len(found[0] or ""), chunk_id))
        xs, ys = [p[0] for p in merged if p is not None], [p[1] for p in merged if p is not None]
        db.execute("INSERT OR REPLACE INTO chunk_extent VALUES (?, ?, ?, ?, ?)", (chunk_id, min(xs), max(xs), min(ys),
                                                                                 max(ys)))
    return filled
