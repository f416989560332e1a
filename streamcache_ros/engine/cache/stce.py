"""Semantic Trajectory Curvature Eviction (STCE) for H2SVC's episodic banks (docs/h2svc.md §3.3-3.4).

Each episodic KV head keeps its frames as a doubly linked list in time order, one frame vector V̄
(the mean Value of the frame's tokens) per frame. An interior frame j with bank neighbours p, n
scores

    I(j) = (1 - cos(v_in, v_out)) · min(|v_in|, |v_out|) · ln(t_n - t_p)
    with v_in = V̄_j - V̄_p and v_out = V̄_n - V̄_j

and when the bank holds one frame too many, the interior frame with the lowest I (ties: the oldest)
leaves. Endpoints are never evicted. Only the frames whose neighbours changed are rescored: the old
tail when a frame arrives, and the two neighbours of an evicted frame.

Everything here works on plain tensors, vectorised over heads: all heads see the same arrivals, but
each evicts on its own, so after the first eviction their frame sets (and slots) differ.

With several cameras each has a trajectory of its own (``TrajectoryLanes``): a frame's neighbours
are frames of the same camera, and N_e is shared out among the cameras (docs/h2svc.md "Cameras").
"""
from __future__ import annotations

from typing import Any

import torch

from .clocks import NO_CLOCK, fair_shares

EMPTY = -1  # a free slot / no neighbour
INF = float("inf")


def stce_score(v_prev: torch.Tensor, v: torch.Tensor, v_next: torch.Tensor,
               t_prev: torch.Tensor, t_next: torch.Tensor) -> torch.Tensor:
    """I(j) for frame vectors [..., D] and frame indices [...] of the two neighbours; float32.

    docs/h2svc.md §3.4: when either velocity is shorter than ε = 1e-8·(1 + |V̄_j|) the curvature is 0
    (cos := 1), so static or duplicated frames score 0 without NaN.
    """
    v_prev, v, v_next = v_prev.float(), v.float(), v_next.float()
    v_in, v_out = v - v_prev, v_next - v
    n_in, n_out = v_in.norm(dim=-1), v_out.norm(dim=-1)
    mag = torch.minimum(n_in, n_out)
    moving = mag >= 1e-8 * (1.0 + v.norm(dim=-1))
    tiny = torch.finfo(torch.float32).tiny
    u_in = v_in / n_in.clamp_min(tiny)[..., None]
    u_out = v_out / n_out.clamp_min(tiny)[..., None]
    # 1 - cos = |u_in - u_out|² / 2: the same number, but without the cancellation of 1 - dot/(|a||b|)
    # in float32, which would swamp the small curvatures that decide the ranking (TC3: ~5e-5)
    curv = torch.where(moving, (u_in - u_out).square().sum(dim=-1) / 2, torch.zeros_like(mag))
    tw = torch.log((t_next - t_prev).to(torch.float32))
    return curv * mag * tw


class TrajectoryBank:
    """STCE bookkeeping for ``heads`` episodic heads with ``capacity`` frames each (N_e).

    Per head, arrays of capacity + 1 slots (docs/h2svc.md §3.4): frame index ``t``, its ``time``
    (what the temporal weight reads: ``t`` itself, or the frame's index in its camera's stream),
    frame vector ``vec``, ``prev``/``next`` slots, ``score``. A new frame takes the slot the last
    eviction freed.
    ``last_evaluations`` [heads] counts the scores computed by the latest arrival (TC7).
    """

    def __init__(self, heads: int, capacity: int, device: torch.device | str = "cpu"):
        if capacity < 2:
            raise ValueError(f"an episodic bank needs capacity >= 2 frames, got {capacity}")
        self.heads, self.capacity, self.device = int(heads), int(capacity), torch.device(device)
        slots = self.capacity + 1
        self.t = torch.full((self.heads, slots), EMPTY, dtype=torch.long, device=self.device)
        self.time = self.t.clone()
        self.prev = self.t.clone()
        self.next = self.t.clone()
        self.score = torch.full((self.heads, slots), INF, dtype=torch.float32, device=self.device)
        self.vec: torch.Tensor | None = None  # [heads, slots, dim] float32, made at the first arrival
        self.oldest = torch.full((self.heads,), EMPTY, dtype=torch.long, device=self.device)
        self.newest = self.oldest.clone()
        self.free = torch.zeros(self.heads, dtype=torch.long, device=self.device)
        self.count = 0  # frames held per head (the same for every head)
        self.arrivals = 0
        self.evictions = 0
        self.last_evaluations = torch.zeros(self.heads, dtype=torch.long, device=self.device)
        self._vec_shared = False

    # -- arrivals -------------------------------------------------------------------------------
    def insert(self, t: int, vec: torch.Tensor, keep: int | None = None, time: int | None = None) -> torch.Tensor:
        """Link frame ``t`` (vectors [heads, dim]) after each head's newest frame, at ``time``
        (default ``t``); when a head then holds more than ``keep`` frames (default: capacity; at
        least 2, and the bank held at most ``keep`` before) it evicts one. Returns the evicted frame
        per head, or -1."""
        if self.heads == 0:
            return torch.empty(0, dtype=torch.long, device=self.device)
        vec = vec.to(self.device, torch.float32)
        if self.vec is None:
            self.vec = torch.zeros(self.heads, self.capacity + 1, vec.shape[-1], device=self.device)
        elif vec.shape[-1] != self.vec.shape[-1]:
            raise ValueError(f"frame vectors have {vec.shape[-1]} values, the bank holds {self.vec.shape[-1]} "
                             "(frame_vector 'flatten' needs the same tokens per frame)")
        if self.count > 0 and int(self.t[0, self.newest[0]]) >= t:
            raise ValueError(f"frame {t} arrives after frame {int(self.t[0, self.newest[0]])}: frames must be in order")
        self._own_vec()
        self.arrivals += 1
        rows = torch.arange(self.heads, device=self.device)
        slot, tail = self.free.clone(), self.newest.clone()
        self.t[rows, slot] = t
        self.time[rows, slot] = t if time is None else time
        self.vec[rows, slot] = vec
        self.prev[rows, slot] = tail
        self.next[rows, slot] = EMPTY
        self.score[rows, slot] = INF  # the newest frame is an endpoint: scored when the next arrives
        if self.count == 0:
            self.oldest = slot.clone()
        else:
            self.next[rows, tail] = slot
        self.newest = slot
        self.count += 1
        # the next frame's slot: the first free one (while filling, slot ``count``; when full, the
        # one the eviction below frees)
        self.free = (self.t == EMPTY).to(torch.int8).argmax(dim=1) if self.count <= self.capacity else slot
        evaluations = self._rescore(rows, tail) if self.count > 1 else torch.zeros_like(slot)
        evicted = torch.full_like(slot, EMPTY)
        if self.count > (self.capacity if keep is None else min(int(keep), self.capacity)):
            evicted, more = self._evict(rows)
            evaluations = evaluations + more
        self.last_evaluations = evaluations
        return evicted

    def evict(self) -> torch.Tensor:
        """Evict one frame from every head now (its share shrank: another camera needs room; at least
        3 frames held). Returns the evicted frame per head."""
        if self.count < 3:
            raise ValueError(f"a bank of {self.count} frames has no interior frame to evict")
        return self._evict(torch.arange(self.heads, device=self.device))[0]

    def _evict(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # argmin I over interior frames (endpoints score +inf); ties: the smallest t
        lowest = self.score.min(dim=1, keepdim=True).values
        candidates = torch.where(self.score == lowest, self.t, torch.full_like(self.t, torch.iinfo(torch.long).max))
        victim = candidates.argmin(dim=1)
        evicted_t = self.t[rows, victim].clone()
        p, n = self.prev[rows, victim], self.next[rows, victim]
        self.next[rows, p] = n
        self.prev[rows, n] = p
        self.t[rows, victim] = EMPTY
        self.time[rows, victim] = EMPTY
        self.prev[rows, victim] = EMPTY
        self.next[rows, victim] = EMPTY
        self.score[rows, victim] = INF
        self.count -= 1
        self.evictions += 1
        self.free = victim
        return evicted_t, self._rescore(rows, p) + self._rescore(rows, n)

    def _rescore(self, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Score slot ``slots[h]`` of each head where it is interior; returns 1/0 per head (computed)."""
        p, n = self.prev[rows, slots], self.next[rows, slots]
        interior = (p != EMPTY) & (n != EMPTY)
        if interior.any():
            h, s, p, n = rows[interior], slots[interior], p[interior], n[interior]
            self.score[h, s] = stce_score(self.vec[h, p], self.vec[h, s], self.vec[h, n],
                                          self.time[h, p], self.time[h, n])
        return interior.long()

    # -- reading --------------------------------------------------------------------------------
    def frames(self, head: int) -> list[int]:
        """Frames held by ``head``, oldest first (walks the list)."""
        out, slot = [], int(self.oldest[head])
        while slot != EMPTY and len(out) <= self.capacity:
            out.append(int(self.t[head, slot]))
            slot = int(self.next[head, slot])
        return out

    def score_of(self, head: int, t: int) -> float:
        slot = torch.nonzero(self.t[head] == t).flatten()
        return float(self.score[head, slot[0]]) if slot.numel() else float("nan")

    # -- snapshots ------------------------------------------------------------------------------
    def _own_vec(self) -> None:
        # copy-on-write: a mark shares ``vec`` instead of cloning it (it can be large)
        if self._vec_shared and self.vec is not None:
            self.vec = self.vec.clone()
        self._vec_shared = False

    def snapshot(self) -> dict[str, Any]:
        """A copy to go back to (the session marks before a chunk and restores it on failure)."""
        self._vec_shared = True
        return {"t": self.t.clone(), "time": self.time.clone(), "prev": self.prev.clone(), "next": self.next.clone(),
                "score": self.score.clone(), "vec": self.vec, "oldest": self.oldest.clone(),
                "newest": self.newest.clone(), "free": self.free.clone(), "count": self.count,
                "arrivals": self.arrivals, "evictions": self.evictions,
                "last_evaluations": self.last_evaluations.clone()}

    def restore(self, snap: dict[str, Any]) -> None:
        for key in ("t", "prev", "next", "score", "oldest", "newest", "free", "last_evaluations"):
            setattr(self, key, snap[key].clone().to(self.device))
        self.time = snap.get("time", snap["t"]).clone().to(self.device)
        self.vec = None if snap["vec"] is None else snap["vec"].to(self.device)
        self._vec_shared = True
        self.count, self.evictions = int(snap["count"]), int(snap["evictions"])
        self.arrivals = int(snap["arrivals"])

    def state(self) -> dict[str, Any]:
        snap = self.snapshot()
        return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in snap.items()}

    def load(self, state: dict[str, Any]) -> None:
        if tuple(state["t"].shape) != tuple(self.t.shape):
            raise ValueError(f"trajectory state is {tuple(state['t'].shape)}, this bank is {tuple(self.t.shape)}")
        self.restore(state)


class TrajectoryLanes:
    """The trajectories of one policy's episodic heads, one ``TrajectoryBank`` per lane: a camera
    when each camera keeps its share (``camera_budget_share: equal``), else one lane for all. The
    capacity N_e is shared out among the lanes held (``clocks.fair_shares``, at least 2 each: the
    two endpoints of a trajectory are never evicted); with one lane it is N_e, as in the paper."""

    def __init__(self, heads: int, capacity: int, device: torch.device | str = "cpu"):
        self.heads, self.capacity, self.device = int(heads), int(capacity), torch.device(device)
        self.banks: dict[int, TrajectoryBank] = {}
        self.last_lane: int | None = None

    def insert(self, lane: int, t: int, vec: torch.Tensor) -> list[torch.Tensor]:
        """Frame ``t`` of ``lane`` arrives (``TrajectoryBank.insert``); lanes whose share it shrank
        evict down to their shares. Returns the evictions, each a frame per head (or -1)."""
        bank = self.banks.get(lane)
        if bank is None:
            bank = self.banks[lane] = TrajectoryBank(self.heads, self.capacity, self.device)
        demands = {other: b.count for other, b in self.banks.items()}
        demands[lane] += 1
        shares = fair_shares(demands, self.capacity, least=2)
        # the temporal weight of a camera's trajectory counts that camera's frames (§3.4, "Cameras");
        # frames on no clock count the session's units, as the paper's single stream does
        time = t if lane == NO_CLOCK else bank.arrivals
        out = [bank.insert(t, vec, keep=shares[lane], time=time)]
        self.last_lane = lane
        for other, b in self.banks.items():
            while other != lane and b.count > shares[other]:
                out.append(b.evict())
        return out

    @property
    def only(self) -> TrajectoryBank:
        """The one lane's bank (an empty bank before the first frame)."""
        if len(self.banks) > 1:
            raise ValueError(f"{len(self.banks)} trajectory lanes (one per camera): ask banks[lane]")
        return next(iter(self.banks.values())) if self.banks else TrajectoryBank(self.heads, self.capacity, self.device)

    @property
    def evictions(self) -> int:
        return sum(b.evictions for b in self.banks.values())

    @property
    def arrivals(self) -> int:
        return sum(b.arrivals for b in self.banks.values())

    @property
    def last_evaluations(self) -> torch.Tensor:
        """The scores computed by the latest arrival, per head (TC7)."""
        if self.last_lane is None:
            return torch.zeros(self.heads, dtype=torch.long, device=self.device)
        return self.banks[self.last_lane].last_evaluations

    def frames(self, head: int) -> list[int]:
        """Frames held by ``head`` over every lane, oldest first."""
        return sorted(t for b in self.banks.values() for t in b.frames(head))

    # -- snapshots ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {"arrivals": self.arrivals, "evictions": self.evictions, "last_lane": self.last_lane,
                "lanes": [[lane, b.snapshot()] for lane, b in sorted(self.banks.items())]}

    def restore(self, snap: dict[str, Any]) -> None:
        saved = {int(lane): state for lane, state in snap["lanes"]}
        for lane in [lane for lane in self.banks if lane not in saved]:
            del self.banks[lane]
        for lane, state in saved.items():
            bank = self.banks.get(lane)
            if bank is None:
                bank = self.banks[lane] = TrajectoryBank(self.heads, self.capacity, self.device)
            elif (bank.arrivals, bank.evictions) == (state["arrivals"], state["evictions"]):
                continue  # unchanged since the snapshot
            bank.restore(state)
        self.last_lane = snap["last_lane"]

    def state(self) -> dict[str, Any]:
        return {"arrivals": self.arrivals, "evictions": self.evictions, "last_lane": self.last_lane,
                "lanes": [[lane, b.state()] for lane, b in sorted(self.banks.items())]}

    def load(self, state: dict[str, Any]) -> None:
        self.banks = {}
        for lane, saved in state["lanes"]:
            bank = self.banks[int(lane)] = TrajectoryBank(self.heads, self.capacity, self.device)
            bank.load(saved)
        self.last_lane = state["last_lane"]
