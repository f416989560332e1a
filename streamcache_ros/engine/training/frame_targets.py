"""Dense per-frame targets for the vision-first training stage, and the vision tokens of single frames.

A model can only remember what its vision tokens encode. Before it is trained on streams, its
vision tower and projector are trained on single frames against what each frame holds
(docs/world-models.md, "Vision first"):

- per horizontal half of the frame (by each object's centre): the object's shape and colour, or none;
- the number of objects in view.

A linear ``FrameHead`` reads these from the frame's tokens, pooled per half, so the tokens
themselves must carry shape and colour where the object is; the head is thrown away afterwards.
``bench/vision_probe.py`` measures the same thing on frozen tokens with linear probes.

No ROS here; the world's truth (streamcache_ros/world/) gives the targets.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..adapters import ModelAdapter

NONE = 0  # class 0 of every half target: no object in that half
HALVES = ("left", "right")


@dataclass(frozen=True)
class FrameTargets:
    """Class indices of one frame: per half, shape (0 none, 1 + index in SHAPES) and colour (0 none,
    1 + index in COLOUR_NAMES); the count of objects."""

    shape: tuple[int, int]
    colour: tuple[int, int]
    count: int


def frame_targets(views, width: int, shapes: tuple[str, ...], colours: tuple[str, ...]) -> FrameTargets:
    """The targets of one frame from its truth (``world.ObjectView``s) and its width in pixels."""
    shape, colour = [NONE, NONE], [NONE, NONE]
    for view in views:
        half = 0 if view.centre_x < width / 2 else 1
        shape[half] = 1 + shapes.index(view.shape)
        colour[half] = 1 + colours.index(view.colour)
    return FrameTargets(tuple(shape), tuple(colour), len(views))


def half_weights(cols: int) -> torch.Tensor:
    """[2, cols]: the share of each token column that lies in the left and in the right half."""
    edges = torch.arange(cols + 1, dtype=torch.float32) / cols
    left = (0.5 - edges[:-1]).clamp(0, 1 / cols) * cols
    return torch.stack([left, 1 - left])


def pool_halves(tokens: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """[2, hidden]: a frame's tokens [rows·cols, hidden] (row-major) averaged over each half."""
    weights = half_weights(cols).to(tokens.device, tokens.dtype).repeat(1, rows)  # [2, rows·cols]
    return (weights @ tokens) / weights.sum(dim=1, keepdim=True)


class FrameHead(torch.nn.Module):
    """Linear read-outs of a frame's targets from its pooled tokens (training only)."""

    def __init__(self, hidden: int, num_shapes: int, num_colours: int, max_count: int = 2):
        super().__init__()
        self.shape = torch.nn.Linear(hidden, num_shapes + 1)
        self.colour = torch.nn.Linear(hidden, num_colours + 1)
        self.count = torch.nn.Linear(hidden, max_count + 1)

    def forward(self, halves: torch.Tensor) -> dict[str, torch.Tensor]:
        """halves [B, 2, hidden] -> logits: shape / colour [B, 2, classes], count [B, classes]."""
        return {"shape": self.shape(halves), "colour": self.colour(halves), "count": self.count(halves.mean(dim=1))}


def frame_loss(head: FrameHead, halves: torch.Tensor, targets: list[FrameTargets]) -> tuple[torch.Tensor, dict]:
    """Cross-entropy of every target, summed; and the share of each target read right."""
    logits = head(halves)
    device = halves.device
    want = {"shape": torch.tensor([t.shape for t in targets], device=device),
            "colour": torch.tensor([t.colour for t in targets], device=device),
            "count": torch.tensor([t.count for t in targets], device=device)}
    loss = sum(F.cross_entropy(logits[k].reshape(-1, logits[k].shape[-1]).float(), want[k].reshape(-1)) for k in want)
    right = {k: float((logits[k].argmax(dim=-1) == want[k]).float().mean()) for k in want}
    return loss, right


def single_frame_tokens(adapter: ModelAdapter, frames: list[np.ndarray]) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
    """Each frame's vision tokens as the frame alone gives them (a still image: one unit), in one
    batched pass of the vision tower; gradients flow. Returns per frame [rows·cols, hidden] and
    (rows, cols)."""
    inputs = [adapter.preprocess([frame]) for frame in frames]
    tokens = adapter.vision_features(adapter.batch_vision_inputs(inputs))
    sizes = [i.tokens_per_unit for i in inputs]
    return list(torch.split(tokens, sizes)), [i.grid[1:] for i in inputs]


def pooled_halves(adapter: ModelAdapter, frames: list[np.ndarray]) -> torch.Tensor:
    """[B, 2, hidden]: every frame's tokens pooled per half."""
    tokens, grids = single_frame_tokens(adapter, frames)
    return torch.stack([pool_halves(t, rows, cols) for t, (rows, cols) in zip(tokens, grids)])
