"""Poses that come after their frames were archived (docs/places.md "The pose of a frame").

A busy node may take a burst of odometry after the chunk it brackets was written: the chunk's
newest frames then had no pose within the tolerance. The last LATE_CHUNKS such chunks are kept here
and, each time a chunk is archived, looked up again; a frame that now has a pose gets it in its
row, and its R*Tree extent with it. A frame still without one once its chunk leaves this list
keeps none, and the diagnostics count it.
"""
from __future__ import annotations

from collections import deque

LATE_CHUNKS = 64


class LatePoses:
    def __init__(self, limit: int = LATE_CHUNKS):
        self.waiting: deque[tuple[int, str, list[float]]] = deque(maxlen=limit)
        self.filled = 0  # frames given their pose late

    def note(self, chunk_id: int, chunk) -> None:
        """``chunk`` (archived as ``chunk_id``) waits when some of its frames have no pose."""
        if chunk.poses is not None and any(p is None for p in chunk.poses):
            self.waiting.append((chunk_id, chunk.camera, list(chunk.stamps)))

    def retry(self, archive, track) -> None:
        """Every waiting chunk looked up again; one whose frames all have a pose now, or that the
        archive no longer holds, stops waiting."""
        for entry in list(self.waiting):
            chunk_id, camera, stamps = entry
            poses = [None if (p := track.at(s)) is None else p.as_list() for s in stamps]
            filled = archive.fill_poses(chunk_id, poses, track.frame_id) if any(poses) else 0
            if filled:
                self.filled += filled
                track.frames_posed, track.frames_without = track.frames_posed + filled, track.frames_without - filled
            if filled is None or all(p is not None for p in poses):
                self.waiting.remove(entry)

    def clear(self) -> None:
        self.waiting.clear()
