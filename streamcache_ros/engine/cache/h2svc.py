"""H2SVC: a head-banked KV cache (docs/h2svc.md).

Every KV head of the model is put in a bank by an offline profile of its attention (SAP, sap.py):
instantaneous heads keep the last W_s frames, short-term heads the last W_w, episodic heads up to
N_e frames chosen by STCE (stce.py). The heads of one layer that share a bank are stored together
(a ``HeadGroup`` of ``HeadGroupStorage``, storage.py: each row really holds only its frames), each
query head attends only to its KV head's row, and the model is otherwise unchanged. A "frame" is a stream unit:
one frame, or a temporal patch of 2 frames on Qwen2.5-VL; W_s, W_w and N_e count units.

Arrival (§3.2), one unit at a time by default (``unit_by_unit``): while unit f is prefilled, FIFO
heads do not see units <= f - W; after it, the episodic heads link f and each evicts one frame when
it holds N_e + 1. So that a chunk that fails half-way leaves the cache as it was, evicted tokens are
only hidden until the chunk ends, and then removed (compress).

Cameras (docs/h2svc.md "Cameras"): each camera's units are on its own position clock, and with
``camera_budget_share: equal`` each bank's capacity (W_s, W_w, N_e units) is shared out among the
cameras held, each episodic head keeping one STCE trajectory per camera.

The instant window (``instant_frames``, instant.py): every head keeps the window's units beside its
bank's, and the window moves at the end of a chunk, once the chunk's frames are known: FIFO banks
then keep their window of the units older than it, and a unit joins the episodic trajectories when
it leaves it (so STCE never evicts a unit in the window). During a chunk a head sees what it held
after the last one and the chunk so far.

The head map is given: the factory finds and loads it (and says which parameter to set when there
is none); the policy checks only that it has this model's shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .attention import cached_attention, head_rows_attention
from .base import CachePolicy
from .types import CacheGeometry, CacheStats, ChunkContext, ChunkOutcome, ChunkShape, NewTokens
from .clocks import NO_CLOCK, camera_share_setting, newest_units, stored_clock
from .instant import InstantWindow, instant_setting
from .positions import ReindexSettings, renumber
from .rope import apply_rotary
from .rows import QueryRows, combine
from .sap import BANK_NAMES, DEFAULT_RATIOS, EPISODIC, HeadMap, check_ratios
from .settings import SettingError, setting
from .stce import TrajectoryBank, TrajectoryLanes
from .storage import HeadGroup, HeadGroupStorage
from .units import NO_UNIT, PAD_UNIT


@dataclass(frozen=True)
class H2svcSettings(ReindexSettings):
    w_s: int = setting(4, "Instantaneous heads: FIFO window, in stream units (a frame; 2 frames on Qwen2.5-VL)",
                       low=1)
    w_w: int = setting(16, "Short-term heads: FIFO window, in stream units", low=1)
    n_e: int = setting(64, "Episodic heads: at most this many stream units, evicted by trajectory curvature (STCE)",
                       low=2)
    ratios: list = setting([], "Share of KV heads per bank, by the head map's scores: instantaneous, short-term, "
                               "episodic (three numbers summing to 1); [] = the head map's own (chosen for its "
                               "model, docs/h2svc.md \"Bank ratios chosen by data\")")
    head_map_path: str = setting("", "The head map from `streamcache-profile`; '' = h2svc_head_map.json in the "
                                     "model's folder")
    granularity: str = setting("head", "head | layer (ablation: a layer's heads share one bank)",
                               choices=("head", "layer"))
    frame_vector: str = setting("mean", "STCE's per-frame vector: mean (of the frame's Values) | flatten",
                                choices=("mean", "flatten"))
    unit_by_unit: bool = setting(True, "Prefill one stream unit per forward (frame-by-frame arrival); false = a "
                                       "chunk per forward")
    camera_budget_share: str = camera_share_setting()
    instant_frames: int = instant_setting()

    def validate(self) -> None:
        if self.w_s < 1 or self.w_w < 1:
            raise SettingError("w_s", f"and w_w must be >= 1 unit, got {self.w_s} and {self.w_w}")
        if self.n_e < 2:
            raise SettingError("n_e", f"must be >= 2 units (the two endpoints are never evicted), got {self.n_e}")
        if not self.ratios:
            return  # the head map's own, checked when the map is read
        try:
            check_ratios(self.ratios)
        except ValueError as err:
            raise SettingError("ratios", str(err).split(" ", 1)[1]) from None


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

    @property
    def ratios(self) -> list[float]:
        """The bank ratios in force: the setting, or where it is empty the head map's own."""
        if self.settings.ratios or self.head_map is None:
            return list(self.settings.ratios or DEFAULT_RATIOS)
        return list(self.head_map.ratios)

    def config_dict(self) -> dict[str, Any]:
        config = {k: v for k, v in super().config_dict().items() if k != "head_map_path"}
        # the ratios in force: two caches split by other ratios hold other banks
        return {**config, "ratios": self.ratios, "head_map": self.head_map.digest() if self.head_map else ""}

    # -- life cycle -----------------------------------------------------------------------------
    def setup(self, geometry: CacheGeometry) -> None:
        if self.head_map is None:
            raise ValueError("h2svc needs a head map (make_policy('h2svc', head_map=HeadMap.load(path)); the "
                             "factory finds the model's own)")
        check_head_map(self.head_map, geometry)
        self.bank_id = self.head_map.bank_ids(self.ratios, self.settings.granularity)
        super().setup(geometry)

    def new_storage(self) -> HeadGroupStorage:
        return HeadGroupStorage(self.geometry, self.bank_id, len(BANK_NAMES))

    @property
    def groups(self) -> list[list[HeadGroup]]:
        return self.storage.groups

    def reset(self) -> None:
        super().reset()
        self.rule = self.settings.reindex_rule(self.geometry.max_position_embeddings)
        self.trajectory_rows: dict[tuple[int, int], torch.Tensor] = {}  # (layer, bank) -> trajectory rows
        episodic = 0
        for layer, groups in enumerate(self.groups):
            for group in groups:
                if group.bank == EPISODIC:
                    self.trajectory_rows[(layer, group.bank)] = torch.arange(episodic, episodic + group.store.rows)
                    episodic += group.store.rows
        self.trajectories = TrajectoryLanes(episodic, self.n_e, self.geometry.device)
        self.clocks_seen: set[int] = set()  # the clocks of the video units stored so far
        self.pending: list[list[int]] = [[] for _ in range(episodic)]  # evicted, not yet removed
        self.newest_unit = -1
        self.chunk_tokens = 0  # video tokens of the chunk being stored (reserved for the next one)
        self.dropped_units = 0  # FIFO drops, summed over heads
        self.evicted_age_sum = 0  # over every episodic head's evictions
        self.reindexed_heads = 0
        self.window = InstantWindow(self.instant_frames)
        self.instant = torch.empty(0, dtype=torch.long)  # the window's units, as of the last compression
        self.awaiting: list[tuple[int, int]] = []  # (lane, unit) stored, not yet in the trajectories

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
    def attend(self, layer, q, k, v, new, key_filter=None):
        cos, sin = self.store(layer, k, v, new)
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
            out[:, group.query_heads] = head_rows_attention(group_q, group.store.keys, group.store.values, visible,
                                                            self.geometry.attention_backend)
        return out

    def video_stored(self, new: NewTokens) -> None:
        self.chunk_tokens += int((new.units >= 0).sum())
        self.clocks_seen.add(stored_clock(new.clock))

    def _visible(self, layer: int, group: HeadGroup, first_unit: int | None, key_filter,
                 clock: int | None = None) -> torch.Tensor | None:
        """[n, T] keys each head of the group may see now (a pass on ``clock``), or None for all."""
        units = group.store.units
        hidden = units == PAD_UNIT if group.store.padded else None

        def hide(mask):
            nonlocal hidden
            hidden = mask if hidden is None else hidden | mask

        if group.bank == EPISODIC or first_unit is not None:
            # §3.2: FIFO drops come before the unit f is encoded (units <= f - W are out of the
            # window); STCE's evictions of this chunk are hidden until it ends
            gone = self._gone(layer, group, first_unit, (stored_clock(clock), first_unit))
            if gone is not None:
                hide(gone)
        if key_filter is not None:
            hide(~group.store.visible(key_filter, clock))
        else:
            off_clock = group.store.clock_mask(clock)  # a camera's pass sees only its clock (clocks.py)
            if off_clock is not None:
                hide(~off_clock)
        if hidden is None or not bool(hidden.any()):
            return None
        return ~hidden

    def _gone(self, layer: int, group: HeadGroup, newest: int,
              arriving: tuple[int, int] | None = None) -> torch.Tensor | None:
        """[n, T] the slots out of the group's heads: for a FIFO bank the units older than its
        window of the ``newest`` (with camera shares each camera's newest units, its share of the
        window, "Cameras"; ``arriving``: while that (clock, unit) is encoded, clocks.newest_units);
        for the episodic bank what STCE evicted during this chunk. None: nothing."""
        units = group.store.units
        if group.bank == EPISODIC:
            pending = self._pending_units(layer, group)
            return None if pending is None else (units[:, :, None] == pending[:, None, :]).any(dim=-1)
        window = self.windows[group.bank]
        if self.window:  # the window's units stay; it moves at the chunk's end (compress)
            if arriving is not None:
                return None
            past = units[0].masked_fill(torch.isin(units[0], self.instant.to(units.device)), NO_UNIT)
            lanes = group.store.clocks[0] if self.camera_shares else torch.zeros_like(past)
            return ~newest_units(past, lanes, window)[None].expand_as(units)
        if self.camera_shares:
            return ~newest_units(units[0], group.store.clocks[0], window, arriving)[None].expand_as(units)
        return (units >= 0) & (units <= newest - window)

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

    # -- arrivals -------------------------------------------------------------------------------
    def after_prefill(self, new: NewTokens) -> None:
        """§3.2 after a unit is encoded: the episodic heads link it and evict one frame each when
        they hold N_e + 1; several units (a chunked prefill) are taken one by one, in order."""
        units = new.units[new.units >= 0]
        for unit in torch.unique_consecutive(units).tolist():
            if self.window:  # it joins the trajectories when it leaves the instant window (compress)
                self.awaiting.append((self.lane_of(new.clock), unit))
            else:
                self._link(self.lane_of(new.clock), unit)
            self.newest_unit = max(self.newest_unit, unit)

    def _link(self, lane: int, unit: int) -> None:
        """§3.3 the episodic heads take ``unit`` into their trajectory on ``lane``; what they evict
        is hidden until the chunk ends."""
        if self.trajectories.heads:
            for evicted in self.trajectories.insert(lane, unit, self._frame_vectors(unit)):
                for row, gone in enumerate(evicted.tolist()):
                    if gone >= 0:
                        self.pending[row].append(gone)
                        self.evicted_age_sum += unit - gone

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
        out_of_order = self._move_window(context) if self.window else 0
        evictions = sum(len(p) for p in self.pending) - out_of_order
        freed = self._remove_evicted()
        if self.settings.reindex == "eager":
            heads = self._reindex(lambda offsets: torch.ones_like(offsets, dtype=torch.bool))
        else:
            # §5 lazy: a head re-indexes when its positions pass max_position_embeddings - margin
            heads = self._reindex(lambda offsets: offsets - 1.0 > self.rule.threshold)
        # reserved buffers (store.py): room for a chunk like this one, so that its units, appended
        # one at a time, copy no store (at most one copy a store a chunk while the windows fill)
        self.storage.reserve(self.chunk_tokens)
        self.chunk_tokens = 0
        return ChunkOutcome(evicted_tokens=freed, reindexed=heads > 0,
                            details={"stce_evictions": evictions, "freed_tokens": freed, "reindexed_heads": heads})

    def _move_window(self, context: ChunkContext) -> int:
        """The instant window after the chunk; the units that left it join the trajectories, in
        the order they came. Every head holds the window's units, so one row says which they are.
        A trajectory takes its frames in order: on a lane that all cameras share, a unit that
        leaves its camera's window after a newer one of another camera joined leaves the episodic
        heads instead (a busy camera pushes a quiet one's history out, as ``shared`` does).
        Returns how many episodic heads' evictions those are."""
        self.window.record(context.unit_frames)
        store = self.groups[0][0].store
        self.instant = self.window.units(store.units[0], store.clocks[0]).cpu()
        inside = set(self.instant.tolist())
        dropped = 0
        for lane, unit in sorted((entry for entry in self.awaiting if entry[1] not in inside), key=lambda e: e[1]):
            bank = self.trajectories.banks.get(lane)
            if bank is not None and bank.count and max(bank.frames(0)) > unit:
                for gone in self.pending:
                    gone.append(unit)
                dropped += len(self.pending)
            else:
                self._link(lane, unit)
        self.awaiting = [entry for entry in self.awaiting if entry[1] in inside]
        return dropped

    def _remove_evicted(self) -> int:
        """Drop what FIFO windows and STCE evictions hid during the chunk; returns tokens freed."""
        freed = 0
        for layer, groups in enumerate(self.groups):
            for group in groups:
                store, units = group.store, group.store.units
                gone = self._gone(layer, group, self.newest_unit)
                if group.bank != EPISODIC:
                    self.dropped_units += int(torch.unique(units[gone]).numel()) * store.rows
                if gone is None or not bool(gone.any()):
                    continue
                before = int(store.tokens_per_row().sum())
                store.compact(~gone & (units != PAD_UNIT))
                freed += before - int(store.tokens_per_row().sum())
        self.pending = [[] for _ in self.pending]
        return freed

    # -- positions ------------------------------------------------------------------------------
    def _reindex(self, due, clock: int | None = None) -> int:
        """Re-index the heads whose next offsets ``due`` picks, each clock on its own (``clock``, or
        every clock held: each camera's positions decide for themselves); returns how many heads."""
        count = self.storage.reindex(self.renumber, None if clock is None else [clock], due)
        if count:
            self.reindex_events += 1
            self.reindexed_heads += count
        return count

    def renumber(self, old: torch.Tensor, units: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
        """§5: a head's kept tokens renumbered contiguously in stream order (1D: 0..n-1; M-RoPE: each
        frame moved by one delta, frames laid back to back by the chunk-start rule). Prefix unchanged."""
        return renumber(old, units, units, self.geometry.traits.rope_layout)[0]

    def ensure_room(self, n_tokens: int, clock: int | None = None) -> None:
        self._reindex(lambda offsets: self.rule.overflows(offsets - 1.0, n_tokens), clock)
        self.rule.require(self.max_position(clock), n_tokens)

    @property
    def bounding_setting(self) -> str:
        # between chunks a head holds at most its window (FIFO banks) or N_e units (episodic)
        windows = {"w_s": self.settings.w_s, "w_w": self.settings.w_w, "n_e": self.settings.n_e}
        return max(windows, key=windows.get)

    def kept_positions(self, value: int, shape: ChunkShape) -> int:
        # §5: a head renumbers its units back to back, each keeping its own extent; the instant
        # window's come on top, a unit per frame at most (a partial chunk may end in a unit of one frame)
        return (value + self.instant_frames) * shape.unit_positions

    # -- temporary tokens -------------------------------------------------------------------------
    def _arrivals(self) -> dict[str, Any]:
        """What the arrivals since the last compression changed (besides the trajectories)."""
        arrivals = {"pending": [list(p) for p in self.pending], "newest_unit": self.newest_unit,
                    "evicted_age_sum": self.evicted_age_sum}
        if self.window:
            arrivals.update(awaiting=[list(entry) for entry in self.awaiting], instant=self.instant.tolist())
        return arrivals

    def _restore_arrivals(self, saved: dict[str, Any]) -> None:
        self.pending = [list(p) for p in saved["pending"]]
        self.newest_unit = int(saved["newest_unit"])
        self.evicted_age_sum = int(saved["evicted_age_sum"])
        if self.window:
            self.awaiting = [(int(lane), int(unit)) for lane, unit in saved.get("awaiting", [])]
            self.instant = torch.tensor(saved.get("instant", []), dtype=torch.long)

    def mark(self) -> dict[str, Any]:
        return {"lengths": super().mark(), "trajectory": self.trajectories.snapshot(), **self._arrivals()}

    def truncate(self, mark: dict[str, Any]) -> None:
        super().truncate(mark["lengths"])
        self.trajectories.restore(mark["trajectory"])
        self._restore_arrivals(mark)

    # -- accounting and snapshots -----------------------------------------------------------------
    def stats(self) -> CacheStats:
        stats = super().stats()
        evictions = self.trajectories.evictions  # evictions of every episodic head at once, one frame each
        head_evictions = evictions * self.trajectories.heads
        stats.extra = {"split": [int((self.bank_id == b).sum()) for b in range(3)],
                       "bank_names": list(BANK_NAMES),
                       "stce_evictions": evictions,
                       "score_evaluations_last_arrival": int(self.trajectories.last_evaluations.max())
                       if self.trajectories.heads else 0,
                       # the mean age (in units) of an evicted frame, over every episodic head's evictions
                       "evicted_age_mean": self.evicted_age_sum / head_evictions if head_evictions else 0.0,
                       "fifo_dropped_units": self.dropped_units,
                       **stats.extra,
                       "reindexed_heads": self.reindexed_heads,
                       "head_map": self.settings.head_map_path}
        if self.window:  # every head holds the window's units whole
            units = self.groups[0][0].store.units[0]
            stats.instant_tokens = int(torch.isin(units, self.instant.to(units.device)).sum())
        return stats

    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "trajectory": self.trajectories.state(), **self._arrivals(),
                 "dropped_units": self.dropped_units, "reindexed_heads": self.reindexed_heads}
        if self.window:
            state["instant_unit_frames"] = self.window.state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.trajectories.load(state["trajectory"])
        self.clocks_seen = {int(c) for store in self.storage.stores()
                            for c in torch.unique(store.clocks[store.units >= 0]).tolist()}
        self._restore_arrivals(state)
        self.window.load(state.get("instant_unit_frames"))
        self.dropped_units = int(state["dropped_units"])
        self.reindexed_heads = int(state["reindexed_heads"])
