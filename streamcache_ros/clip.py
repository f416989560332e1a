"""A synthetic camera clip: coloured shapes moving over a background, with scene changes.

Used by the demo bag, the tests and the benchmarks (no camera, no download). Deterministic.
"""
from __future__ import annotations

import numpy as np

SCENES = [
    # background RGB, shapes: (colour, radius, start x, start y, velocity x, velocity y, square?)
    ((30, 30, 40), [((220, 40, 40), 12, 20, 30, 3.0, 1.0, False), ((40, 200, 60), 10, 120, 80, -2.0, 0.5, True)]),
    ((200, 200, 190), [((30, 60, 220), 14, 80, 20, 0.0, 2.5, True), ((240, 200, 20), 8, 10, 100, 4.0, -1.0, False)]),
    ((20, 90, 30), [((250, 250, 250), 16, 140, 60, -3.0, 0.0, False)]),
    ((90, 40, 110), [((250, 120, 0), 10, 40, 40, 2.0, 2.0, True), ((0, 220, 220), 9, 100, 20, -1.0, 3.0, False),
                     ((250, 0, 200), 7, 60, 100, 1.5, -2.0, True)]),
]


def scene_of(index: int, frames_per_scene: int = 24) -> int:
    return (index // frames_per_scene) % len(SCENES)


def frame(index: int, height: int = 120, width: int = 160, frames_per_scene: int = 24) -> np.ndarray:
    """The ``index``-th frame, RGB uint8 [height, width, 3]."""
    background, shapes = SCENES[scene_of(index, frames_per_scene)]
    t = index % frames_per_scene
    image = np.empty((height, width, 3), dtype=np.uint8)
    image[:] = background
    yy, xx = np.mgrid[0:height, 0:width]
    sx, sy = width / 160.0, height / 120.0
    for colour, radius, x0, y0, vx, vy, square in shapes:
        cx = ((x0 + vx * t) * sx) % width
        cy = ((y0 + vy * t) * sy) % height
        r = radius * min(sx, sy)
        inside = (np.maximum(abs(xx - cx), abs(yy - cy)) <= r) if square else ((xx - cx) ** 2 + (yy - cy) ** 2 <= r * r)
        image[inside] = colour
    # a little sensor noise, deterministic per frame
    noise = np.random.default_rng(index).integers(-6, 7, size=image.shape)
    return np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def clip(num_frames: int, height: int = 120, width: int = 160, start: int = 0):
    """Yield ``num_frames`` consecutive frames."""
    for i in range(start, start + num_frames):
        yield frame(i, height, width)
