"""``uniform``: frames kept evenly spread over the stream so far, within a token budget.

The ablation baseline of the H2SVC paper (docs/h2svc.md): no score and no recency bias. After a
chunk, when the video tokens pass ``budget_tokens``, the policy keeps as many stream units (frames;
temporal patches of 2 frames on Qwen2.5-VL) as the budget holds, those nearest to evenly spaced
points from the oldest unit held to the newest, and evicts the others, whole units at a time. The
oldest and the newest unit are always kept, so what stays covers the whole stream evenly; every
layer keeps the same units, and the system prefix is kept on top of the budget.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from .base import ChunkContext, ChunkOutcome
from .layerwise import LayerwisePolicy, LayerwiseSettings, budget_setting


@dataclass(frozen=True)
class UniformSettings(LayerwiseSettings):
    budget_tokens: int = budget_setting()


def spread(units: list[int], count: int) -> list[int]:
    """``count`` of the ascending ``units`` nearest to ``count`` evenly spaced points from the first
    unit to the last: both ends kept, each point taking the nearest unit after the previous point's
    that still leaves one for every later point (ties: the older unit)."""
    n = len(units)
    if count >= n:
        return list(units)
    if count <= 0:
        return []
    if count == 1:
        return [units[-1]]
    first, last = units[0], units[-1]
    chosen, low = [], 0
    for i in range(count):
        target = first + (last - first) * i / (count - 1)
        high = n - (count - i)  # the last index this point may take
        at = min(max(bisect.bisect_left(units, target, low, high + 1), low), high)
        if at > low and target - units[at - 1] <= units[at] - target:
            at -= 1
        chosen.append(units[at])
        low = at + 1
    return chosen


class UniformCachePolicy(LayerwisePolicy):
    name = "uniform"
    settings_class = UniformSettings

    def evict(self, context: ChunkContext) -> ChunkOutcome:
        units_of_tokens = self.layers[0].units
        held, counts = torch.unique(units_of_tokens[units_of_tokens >= 0], return_counts=True)  # ascending
        total, budget = int(counts.sum()), self.budget_tokens
        if total <= budget:
            return ChunkOutcome()
        units, tokens = held.tolist(), dict(zip(held.tolist(), counts.tolist()))
        count = min(len(units), budget * len(units) // total)  # as many units as fit, on average
        keep = spread(units, count)
        while keep and sum(tokens[u] for u in keep) > budget:  # units of different sizes (cameras)
            count -= 1
            keep = spread(units, count)
        kept = torch.tensor(keep, dtype=torch.long)
        evicted = 0
        for store in self.layers:
            stays = (store.units < 0) | torch.isin(store.units, kept.to(store.units.device))
            evicted += int((~stays).sum())
            store.keep(torch.nonzero(stays).flatten())
        return ChunkOutcome(evicted_tokens=evicted)
