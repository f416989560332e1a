"""One archived chunk: what it takes to bring a chunk back, on plain data (docs/archive.md).

The archive keeps a chunk's *visual embeddings* (what the vision encoder gave, before the language
model) and their chunk-relative positions, not its KV: at the 7B shapes the embeddings are 8x
smaller per token than the KV of every layer, and a recalled chunk is prefilled again as the start
of a short stream, which is what the models judge best (docs/archive.md "Embeddings, not KV").
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import torch

# what a chunk's tensors are stored as: fp16 halves the bytes; fp32 is exact (the tests' store)
STORE_DTYPES = {"float16": np.float16, "float32": np.float32}


@dataclass
class EncodedChunk:
    """A chunk as the vision encoder left it: enough to prefill it again anywhere."""

    camera: str
    stamps: list[float]  # one per frame, in arrival order
    unit_frames: list[tuple[int, ...]]  # per unit, the indices (into ``stamps``) of its frames
    tokens_per_unit: int
    embeds: torch.Tensor  # [tokens, hidden]
    rel_positions: torch.Tensor  # [axes, tokens], relative to the chunk's start
    frame_vectors: np.ndarray | None = None  # [frames, dim]: the index's vector of each frame, unit length
    # one JPEG per frame (b"" for none), what a person is shown (thumbnails.py); None: thumbnails off
    thumbnails: list[bytes] | None = None

    @property
    def num_units(self) -> int:
        return len(self.unit_frames)

    def unit_stamps(self) -> list[tuple[float, ...]]:
        return [tuple(self.stamps[i] for i in frames) for frames in self.unit_frames]


@dataclass
class ArchivedChunk:
    """A row of the archive: the chunk's place in time, its payload (None until loaded) and key."""

    chunk_id: int
    camera: str
    first_stamp: float
    last_stamp: float
    stamps: list[float]
    unit_frames: list[tuple[int, ...]]
    tokens_per_unit: int
    pinned: bool = False
    bytes: int = 0
    watch: dict[str, float] = field(default_factory=dict)
    key: np.ndarray | None = None
    chunk: EncodedChunk | None = None

    def overlaps(self, since: float, until: float) -> bool:
        return any(since <= s <= until for s in self.stamps)


def pack_tensor(tensor: torch.Tensor, dtype: str) -> tuple[bytes, str]:
    """(raw bytes, shape as JSON) of ``tensor`` in the store's ``dtype``."""
    array = tensor.detach().to("cpu", torch.float32).numpy().astype(STORE_DTYPES[dtype])
    return array.tobytes(), json.dumps(list(array.shape))


def unpack_tensor(blob: bytes, shape: str, dtype: str) -> torch.Tensor:
    """The inverse of ``pack_tensor``, as float32; ValueError when the bytes do not fit the shape."""
    dims = tuple(json.loads(shape))
    array = np.frombuffer(blob, dtype=STORE_DTYPES[dtype])
    if array.size != int(np.prod(dims)):
        raise ValueError(f"{len(blob)} bytes do not hold a {dtype} tensor of shape {dims}")
    return torch.from_numpy(array.reshape(dims).astype(np.float32))
