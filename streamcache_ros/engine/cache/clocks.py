"""Per-camera position clocks, and each camera's share of a budget (docs/architecture.md "Positions").

A policy knows cameras only as opaque clock ids, one stored per cached token beside its position
(``KVStore.clocks``):

- ``NO_CLOCK`` (-1): the tokens of a pass on no clock: the system prompt, a question about every
  camera, a chunk given no clock (benchmarks and tests that call a policy directly);
- 0, 1, 2 ...: a camera's clock (the session numbers its cameras in the order they were seen).

A forward pass on clock c (``NewTokens.clock``) starts at the largest position of the prefix and of
c's own tokens, plus one (the chunk-start rule on c's clock), and sees only those tokens and its
own: each camera's chunks are numbered and encoded as if that camera were alone. Tokens of other
cameras may hold the same position values; a pass never sees them together. A pass on no clock
(``clock=None``) starts after the largest position held and sees every token (a question about
every camera). Re-indexing renumbers each clock on its own (``KVStore.reindex``).

Shares (``camera_budget_share``, a setting of every bounded policy): ``equal`` gives each camera
held in memory an equal share of the budget, a camera that needs less leaving the rest to the
others (``fair_shares``); ``shared`` is one budget for all, where a busy camera pushes out a quiet
one's history. With one camera both are the same.
"""
from __future__ import annotations

import torch

from .settings import GENERAL, setting
from .units import PREFIX_UNIT

NO_CLOCK = -1
CAMERA_SHARES = ("equal", "shared")


def camera_share_setting():
    """The general ``camera_budget_share`` parameter, for a policy that keeps a bound."""
    return setting("equal", "How cameras share the budget: equal (each camera in memory keeps an equal share; "
                            "a camera that needs less leaves the rest to the others) | shared (one budget for all: "
                            "a busy camera pushes out a quiet one's history)",
                   choices=CAMERA_SHARES, scope=GENERAL)


def stored_clock(clock: int | None) -> int:
    """The clock id a pass's tokens are stored with."""
    return NO_CLOCK if clock is None else int(clock)


def on_clock(units: torch.Tensor, clocks: torch.Tensor, clock: int | None) -> torch.Tensor | None:
    """Which tokens a pass on ``clock`` counts and sees: the prefix and the clock's own tokens (None:
    every token, for a pass on no clock)."""
    if clock is None:
        return None
    return (units == PREFIX_UNIT) | (clocks == int(clock))


def clocks_held(units: torch.Tensor, clocks: torch.Tensor) -> list[int]:
    """The clocks of the tokens that are not the prefix (ascending)."""
    return torch.unique(clocks[units != PREFIX_UNIT]).tolist()


def fair_shares(demands: dict[int, int], capacity: int, least: int = 0) -> dict[int, int]:
    """Split ``capacity`` among lanes (cameras) that need ``demands``: a lane that needs less than an
    equal share gets what it needs, the rest is split equally among the others (max-min fair; a
    remainder goes one each to the lowest lane ids). Each lane gets at least ``min(demand, least)``
    (so the total may then pass ``capacity``). When the demands fit, each lane gets its demand."""
    shares: dict[int, int] = {}
    left, room = dict(demands), int(capacity)
    while left:
        each = room // len(left)
        small = {lane: need for lane, need in left.items() if need <= each}
        if not small:
            extra = room - each * len(left)
            for i, lane in enumerate(sorted(left)):
                shares[lane] = each + (1 if i < extra else 0)
            break
        for lane, need in small.items():
            shares[lane] = need
            room -= need
            del left[lane]
    return {lane: max(share, min(demands[lane], least)) for lane, share in shares.items()}


def newest_units(units: torch.Tensor, lanes: torch.Tensor, capacity: int,
                 arriving: tuple[int, int] | None = None) -> torch.Tensor:
    """FIFO windows per lane: the video slots (``units`` >= 0, in ``lanes``) whose unit is among its
    lane's newest, each lane keeping its fair share of ``capacity`` units. Returns a bool mask of the
    slots kept (non-video slots are kept).

    ``arriving`` (lane, unit): while that unit is encoded, the lane's units older than it are held
    before it, and the lane keeps its share minus the arriving unit (docs/h2svc.md §3.2: the drop
    comes before the unit is encoded); units of that lane from the arriving one on are kept."""
    video = units >= 0
    keep = ~video
    held: dict[int, torch.Tensor] = {}
    for lane in torch.unique(lanes[video]).tolist():
        mine = video & (lanes == lane)
        if arriving is not None and lane == arriving[0]:
            keep |= mine & (units >= arriving[1])
            mine = mine & (units < arriving[1])
        held[lane] = torch.unique(units[mine])
    demands = {lane: int(ids.numel()) for lane, ids in held.items()}
    if arriving is not None:
        demands[arriving[0]] = demands.get(arriving[0], 0) + 1
    shares = fair_shares(demands, capacity)
    for lane, ids in held.items():
        room = shares[lane] - (1 if arriving is not None and lane == arriving[0] else 0)
        if room > 0 and ids.numel():
            keep |= video & (lanes == lane) & torch.isin(units, ids[-room:])
    return keep
