"""Where, for the question desk: a question's place made into the frames it may read, and the pose
of every frame an answer names (docs/places.md).

A place is resolved against the archive's poses into the stamps of the frames taken inside it; the
window then holds only those (``Window.frames``), so the index ranks, the replays read and the
working memory masks nothing else, by the same rule as a time window."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..memory.ledger import Window
from ..places import Place, PlaceError
from ..recall.tier import MemoryTier
from ..status import Answer, WhenAnswer


def scoped(tier: MemoryTier, camera: str, window: Window | None, where: Place | None) -> tuple[Window | None, int]:
    """(the window limited to ``where``, the frames it holds there); ``window`` and 0 without a place.
    PlaceError, before anything is read, when there is no pose to limit by or the robot was never
    inside the place in the window (the refusal names the nearest it came)."""
    if where is None:
        return window, 0
    window = window or Window()
    if tier.archive is None:
        raise PlaceError("a question limited to a place reads the poses the archive keeps with its frames, "
                         "and archive_path is off")
    if tier.poses is not None:  # poses late for their chunks are written before the place is read
        tier.late_poses.retry(tier.archive, tier.poses)
    inside = tier.archive.frames_in_place(where, *window.bounds(), camera)
    if not len(inside):
        near = tier.archive.nearest_pass(where, *window.bounds(), camera)
        between = _between(window)
        if near is None:
            raise PlaceError(f"no frame{f' of {camera}' if camera else ''}{between} has a pose: set pose_topic "
                             "(or TF) to ask about places")
        distance, stamp = near
        raise PlaceError(f"the robot was never {where.describe()}{between}: the nearest it came was "
                         f"{distance:.2f} m from there, at {stamp:.3f}")
    stamps = np.unique(inside.stamps)
    return Window(window.since, window.until, stamps), len(inside)


def _between(window: Window) -> str:
    """" between <since> and <until>" for a window with an end, "" for all time."""
    if window.since == -np.inf and window.until == np.inf:
        return ""
    return f" between {Window.describe(window.since)} and {Window.describe(window.until)}"


def answer_with_poses(tier: MemoryTier, answer: Answer, in_place: int) -> Answer:
    """``answer`` with the pose of each evidence frame, and the frames its place held."""
    if not answer.evidence:
        return dataclasses.replace(answer, frames_in_place=in_place)
    poses = tier.poses_of([e.stamp for e in answer.evidence], [e.camera for e in answer.evidence])
    evidence = [dataclasses.replace(e, pose=pose) for e, pose in zip(answer.evidence, poses)]
    return dataclasses.replace(answer, evidence=evidence, frames_in_place=in_place)


def when_with_pose(tier: MemoryTier, found: WhenAnswer, in_place: int) -> WhenAnswer:
    """``found`` with the pose of the frame found, and the frames its place held."""
    pose = tier.poses_of([found.stamp], [found.camera])[0] if found.found else None
    return dataclasses.replace(found, pose=pose, frames_in_place=in_place)
