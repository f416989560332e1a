"""``uniform``: frames kept evenly spread over the stream so far, within a token budget.

The ablation baseline of the H2SVC paper (docs/h2svc.md): no score and no recency bias. After a
chunk, when the video tokens pass ``budget_tokens``, the policy keeps as many stream units (frames;
temporal patches of 2 frames on Qwen2.5-VL) as the budget holds, those nearest to evenly spaced
points from the oldest unit held to the newest, and evicts the others, whole units at a time. The
oldest and the newest unit are always kept, so what stays covers the whole stream evenly; every
layer keeps the same units, and the system prefix is kept on top of the budget. With several
cameras and ``camera_budget_share: equal`` each camera's units are spread over its own fair share of
the budget (clocks.fair_shares), evenly over that camera's own stream (its units counted as they
arrived), as they would be were the camera alone. With ``instant_frames`` the instant window's units
stay whole beside the spread, which is taken over the units older than them (instant.py).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch

from .types import ChunkContext, ChunkOutcome
from .clocks import camera_share_setting, fair_shares
from .instant import instant_setting
from .layerwise import LayerwisePolicy, LayerwiseSettings, budget_setting


@dataclass(frozen=True)
class UniformSettings(LayerwiseSettings):
    budget_tokens: int = budget_setting()
    camera_budget_share: str = camera_share_setting()
    instant_frames: int = instant_setting()


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


def spread_within(units: list[int], tokens: dict[int, int], budget: int,
                  times: dict[int, int] | None = None) -> list[int]:
    """The ``units`` (ascending) spread evenly within ``budget`` tokens (``tokens``: each unit's),
    over their ids or over their ``times`` (ascending with the ids)."""
    total = sum(tokens[u] for u in units)
    count = min(len(units), budget * len(units) // total) if total else 0  # as many units as fit, on average
    at = units if times is None else [times[u] for u in units]
    unit_at = dict(zip(at, units))

    def chosen(n: int) -> list[int]:
        return [unit_at[t] for t in spread(at, n)]

    keep = chosen(count)
    while keep and sum(tokens[u] for u in keep) > budget:  # units of different sizes (cameras)
        count -= 1
        keep = chosen(count)
    return keep


class UniformCachePolicy(LayerwisePolicy):
    name = "uniform"
    settings_class = UniformSettings

    def reset(self) -> None:
        super().reset()
        self.times: dict[int, int] = {}  # unit -> its index in its camera's stream
        self.arrived: dict[int, int] = {}  # clock -> units of that camera so far

    def _count_arrivals(self) -> None:
        """Number the units stored since the last compression in their camera's stream."""
        store = self.layers[0]
        video = store.units >= 0
        new = [(u, c) for u, c in sorted(set(zip(store.units[video].tolist(), store.clocks[video].tolist())))
               if u not in self.times]
        for unit, clock in new:
            self.times[unit] = self.arrived.get(clock, 0)
            self.arrived[clock] = self.times[unit] + 1

    def evict(self, context: ChunkContext) -> ChunkOutcome:
        self._count_arrivals()
        outcome = self._evict()
        held = set(self.layers[0].units.tolist())
        self.times = {u: t for u, t in self.times.items() if u in held}
        return outcome

    def _evict(self) -> ChunkOutcome:
        units_of_tokens = self.layers[0].units
        instant = self.instant_units()
        past = units_of_tokens >= 0
        if instant.numel():  # numbered with the others as they arrived (times), spread only once past
            past = past & ~torch.isin(units_of_tokens, instant)
        held, counts = torch.unique(units_of_tokens[past], return_counts=True)  # ascending
        total, budget = int(counts.sum()), self.budget_tokens
        if total <= budget:
            return ChunkOutcome()
        units, tokens = held.tolist(), dict(zip(held.tolist(), counts.tolist()))
        lanes = self.lanes(self.layers[0])
        if len(lanes) == 1:
            keep = spread_within(units, tokens, budget)
        else:  # each camera's units spread over its share of the budget
            clocks = self.layers[0].clocks
            lane_units = {c: torch.unique(units_of_tokens[past & (clocks == c)]).tolist() for c in lanes}
            shares = fair_shares({c: sum(tokens[u] for u in mine) for c, mine in lane_units.items()}, budget)
            keep = [u for c in lanes for u in spread_within(lane_units[c], tokens, shares[c], self.times)]
        kept = torch.tensor(keep + instant.tolist(), dtype=torch.long)
        evicted = 0
        for store in self.layers:
            stays = (store.units < 0) | torch.isin(store.units, kept.to(store.units.device))
            evicted += int((~stays).sum())
            store.keep(torch.nonzero(stays).flatten())
        return ChunkOutcome(evicted_tokens=evicted)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "times": [[u, t] for u, t in sorted(self.times.items())],
                "arrived": [[c, n] for c, n in sorted(self.arrived.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.times = {int(u): int(t) for u, t in state["times"]}
        self.arrived = {int(c): int(n) for c, n in state["arrived"]}
