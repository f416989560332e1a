"""When: the last or first time a yes/no question held, or its timeline, searched in the memory itself.

A yes/no question asked over a time window reads only that window's units (a key mask over the
cache), so "did you see a red circle since t?" can be asked for many t at once, one row each in a
single forward pass (scoring.py). The search here is plain logic over the units in time order and
a batched oracle ``yes(windows) -> [P(yes)]``, one probability per window (a list of unit indices):

- ``last``: "seen since units[i]?" holds for every i up to the last unit where the answer is yes,
  and for none after it (monotone in i), so a k-ary search on i finds it: each pass asks k windows
  "since c" spread over the bracket, and keeps the bracket between the last yes and the next no.
- ``first``: the same with "seen until units[i]?".
- ``timeline``: P(yes) over the memory's span, coarse to fine: windows of several units first, then
  one window per unit inside the coarse windows that may hold a yes; a unit never refined keeps its
  coarse window's probability.

Resolution is one stream unit (two frames on Qwen2.5-VL). No model, no ROS: the Session gives the
oracle and the units (docs/interfaces.md "When").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .ledger import UnitInfo, Window
from .status import WhenAnswer

MODES = ("last", "first", "timeline")
YES = 0.5  # a window answers yes when P(yes) reaches this

Oracle = Callable[[list[list[int]]], list[float]]


@dataclass
class SearchSettings:
    rows_per_pass: int = 16  # windows asked together in one pass of the k-ary search
    coarse_windows: int = 32  # the timeline's first pass: at most this many windows
    refine_above: float = 0.2  # a coarse window this likely to hold a yes is asked unit by unit

    @classmethod
    def within(cls, rows: int) -> "SearchSettings":
        """The defaults, never more windows a pass than one forward pass takes (``rows``)."""
        default = cls()
        return cls(min(default.rows_per_pass, rows), min(default.coarse_windows, rows), default.refine_above)


@dataclass
class Found:
    """The search's answer: the unit index (into the units searched) where the answer is yes last /
    first (-1: never), its window's P(yes), the timeline (one P(yes) per unit; empty for last /
    first), and the windows asked."""

    index: int = -1
    yes_probability: float = 0.0
    timeline: list[float] = field(default_factory=list)
    windows_asked: int = 0


class Counted:
    """The oracle, counting the windows it is asked."""

    def __init__(self, oracle: Oracle):
        self.oracle, self.asked = oracle, 0

    def __call__(self, windows: list[list[int]]) -> list[float]:
        self.asked += len(windows)
        return list(self.oracle(windows)) if windows else []


def search(mode: str, count: int, oracle: Oracle, settings: SearchSettings | None = None) -> Found:
    """Search ``count`` units (indices 0 .. count-1, oldest first) in ``mode``."""
    if mode not in MODES:
        raise ValueError(f"unknown mode '{mode}' (one of: {', '.join(MODES)})")
    if count < 1:
        raise ValueError("nothing to search: no units")
    settings = settings or SearchSettings()
    asked = Counted(oracle)
    if mode == "timeline":
        found = timeline(count, asked, settings)
    elif mode == "last":
        found = boundary(count, lambda i: list(range(i, count)), asked, settings.rows_per_pass)
    else:  # first: "seen until i" holds from the first yes on; search it as "last no" mirrored
        mirrored = boundary(count, lambda i: list(range(0, count - i)), asked, settings.rows_per_pass)
        found = Found(count - 1 - mirrored.index if mirrored.index >= 0 else -1, mirrored.yes_probability)
    found.windows_asked = asked.asked
    return found


def boundary(count: int, window: Callable[[int], list[int]], asked: Counted, rows: int) -> Found:
    """The largest i whose ``window(i)`` answers yes, where the answer holds for every i up to it
    and for none after it (-1: for none): a k-ary search asking ``rows`` windows a pass (the first
    one more: the widest window), about log_(rows+1)(count + 1) passes."""
    low, high = -1, count - 1  # yes at low (-1: taken as yes), no after high: the answer is in low .. high
    seen: dict[int, float] = {}
    while low < high:
        span = high - low
        picks = {low + math.ceil(span * (j + 1) / (rows + 1)) for j in range(min(rows, span))}
        if low == -1:  # the widest window too, so that "never" takes one pass
            picks.add(0)
        picks = sorted(picks)
        for i, p in zip(picks, asked([window(i) for i in picks])):
            seen[i] = p
        yes = [i for i in picks if seen[i] >= YES]
        new_low = yes[-1] if yes else low
        high = min([i for i in picks if i > new_low], default=high + 1) - 1
        low = new_low
    return Found(low, seen.get(low, 0.0))


def timeline(count: int, asked: Counted, settings: SearchSettings) -> Found:
    """P(yes) per unit: coarse windows, then unit by unit where a coarse window may hold a yes."""
    size = max(1, math.ceil(count / settings.coarse_windows))
    coarse = [list(range(start, min(start + size, count))) for start in range(0, count, size)]
    if size == 1:
        per_unit = asked(coarse)
    else:
        coarse_p = asked(coarse)
        per_unit = [p for window, p in zip(coarse, coarse_p) for _ in window]
        refine = [u for window, p in zip(coarse, coarse_p) if p >= settings.refine_above for u in window]
        for unit, p in zip(refine, asked([[u] for u in refine])):
            per_unit[unit] = p
    last = max((i for i, p in enumerate(per_unit) if p >= YES), default=-1)
    return Found(last, per_unit[last] if last >= 0 else max(per_unit), per_unit)


def answer(found: Found, mode: str, units: list[UnitInfo], window: Window, total_ms: float) -> WhenAnswer:
    """The search's result in stamps: ``units`` are the units searched, oldest first; only frames
    stamped inside ``window`` count. ``last`` names the found unit's newest frame, ``first`` its
    oldest; the timeline has one entry per frame, its unit's P(yes)."""
    frames = [[s for s in info.stamps if window.holds(s)] for info in units]
    stamp, camera = 0.0, ""
    if found.index >= 0:
        stamps = frames[found.index]
        stamp = max(stamps) if mode != "first" else min(stamps)
        camera = units[found.index].camera
    timeline_stamps = [s for stamps, _ in zip(frames, found.timeline) for s in stamps]
    timeline_yes = [p for stamps, p in zip(frames, found.timeline) for _ in stamps]
    return WhenAnswer(found.index >= 0, stamp, camera, found.yes_probability, timeline_stamps, timeline_yes,
                      found.windows_asked, total_ms, sum(len(f) for f in frames))
