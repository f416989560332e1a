"""Frames waiting for their chunk: the Session queues each camera's frames here, and training lays
out a stream with the same queue (``layout.stream_chunks``), so both cut a stream into the same
chunks (docs/world-models.md, "One layout")."""
from __future__ import annotations

from typing import Generic, TypeVar

Item = TypeVar("Item")


class ChunkQueue(Generic[Item]):
    """Frames waiting for their chunk, per camera: ``push`` returns a full chunk of ``chunk_frames``;
    ``flush`` (a question is asked) returns every camera's partial chunk."""

    def __init__(self, chunk_frames: int):
        if chunk_frames < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
        self.chunk_frames = chunk_frames
        self.pending: dict[str, list[Item]] = {}

    def push(self, camera: str, item: Item) -> list[Item] | None:
        queue = self.pending.setdefault(camera, [])
        queue.append(item)
        if len(queue) < self.chunk_frames:
            return None
        return self.pending.pop(camera)

    def flush(self) -> list[tuple[str, list[Item]]]:
        batches = [(camera, batch) for camera, batch in self.pending.items() if batch]
        self.pending.clear()
        return batches

    def clear(self) -> None:
        self.pending.clear()

    def waiting(self, camera: str = "") -> list[Item]:
        """The items waiting for their chunk, of ``camera`` (every camera's when empty)."""
        return [item for name, queue in self.pending.items() if not camera or name == camera for item in queue]

    def __len__(self) -> int:
        return sum(len(q) for q in self.pending.values())
