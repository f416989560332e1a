"""One fixed seeded stream for whoever needs frames (the demo bag, tests, benchmarks)."""
from __future__ import annotations

import functools

import numpy as np

from .stream import WorldStream, make_stream
from .truth import Look


# -- one fixed stream for whoever needs frames (demo bag, tests, benchmarks) ------------------------
FIXED_STREAM_SEED = 800_000_777  # in the tests' seed range (docs/world-models.md): no training run draws it
FIXED_STREAM_SEGMENT_FRAMES = 3600  # make_stream's longest stream; longer runs chain seeded streams


def fixed_look(height: int, width: int) -> Look:
    """How the fixed stream looks at a size: a dark flat background, a little sensor noise, each
    object's colour jittered once, rgb8. The size must be one the world allows (docs/world.md)."""
    return Look(width=width, height=height, background=(40, 40, 50), noise=6, colour_jitter=10,
                jitter_per_frame=False, encoding="rgb8")


@functools.lru_cache(maxsize=8)
def _fixed_segment(seed: int, segment: int, height: int, width: int) -> WorldStream:
    """Frames segment * FIXED_STREAM_SEGMENT_FRAMES onward of the fixed stream: a stream of its own
    (seed + segment), always generated at full length so a frame never depends on how many are asked."""
    return make_stream(seed + segment, FIXED_STREAM_SEGMENT_FRAMES, look=fixed_look(height, width),
                       still_end=False)


def world_frame(index: int, height: int = 120, width: int = 160, seed: int = FIXED_STREAM_SEED) -> np.ndarray:
    """Frame ``index`` of the fixed stream at ``height`` x ``width``, RGB uint8 [height, width, 3].
    Deterministic; any index >= 0 (past 3600 frames the stream goes on in the next seed's stream)."""
    if index < 0:
        raise ValueError(f"frame index must be >= 0, got {index}")
    segment, offset = divmod(index, FIXED_STREAM_SEGMENT_FRAMES)
    return _fixed_segment(seed, segment, height, width).frame(offset)


def world_frames(n: int, start: int = 0, height: int = 120, width: int = 160, seed: int = FIXED_STREAM_SEED):
    """Yield frames ``start`` .. ``start + n - 1`` of the fixed stream (``world_frame``)."""
    for index in range(start, start + n):
        yield world_frame(index, height, width, seed)
