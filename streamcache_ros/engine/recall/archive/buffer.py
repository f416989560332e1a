"""The newest chunks' payloads in RAM, bounded by bytes (docs/archive.md "The store")."""
from __future__ import annotations

from collections import OrderedDict

from .record import EncodedChunk


class ChunkBuffer:
    """The newest chunks' payloads in RAM, bounded by bytes: recall of recent chunks reads no disk,
    and the RAM this takes never grows past ``max_bytes`` (every chunk is on disk already)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = int(max_bytes), 0
        self.items: OrderedDict[int, tuple[EncodedChunk, int]] = OrderedDict()

    def put(self, chunk_id: int, chunk: EncodedChunk) -> None:
        # the bytes held in RAM, not the row's bytes on disk: the buffer keeps float32 tensors (or,
        # for a chunk kept as frames, their JPEGs)
        if chunk.needs_encoding:
            size = sum(len(jpeg) for jpeg in chunk.frames or ())
        else:
            size = int(chunk.embeds.nelement() * chunk.embeds.element_size()
                       + chunk.rel_positions.nelement() * chunk.rel_positions.element_size())
        if size > self.max_bytes:
            return
        self.items[chunk_id] = (chunk, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self.items.popitem(last=False)
            self.bytes -= dropped

    def get(self, chunk_id: int) -> EncodedChunk | None:
        item = self.items.get(chunk_id)
        return item[0] if item else None

    def drop(self, chunk_id: int) -> None:
        item = self.items.pop(chunk_id, None)
        if item:
            self.bytes -= item[1]

    def clear(self) -> None:
        self.items.clear()
        self.bytes = 0

