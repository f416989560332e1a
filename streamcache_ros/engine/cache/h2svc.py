"""H2SVC: a head-banked KV cache (docs/h2svc.md).

Every KV head of the model is put in a bank by an offline profile of its attention (SAP, sap.py):
instantaneous heads keep the last W_s frames, short-term heads the last W_w, episodic heads up to
N_e frames chosen by STCE (stce.py). The heads of one layer that share a bank are stored together
(a ``HeadGroup``: a per-row ``KVStore``, each row really holding only its frames), each query head
attends only to its KV head's row, and the model is otherwise unchanged. A "frame" is a stream unit:
one frame, or a temporal patch of 2 frames on Qwen2.5-VL; W_s, W_w and N_e count units.

Arrival (§3.2), one unit at a time by default (``unit_by_unit``): while unit f is prefilled, FIFO
heads do not see units <= f - W; after it, the episodic heads link f and each evicts one frame when
it holds N_e + 1. So that a chunk that fails half-way leaves the cache as it was, evicted tokens are
only hidden until the chunk ends, and then removed (compress).

Cameras (docs/h2svc.md "Cameras"): each camera's units are on its own position clock, and with
``camera_budget_share: equal`` each bank's capacity (W_s, W_w, N_e units) is shared out among the
cameras held, each episodic head keeping one STCE trajectory per camera.

The head map is given: the factory finds and loads it (and says which parameter to set when there
is none); the policy checks only that it has this model's shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .attention import cached_attention, varlen_attention
from .base import (CacheGeometry, CachePolicy, CacheStats, ChunkContext, ChunkOutcome, ChunkShape, NewTokens,
                   UnitTokens)
from .clocks import NO_CLOCK, camera_share_setting, newest_units, stored_clock
from .positions import ReindexSettings, renumber
from .rope import apply_rotary
from .rows import QueryRows, combine
from .sap import BANK_NAMES, DEFAULT_RATIOS, EPISODIC, HeadMap, check_ratios
from .settings import SettingError, setting
from .stce import TrajectoryBank, TrajectoryLanes
from .store import KVStore
from .units import NO_UNIT, PAD_UNIT, PREFIX_UNIT


@dataclass(frozen=True)
class H2svcSettings(ReindexSettings):
    w_s: int = setting(4, "Instantaneous heads: FIFO window, in stream units (a frame; 2 frames on Qwen2.5-VL)",
                       low=1)
    w_w: int = setting(16, "Short-term heads: FIFO window, in stream units", low=1)
    n_e: int = setting(64, "Episodic heads: at most this many stream units, evicted by trajectory curvature (STCE)",
                       low=2)
    ratios: list = setting(list(DEFAULT_RATIOS), "Share of KV heads per bank, by the head map's scores: "
                                                 "instantaneous, short-term, episodic (three numbers summing to 1)")
    head_map_path: str = setting("", "The head map from `streamcache-profile`; '' = h2svc_head_map.json in the "
                                     "model's folder")
    granularity: str = setting("head", "head | layer (ablation: a layer's heads share one bank)",
                               choices=("head", "layer"))
    frame_vector: str = setting("mean", "STCE's per-frame vector: mean (of the frame's Values) | flatten",
                                choices=("mean", "flatten"))
    unit_by_unit: bool = setting(True, "Prefill one stream unit per forward (frame-by-frame arrival); false = a "
                                       "chunk per forward")
    camera_budget_share: str = camera_share_setting()

    def validate(self) -> None:
        if self.w_s < 1 or self.w_w < 1:
            raise SettingError("w_s", f"and w_w must be >= 1 unit, got {self.w_s} and {self.w_w}")
        if self.n_e < 2:
            raise SettingError("n_e", f"must be >= 2 units (the two endpoints are never evicted), got {self.n_e}")
        try:
            check_ratios(self.ratios)
        except ValueError as err:
            raise SettingError("ratios", str(err).split(" ", 1)[1]) from None


@dataclass
class HeadGroup:
    """The KV heads of one layer in one bank (instantaneous, short-term or episodic): their store,
    one row per head, and the query heads that read them."""

    bank: int
    store: KVStore
    query_heads: torch.Tensor


def check_head_map(head_map: HeadMap, geometry: CacheGeometry) -> None:
    """A head map must have the model's shape (which model it was profiled on, the factory checks)."""
    shape, ours = (head_map.num_layers, head_map.num_kv_heads), (geometry.num_layers, geometry.num_kv_heads)
    if shape != ours:
        raise ValueError(f"the head map was profiled on {shape[0]} layers x {shape[1]} KV heads; this model has "
                         f"{ours[0]} x {ours[1]}")


class H2svcPolicy(CachePolicy):
    name = "h2svc"
    settings_class = H2svcSettings
    inputs = ("head_map",)

    def __init__(self, settings: H2svcSettings | None = None, head_map: HeadMap | None = None, **params):
        super().__init__(settings, **params)
        s = self.settings
        self.windows = (s.w_s, s.w_w)  # FIFO length of banks 0 and 1, in units
        self.n_e = s.n_e
        self.prefill_unit_by_unit = s.unit_by_unit
        self.head_map = head_map
        self.bank_id: torch.Tensor | None = None  # [L, Hkv]

    def config_dict(self) -> dict[str, Any]:
        config = {k: v for k, v in super().config_dict().items() if k != "head_map_path"}
        return {**config, "head_map": self.head_map.digest() if self.head_map else ""}

    # -- life cycle -----------------------------------------------------------------------------
    def setup(self, geometry: CacheGeometry) -> None:
        if self.head_map is None:
            raise ValueError("h2svc needs a head map (make_policy('h2svc', head_map=HeadMap.load(path)); the "
                             "factory finds the model's own)")
        check_head_map(self.head_map, geometry)
        self.bank_id = self.head_map.bank_ids(self.settings.ratios, self.settings.granularity)
        super().setup(geometry)

    def reset(self) -> None:
        g = self.geometry
        self.rule = self.settings.reindex_rule(g.max_position_embeddings)
        self.groups: list[list[HeadGroup]] = []
        self.trajectory_rows: dict[tuple[int, int], torch.Tensor] = {}  # (layer, bank) -> trajectory rows
        episodic = 0
        for layer in range(g.num_layers):
            groups = []
            for bank in range(3):
                heads = [h for h in range(g.num_kv_heads) if int(self.bank_id[layer, h]) == bank]
                if heads:
                    query_heads = torch.tensor([h * g.group_size + i for h in heads for i in range(g.group_size)],
                                               dtype=torch.long, device=g.device)
                    groups.append(HeadGroup(bank, KVStore.empty(g, heads, shared=False), query_heads))
                    if bank == EPISODIC:
                        self.trajectory_rows[(layer, bank)] = torch.arange(episodic, episodic + len(heads))
                        episodic += len(heads)
            self.groups.append(groups)
        self.trajectories = TrajectoryLanes(episodic, self.n_e, g.device)
        self.clocks_seen: set[int] = set()  # the clocks of the video units stored so far
        self.pending: list[list[int]] = [[] for _ in range(episodic)]  # evicted, not yet removed
        self.newest_unit = -1
        self.chunk_tokens = 0  # video tokens of the chunk being stored (reserved for the next one)
        self.dropped_units = 0  # FIFO drops, summed over heads
        self.evicted_age_sum = 0  # over every episodic head's evictions
        self.reindex_events = 0
        self.reindexed_heads = 0

    @property
    def trajectory(self) -> TrajectoryBank:
        """The episodic heads' trajectory with one camera (or ``camera_budget_share: shared``)."""
        return self.trajectories.only

    @property
    def camera_shares(self) -> bool:
        """Each camera keeps its share of every bank (``camera_budget_share: equal``, clocks.py)
        and more than one camera has been seen (with one, the shares are the windows themselves)."""
        return self.settings.camera_budget_share == "equal" and len(self.clocks_seen) > 1

    def lane_of(self, clock: int | None) -> int:
        """The trajectory lane of a unit on ``clock``: its camera's, or one for all when shared."""
        return stored_clock(clock) if self.settings.camera_budget_share == "equal" else NO_CLOCK

    # -- forward pass ---------------------------------------------------------------------------
    def append(self, layer, k, v, new):
        self._store(layer, k, v, new)

    def attend(self, layer, q, k, v, new, key_filter=None):
        cos, sin = self._store(layer, k, v, new)
        group_size = self.geometry.group_size
        q = apply_rotary(q, cos.repeat_interleave(group_size, 0)[None], sin.repeat_interleave(group_size, 0)[None])
        first_unit = new.arriving_unit()
        rows = key_filter if isinstance(key_filter, QueryRows) else None
        out = torch.empty_like(q)
        for group in self.groups[layer]:
            visible = self._visible(layer, group, first_unit, None if rows else key_filter, new.clock)
            group_q = q[:, group.query_heads]
            if rows is not None:  # several questions at once: one mask per query (rows.py)
                mask = combine(rows.mask(group.store, new.clock), visible)
                out[:, group.query_heads] = cached_attention(group_q, group.store.keys, group.store.values,
                                                             query_mask=mask, query_rows=rows.rows)
                continue
            if self.probe is not None:
                self.probe.observe(layer, group.store, group_q, visible)
            out[:, group.query_heads] = self._group_attention(group_q, group.store, visible)
        return out

    def _store(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               new: NewTokens) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens to every group of the layer, each KV head at its own next offset,
        keys rotated; returns the cos/sin [Hkv, Q, D] they were rotated with (for the queries)."""
        g = self.geometry
        groups = self.groups[layer]
        offsets = torch.empty(g.num_kv_heads, dtype=torch.float32, device=k.device)
        for group in groups:
            offsets[group.store.heads] = group.store.next_offsets(new.clock).to(k.device)
        # docs/h2svc.md §5: positions are per KV head (they differ once heads re-index on their own)
        positions = new.rel_positions.to(k.device)[None] + offsets[:, None, None]  # [Hkv, axes, Q]
        hkv, axes, q_len = positions.shape
        cos, sin = g.rotary.cos_sin(positions.transpose(0, 1).reshape(axes, hkv * q_len), k.dtype)
        cos, sin = cos.view(hkv, q_len, -1), sin.view(hkv, q_len, -1)
        k = apply_rotary(k, cos[None], sin[None])
        for group in groups:
            heads = group.store.heads
            group.store.append(k[:, heads], v[:, heads], positions[heads], new.units, new.chunks, new.clock)
        if layer == 0:
            self.chunk_tokens += int((new.units >= 0).sum())
            if bool((new.units >= 0).any()):
                self.clocks_seen.add(stored_clock(new.clock))
        return cos, sin

    def _visible(self, layer: int, group: HeadGroup, first_unit: int | None, key_filter,
                 clock: int | None = None) -> torch.Tensor | None:
        """[n, T] keys each head of the group may see now (a pass on ``clock``), or None for all."""
        units = group.store.units
        hidden = units == PAD_UNIT if group.store.padded else None

        def hide(mask):
            nonlocal hidden
            hidden = mask if hidden is None else hidden | mask

        if group.bank != EPISODIC and first_unit is not None:
            # §3.2: FIFO drops come before the unit is encoded: units <= f - W are out of the window
            # (with camera shares: each camera's window is its share of W, "Cameras")
            window = self.windows[group.bank]
            if self.camera_shares:
                keep = newest_units(units[0], group.store.clocks[0], window, (stored_clock(clock), first_unit))
                hide(~keep[None].expand_as(units))
            else:
                hide((units >= 0) & (units <= first_unit - window))
        if group.bank == EPISODIC:
            pending = self._pending_units(layer, group)
            if pending is not None:
                hide((units[:, :, None] == pending[:, None, :]).any(dim=-1))
        if key_filter is not None:
            hide(~group.store.visible(key_filter, clock))
        else:
            off_clock = group.store.clock_mask(clock)  # a camera's pass sees only its clock (clocks.py)
            if off_clock is not None:
                hide(~off_clock)
        if hidden is None or not bool(hidden.any()):
            return None
        return ~hidden

    def _pending_units(self, layer: int, group: HeadGroup) -> torch.Tensor | None:
        """[n, k] units evicted from each episodic head during this chunk (still stored), or None."""
        rows = self.trajectory_rows[(layer, group.bank)].tolist()
        lists = [self.pending[r] for r in rows]
        width = max(len(p) for p in lists)
        if width == 0:
            return None
        table = torch.full((len(rows), width), NO_UNIT, dtype=torch.long)
        for i, p in enumerate(lists):
            table[i, :len(p)] = torch.tensor(p, dtype=torch.long)
        return table.to(group.store.units.device)

    def _group_attention(self, q: torch.Tensor, store: KVStore, visible: torch.Tensor | None) -> torch.Tensor:
        """§4: the query heads of a group's KV heads against those heads' rows only (option A: SDPA
        with an explicit bottom-right mask; on CUDA with flash-attn, flash per group or varlen
        (option B) when heads see different keys)."""
        flash = (self.geometry.attention_backend == "flash" and q.is_cuda
                 and q.dtype in (torch.float16, torch.bfloat16))
        if flash and visible is not None:
            return varlen_attention(q, store.keys, store.values, visible)
        return cached_attention(q, store.keys, store.values, visible, "flash" if flash else "sdpa")

    # -- arrivals -------------------------------------------------------------------------------
    def after_prefill(self, new: NewTokens) -> None:
        """§3.2 after a unit is encoded: the episodic heads link it and evict one frame each when
        they hold N_e + 1; several units (a chunked prefill) are taken one by one, in order."""
        units = new.units[new.units >= 0]
        for unit in torch.unique_consecutive(units).tolist():
            if self.trajectories.heads:
                for evicted in self.trajectories.insert(self.lane_of(new.clock), unit, self._frame_vectors(unit)):
                    for row, gone in enumerate(evicted.tolist()):
                        if gone >= 0:
                            self.pending[row].append(gone)
                            self.evicted_age_sum += unit - gone
            self.newest_unit = max(self.newest_unit, unit)

    def _frame_vectors(self, unit: int) -> torch.Tensor:
        """[episodic heads, D] (or n_f·D for 'flatten'): §3.3 V̄ of the unit's Value vectors, fp32."""
        parts = []
        for groups in self.groups:
            for group in groups:
                if group.bank != EPISODIC:
                    continue
                store = group.store
                values = store.values[0, :, store.unit_columns(unit)].float()  # [n, n_f, D]
                mean = self.settings.frame_vector == "mean"
                parts.append(values.mean(dim=1) if mean else values.reshape(store.rows, -1))
        return torch.cat(parts)

    def compress(self, context: ChunkContext) -> ChunkOutcome:
        evictions = sum(len(p) for p in self.pending)
        freed = self._remove_evicted()
        if self.settings.reindex == "eager":
            heads = self._reindex(lambda offsets: torch.ones_like(offsets, dtype=torch.bool))
        else:
            # §5 lazy: a head re-indexes when its positions pass max_position_embeddings - margin
            heads = self._reindex(lambda offsets: offsets - 1.0 > self.rule.threshold)
        # reserved buffers (store.py): room for a chunk like this one, so that its units, appended
        # one at a time, copy no store (at most one copy a store a chunk while the windows fill)
        for groups in self.groups:
            for group in groups:
                group.store.reserve(self.chunk_tokens)
        self.chunk_tokens = 0
        return ChunkOutcome(evicted_tokens=freed, reindexed=heads > 0,
                            details={"stce_evictions": evictions, "freed_tokens": freed, "reindexed_heads": heads})

    def _remove_evicted(self) -> int:
        """Drop what FIFO windows and STCE evictions hid during the chunk; returns tokens freed."""
        freed = 0
        for layer, groups in enumerate(self.groups):
            for group in groups:
                store, units = group.store, group.store.units
                if group.bank == EPISODIC:
                    pending = self._pending_units(layer, group)
                    gone = (units[:, :, None] == pending[:, None, :]).any(dim=-1) if pending is not None else None
                else:
                    window = self.windows[group.bank]
                    if self.camera_shares:  # each camera's newest units, its share of the window
                        gone = ~newest_units(units[0], store.clocks[0], window)[None].expand_as(units)
                    else:
                        gone = (units >= 0) & (units <= self.newest_unit - window)
                    self.dropped_units += int(torch.unique(units[gone]).numel()) * store.rows
                if gone is None or not bool(gone.any()):
                    continue
                before = int(store.tokens_per_row().sum())
                store.compact(~gone & (units != PAD_UNIT))
                freed += before - int(store.tokens_per_row().sum())
        self.pending = [[] for _ in self.pending]
        return freed

    # -- positions ------------------------------------------------------------------------------
    def _reindex(self, select, clock: int | None = None) -> int:
        """Re-index the heads for which ``select(next_offsets [n]) -> bool [n]`` holds, clock by
        clock (``clock``, or each clock held: every camera's positions decide for themselves, and
        are renumbered on their own, KVStore.reindex); returns how many heads."""
        count = 0
        for groups in self.groups:
            for group in groups:
                store = group.store
                video = (store.units != PREFIX_UNIT) & (store.units != PAD_UNIT)
                clocks = [clock] if clock is not None else torch.unique(store.clocks[video]).tolist() or [None]
                heads = set()
                for c in clocks:
                    rows = torch.nonzero(select(store.next_offsets(c))).flatten()
                    if rows.numel():
                        store.reindex(self.geometry.rotary, self.renumber, rows, None if c is None else [c])
                        heads.update(rows.tolist())
                count += len(heads)
        if count:
            self.reindex_events += 1
            self.reindexed_heads += count
        return count

    def renumber(self, old: torch.Tensor, units: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
        """§5: a head's kept tokens renumbered contiguously in stream order (1D: 0..n-1; M-RoPE: each
        frame moved by one delta, frames laid back to back by the chunk-start rule). Prefix unchanged."""
        return renumber(old, units, units, self.geometry.traits.rope_layout)[0]

    def max_position(self, clock: int | None = None) -> float:
        """The largest position on ``clock`` (None: of every token), over the heads."""
        return max((float(g.store.next_offsets(clock).max()) - 1.0 for groups in self.groups for g in groups
                    if g.store.rows), default=-1.0)

    def ensure_room(self, n_tokens: int, clock: int | None = None) -> None:
        self._reindex(lambda offsets: self.rule.overflows(offsets - 1.0, n_tokens), clock)
        self.rule.require(self.max_position(clock), n_tokens)

    @property
    def bounding_setting(self) -> str:
        # between chunks a head holds at most its window (FIFO banks) or N_e units (episodic)
        windows = {"w_s": self.settings.w_s, "w_w": self.settings.w_w, "n_e": self.settings.n_e}
        return max(windows, key=windows.get)

    def kept_positions(self, value: int, shape: ChunkShape) -> int:
        # §5: a head renumbers its units back to back, each keeping its own extent
        return value * shape.unit_positions

    # -- temporary tokens -------------------------------------------------------------------------
    def mark(self) -> dict[str, Any]:
        return {"lengths": [[len(g.store) for g in groups] for groups in self.groups],
                "trajectory": self.trajectories.snapshot(), "pending": [list(p) for p in self.pending],
                "newest_unit": self.newest_unit, "evicted_age_sum": self.evicted_age_sum}

    def truncate(self, mark: dict[str, Any]) -> None:
        for groups, lengths in zip(self.groups, mark["lengths"]):
            for group, length in zip(groups, lengths):
                group.store.truncate(length)
        self.trajectories.restore(mark["trajectory"])
        self.pending = [list(p) for p in mark["pending"]]
        self.newest_unit = mark["newest_unit"]
        self.evicted_age_sum = mark["evicted_age_sum"]

    # -- accounting and snapshots -----------------------------------------------------------------
    def layer_stores(self) -> list[list[tuple[int, KVStore]]]:
        return [[(group.bank, group.store) for group in groups] for groups in self.groups]

    def stats(self) -> CacheStats:
        g = self.geometry
        layer_totals, bank_tokens, held = [], [0, 0, 0], []
        for groups in self.groups:
            total = 0
            for group in groups:
                tokens = int(group.store.tokens_per_row().sum())
                total += tokens
                bank_tokens[group.bank] += tokens
                held.append(group.store.units.flatten())
            layer_totals.append(total)
        units = torch.unique(torch.cat(held)) if held else torch.empty(0, dtype=torch.long)
        evictions = self.trajectories.evictions  # evictions of every episodic head at once, one frame each
        head_evictions = evictions * self.trajectories.heads
        return CacheStats(
            policy=self.name,
            layer_tokens=[round(t / g.num_kv_heads) for t in layer_totals],  # mean over a layer's KV heads
            kv_tokens=round(sum(layer_totals) / g.num_kv_heads),
            kv_bytes=sum(group.store.nbytes for groups in self.groups for group in groups),
            budget_tokens=0,
            units=[int(u) for u in units.tolist() if u >= 0],
            max_position=self.max_position(),
            reindex_events=self.reindex_events,
            bank_tokens=bank_tokens,
            extra={"split": [int((self.bank_id == b).sum()) for b in range(3)],
                   "bank_names": list(BANK_NAMES),
                   "stce_evictions": evictions,
                   "score_evaluations_last_arrival": int(self.trajectories.last_evaluations.max())
                   if self.trajectories.heads else 0,
                   # the mean age (in units) of an evicted frame, over every episodic head's evictions
                   "evicted_age_mean": self.evicted_age_sum / head_evictions if head_evictions else 0.0,
                   "fifo_dropped_units": self.dropped_units,
                   "kv_reserved_bytes": sum(group.store.reserved_bytes for groups in self.groups for group in groups),
                   "reindexed_heads": self.reindexed_heads,
                   "head_map": self.settings.head_map_path},
        )

    def unit_tokens(self) -> UnitTokens:
        rows = [row for groups in self.groups for group in groups for row in group.store.units]
        return UnitTokens.of(rows, rows_per_layer=self.geometry.num_kv_heads)

    def state_dict(self) -> dict[str, Any]:
        return {"bank_id": self.bank_id.tolist(),
                "groups": [[{"bank": g.bank, **g.store.state()} for g in groups] for groups in self.groups],
                "trajectory": self.trajectories.state(), "pending": [list(p) for p in self.pending],
                "newest_unit": self.newest_unit, "dropped_units": self.dropped_units,
                "evicted_age_sum": self.evicted_age_sum, "reindex_events": self.reindex_events,
                "reindexed_heads": self.reindexed_heads}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["bank_id"] != self.bank_id.tolist():
            raise ValueError("the snapshot's heads are split into other banks")
        self.reset()
        for groups, saved in zip(self.groups, state["groups"], strict=True):
            for group, group_state in zip(groups, saved, strict=True):
                if group_state["bank"] != group.bank:
                    raise ValueError(f"snapshot group of bank {group_state['bank']} where this cache has {group.bank}")
                group.store.load(group_state, self.geometry)
        self.trajectories.load(state["trajectory"])
        self.clocks_seen = {int(c) for groups in self.groups for g in groups
                            for c in torch.unique(g.store.clocks[g.store.units >= 0]).tolist()}
        self.pending = [list(p) for p in state["pending"]]
        self.newest_unit = int(state["newest_unit"])
        self.dropped_units = int(state["dropped_units"])
        self.evicted_age_sum = int(state["evicted_age_sum"])
        self.reindex_events = int(state["reindex_events"])
        self.reindexed_heads = int(state["reindexed_heads"])
