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

from .thumbnails import pack as pack_thumbnails

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
    # archive_content frames: every frame's JPEG at the model's input size, kept in place of ``embeds``
    # and ``rel_positions`` (then None), encoded again when the chunk is replayed
    frames: list[bytes] | None = None
    # where the robot was at each frame: [x, y, z, qx, qy, qz, qw] in ``pose_frame``, None for a frame
    # with no pose near its stamp; None: no pose source (docs/places.md)
    poses: list[list[float] | None] | None = None
    pose_frame: str = ""

    @property
    def needs_encoding(self) -> bool:
        """A chunk kept as frames: its embeddings are made again when it is replayed."""
        return self.embeds is None

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


# a chunk's row as the store reads it, payloads aside
ROW_COLUMNS = "id, camera, first_stamp, last_stamp, stamps, unit_frames, tokens_per_unit, pinned, bytes, watch"


def key_of(blob: bytes, shape: str, shapes: dict[str, tuple]) -> np.ndarray:
    """A retrieval key from its row's bytes and shape (``shapes``: each shape's text parsed once)."""
    if shape not in shapes:
        shapes[shape] = tuple(json.loads(shape))
    return np.frombuffer(blob, dtype=np.float16).reshape(shapes[shape])


def row_of(row) -> ArchivedChunk:
    """An ArchivedChunk from a row read as ROW_COLUMNS, payloads aside."""
    return ArchivedChunk(chunk_id=int(row[0]), camera=row[1], first_stamp=float(row[2]), last_stamp=float(row[3]),
                         stamps=[float(s) for s in json.loads(row[4])],
                         unit_frames=[tuple(u) for u in json.loads(row[5])], tokens_per_unit=int(row[6]),
                         pinned=bool(row[7]), bytes=int(row[8]), watch=json.loads(row[9]))


def packed_row(chunk: EncodedChunk, key: np.ndarray | None, dtype: str) -> dict:
    """A chunk's row as its columns' values (id, pinned and watch filled in at the commit)."""
    if chunk.needs_encoding:  # frames in place of the embeddings: nothing of them to keep
        embeds, embeds_shape, positions, positions_shape = b"", "[0]", b"", "[0]"
    else:
        embeds, embeds_shape = pack_tensor(chunk.embeds, dtype)
        positions, positions_shape = pack_tensor(chunk.rel_positions, "float32")
    frames_blob, frame_sizes = pack_thumbnails(chunk.frames)
    key_blob = key_shape = None
    if key is not None:
        key16 = np.asarray(key, dtype=np.float16)
        key_blob, key_shape = key16.tobytes(), json.dumps(list(key16.shape))
    vectors_blob = vectors_shape = None
    if chunk.frame_vectors is not None:
        vectors16 = np.asarray(chunk.frame_vectors, dtype=np.float16)
        vectors_blob, vectors_shape = vectors16.tobytes(), json.dumps(list(vectors16.shape))
    thumbs_blob, thumbs_sizes = pack_thumbnails(chunk.thumbnails)
    poses = json.dumps(chunk.poses) if chunk.poses is not None and any(p is not None for p in chunk.poses) else None
    # the thumbnails count in the bound: archive_max_bytes bounds what is on disk (docs/show.md)
    size = (len(embeds) + len(positions) + len(key_blob or b"") + len(vectors_blob or b"") + len(thumbs_blob or b"")
            + len(frames_blob or b"") + len(poses or ""))
    return {"camera": chunk.camera, "first_stamp": min(chunk.stamps), "last_stamp": max(chunk.stamps),
            "stamps": json.dumps(chunk.stamps), "unit_frames": json.dumps([list(u) for u in chunk.unit_frames]),
            "tokens_per_unit": chunk.tokens_per_unit, "embeds": embeds, "embeds_shape": embeds_shape,
            "positions": positions, "positions_shape": positions_shape, "retrieval_key": key_blob,
            "key_shape": key_shape, "pinned": 0, "bytes": size, "frame_vectors": vectors_blob,
            "vectors_shape": vectors_shape, "thumbnails": thumbs_blob, "thumbnail_sizes": thumbs_sizes,
            "frames": frames_blob, "frame_sizes": frame_sizes, "poses": poses,
            "pose_frame": chunk.pose_frame if poses is not None else None}
