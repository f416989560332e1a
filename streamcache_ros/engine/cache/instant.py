"""The instant window (docs/architecture.md "The instant window"): the newest ``instant_frames``
frames of each camera kept whole, in every layer and KV head, beside what a bounded policy keeps of
the past (as DSCache keeps a bounded past and an "instant" cache of recent frames).

A stream unit (a frame; 2 frames on Qwen2.5-VL) is in the window while its camera's units newer
than it hold fewer than ``instant_frames`` frames: the camera's newest units that cover N frames.
The policy never sees those units when it evicts: it compresses the rest to its own bound, and a
unit enters its memory when it leaves the window. A unit's frames come from each chunk's
``ChunkContext.unit_frames``; a unit no context named (a policy fed directly) counts one frame.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from .settings import GENERAL, setting


def instant_setting():
    """The general ``instant_frames`` parameter, for a policy that keeps a bound."""
    return setting(0, "The newest this many frames of each camera are kept whole (every layer, every KV head) beside "
                      "what the policy keeps of the past, on top of its bound; 0 = off", low=0, scope=GENERAL)


class InstantWindow:
    """Which units are in the window: ``frames`` per camera, and the frames of each unit held."""

    def __init__(self, frames: int):
        self.frames = int(frames)
        self.unit_frames: dict[int, int] = {}

    def __bool__(self) -> bool:
        return self.frames > 0

    def record(self, unit_frames: Mapping[int, tuple[int, ...]]) -> None:
        """Note the frames of a chunk's units (``ChunkContext.unit_frames``)."""
        if self.frames:
            self.unit_frames.update({int(unit): len(frames) for unit, frames in unit_frames.items()})

    def units(self, units: torch.Tensor, clocks: torch.Tensor) -> torch.Tensor:
        """The units in the window (ascending) among the slots' ``units`` (negative: no unit) on
        their ``clocks``: each clock's newest units until they cover ``frames`` frames."""
        if not self.frames:
            return torch.empty(0, dtype=torch.long, device=units.device)
        video = units >= 0
        pairs = torch.unique(torch.stack((clocks[video], units[video])), dim=1).tolist()
        by_clock: dict[int, list[int]] = {}
        for clock, unit in zip(*pairs):
            by_clock.setdefault(clock, []).append(unit)
        chosen = []
        for mine in by_clock.values():
            covered = 0
            for unit in sorted(mine, reverse=True):
                if covered >= self.frames:
                    break
                chosen.append(unit)
                covered += self.unit_frames.get(unit, 1)
        return torch.tensor(sorted(chosen), dtype=torch.long, device=units.device)

    def forget(self, held: torch.Tensor) -> None:
        """Drop the frames of units no longer among ``held`` (unit ids; negatives ignored)."""
        if self.unit_frames:
            keep = set(torch.unique(held[held >= 0]).tolist())
            self.unit_frames = {u: n for u, n in self.unit_frames.items() if u in keep}

    def state(self) -> list[list[int]]:
        return [[u, n] for u, n in sorted(self.unit_frames.items())]

    def load(self, state: Any) -> None:
        self.unit_frames = {int(u): int(n) for u, n in state or []}
