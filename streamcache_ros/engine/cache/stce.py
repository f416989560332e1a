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
"""
from __future__ import annotations

from typing import Any

import torch

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

    Per head, arrays of capacity + 1 slots (docs/h2svc.md §3.4): frame index ``t``, frame vector
    ``vec``, ``prev``/``next`` slots, ``score``. A new frame takes the slot the last eviction freed.
    ``last_evaluations`` [heads] counts the scores computed by the latest arrival (TC7).
    """

    def __init__(self, heads: int, capacity: int, device: torch.device | str = "cpu"):
        if capacity < 2:
            raise ValueError(f"an episodic bank needs capacity >= 2 frames, got {capacity}")
        self.heads, self.capacity, self.device = int(heads), int(capacity), torch.device(device)
        slots = self.capacity + 1
        self.t = torch.full((self.heads, slots), EMPTY, dtype=torch.long, device=self.device)
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
    def insert(self, t: int, vec: torch.Tensor) -> torch.Tensor:
        """Link frame ``t`` (vectors [heads, dim]) after each head's newest frame; when a head then
        holds capacity + 1 frames it evicts one. Returns the evicted frame per head, or -1."""
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
        self.free = torch.full_like(slot, self.count) if self.count <= self.capacity else slot
        evaluations = self._rescore(rows, tail) if self.count > 1 else torch.zeros_like(slot)
        evicted = torch.full_like(slot, EMPTY)
        if self.count > self.capacity:
            evicted, more = self._evict(rows)
            evaluations = evaluations + more
        self.last_evaluations = evaluations
        return evicted

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
                                          self.t[h, p], self.t[h, n])
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
        return {"t": self.t.clone(), "prev": self.prev.clone(), "next": self.next.clone(),
                "score": self.score.clone(), "vec": self.vec, "oldest": self.oldest.clone(),
                "newest": self.newest.clone(), "free": self.free.clone(), "count": self.count,
                "arrivals": self.arrivals, "evictions": self.evictions,
                "last_evaluations": self.last_evaluations.clone()}

    def restore(self, snap: dict[str, Any]) -> None:
        for key in ("t", "prev", "next", "score", "oldest", "newest", "free", "last_evaluations"):
            setattr(self, key, snap[key].clone().to(self.device))
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
