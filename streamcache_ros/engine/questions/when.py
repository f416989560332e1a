"""When: the last or first time a yes/no question held, or its timeline, searched in the memory itself.

A yes/no question asked over a time window reads only that window's units (a key mask over the
cache), so "did you see a red circle in these frames?" can be asked of many windows at once, one row
each in a single forward pass (scoring.py). The search here is plain logic over the units in time
order and a batched oracle ``yes(windows) -> [P(yes)]``, one probability per window (a list of unit
indices):

- ``last`` / ``first``: the units cut into short tiles (about one chunk each), every tile asked at
  once; then the newest (oldest) tile answering yes is asked unit by unit, and its newest (oldest)
  unit answering yes alone is the answer. A tile none of whose units says yes alone is a false
  alarm and the next yes tile is tried; with no unit saying yes the answer is "never". Short windows because the models judge them far
  better than long ones: "seen" over 8 frames is right 0.93–0.97 of the time at 128 frames, over the
  whole 128 frames 0.68–0.76, over 512 frames 0.50–0.56 (docs/world-models.md "When"); a k-ary search
  on "seen since t" asks windows as long as the memory and scored 0.17–0.28 at 512 frames.
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

from ..memory.ledger import UnitInfo, Window
from ..status import WhenAnswer

MODES = ("last", "first", "timeline")
YES = 0.5  # a window answers yes when P(yes) reaches this

Oracle = Callable[[list[list[int]]], list[float]]


@dataclass
class SearchSettings:
    rows_per_pass: int = 64  # windows asked together in one forward pass at most
    tile_units: int = 4  # last / first: units per tile (the Session: one chunk's units)
    coarse_windows: int = 32  # the timeline's first pass: at most this many windows
    refine_above: float = 0.2  # a coarse window this likely to hold a yes is asked unit by unit

    @classmethod
    def within(cls, rows: int, tile_units: int = 4) -> "SearchSettings":
        """The defaults, never more windows a pass than one forward pass takes (``rows``); the
        Session's tiles are one chunk's units, the windows standing questions and training ask."""
        default = cls()
        return cls(min(default.rows_per_pass, rows), max(1, tile_units),
                   min(default.coarse_windows, rows), default.refine_above)


@dataclass
class Found:
    """The search's answer: the unit index (into the units searched) where the answer is yes last /
    first (-1: never), its window's P(yes), the timeline (one P(yes) per unit; empty for last /
    first), and the windows asked."""

    index: int = -1
    yes_probability: float = 0.0
    timeline: list[float] = field(default_factory=list)
    windows_asked: int = 0
    complete: bool = True  # false: tiles that said yes were left unasked (more than a pass takes)


class Counted:
    """The oracle, counting the windows it is asked, never more than ``rows`` in one call."""

    def __init__(self, oracle: Oracle, rows: int = 64):
        self.oracle, self.rows, self.asked = oracle, max(1, rows), 0

    def __call__(self, windows: list[list[int]]) -> list[float]:
        self.asked += len(windows)
        out: list[float] = []
        for start in range(0, len(windows), self.rows):
            out += list(self.oracle(windows[start:start + self.rows]))
        return out


def search(mode: str, count: int, oracle: Oracle, settings: SearchSettings | None = None) -> Found:
    """Search ``count`` units (indices 0 .. count-1, oldest first) in ``mode``."""
    if mode not in MODES:
        raise ValueError(f"unknown mode '{mode}' (one of: {', '.join(MODES)})")
    if count < 1:
        raise ValueError("nothing to search: no units")
    settings = settings or SearchSettings()
    asked = Counted(oracle, settings.rows_per_pass)
    if mode == "timeline":
        found = timeline(count, asked, settings)
    else:
        found = scan(count, asked, settings, newest=mode == "last")
    found.windows_asked = asked.asked
    return found


def scan(count: int, asked: Counted, settings: SearchSettings, newest: bool) -> Found:
    """The newest (``newest``) or oldest unit answering yes: tiles of ``tile_units`` units asked at
    once, then the yes tiles' units one by one, newest (oldest) tile first, until one says yes alone
    (a pass's rows, ``rows_per_pass``, at most). A tile none of whose units says yes alone was a
    false alarm; with no unit saying yes the answer is "never" (-1). Taking a yes tile as it stood
    once made a false yes of every window the tiles misjudged."""
    size = settings.tile_units
    tiles = [list(range(start, min(start + size, count))) for start in range(0, count, size)]
    tile_p = asked(tiles)
    order = sorted((i for i, p in enumerate(tile_p) if p >= YES), reverse=newest)
    if not order:
        return Found(-1, max(tile_p))
    best, spent = 0.0, 0
    for tried, t in enumerate(order):
        units = tiles[t]
        if tried and spent + len(units) > settings.rows_per_pass:  # one pass's rows spent: the rest unasked
            return Found(-1, best, complete=False)
        unit_p = asked([[u] for u in units]) if len(units) > 1 else [tile_p[t]]
        spent += len(units) if len(units) > 1 else 0
        yes = [(u, p) for u, p in zip(units, unit_p) if p >= YES]
        if yes:
            unit, p = yes[-1] if newest else yes[0]
            return Found(unit, p)
        best = max(best, *unit_p)
    return Found(-1, best)


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
    searched = [s for f in frames for s in f]
    return WhenAnswer(found.index >= 0, stamp, camera, found.yes_probability, timeline_stamps, timeline_yes,
                      found.windows_asked, total_ms, len(searched), searched_since=min(searched, default=0.0),
                      may_be_older=mode == "first" and found.index == 0, search_complete=found.complete)
