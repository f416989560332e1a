"""H2SVC: a head-banked KV cache (h2svc_spec.md).

Every KV head of the model is given a bank by an offline profile of its attention (SAP, sap.py):
instantaneous heads keep the last W_s frames, short-term heads the last W_w, episodic heads up to
N_e frames chosen by STCE (stce.py). Each head really holds only its frames (banks.py), each query
head attends only to its KV head's bank, and the model is otherwise unchanged. A "frame" is a stream
unit: one frame, or a temporal patch of 2 frames on Qwen2.5-VL; W_s, W_w and N_e count units.

Arrival (§3.2), one unit at a time by default (``unit_by_unit``): while unit f is prefilled, FIFO
heads do not see units <= f - W; after it, the episodic heads link f and each evicts one frame when
it holds N_e + 1. So that a chunk that fails half-way leaves the cache as it was, evicted tokens are
only hidden until the chunk ends, and then removed (after_chunk).
"""
from __future__ import annotations

import pathlib
from typing import Any

import torch

from ..errors import ConfigError
from ..models import BUNDLED_DIR
from .attention import cached_attention, varlen_attention
from .banks import PAD_UNIT, HeadBank
from .base import CacheGeometry, CachePolicy, CacheStats, ChunkContext, NewTokens
from .rope import apply_rotary
from .sap import BANK_NAMES, EPISODIC, DEFAULT_RATIOS, HeadMap, check_ratios
from .stce import TrajectoryBank

HEAD_MAP_FILE = "h2svc_head_map.json"
HEAD_MAP_PARAMETER = "h2svc.head_map_path"
NO_UNIT = -(2 ** 62)  # fills a ragged tensor of unit ids; matches no token


def find_head_map(path: str, geometry: CacheGeometry) -> tuple[HeadMap, str]:
    """The head map for this model: ``path``, or the one bundled with a tiny model. Raises
    ConfigError naming the parameter and the profiling command when there is none or it does not fit."""
    model = geometry.model_id or "this model"
    if not path:
        bundled = BUNDLED_DIR / geometry.model_id / HEAD_MAP_FILE if geometry.model_id else None
        if bundled is None or not bundled.is_file():
            raise ConfigError(HEAD_MAP_PARAMETER, f"policy h2svc needs a head map for model '{model}' and none "
                                                  f"is bundled: run `streamcache-profile --model {model} --output "
                                                  f"head_map.json` once and set {HEAD_MAP_PARAMETER} to that file")
        path = str(bundled)
    path = str(pathlib.Path(path).expanduser())
    try:
        head_map = HeadMap.load(path)
    except ValueError as err:
        raise ConfigError(HEAD_MAP_PARAMETER, f"{err}; make one with `streamcache-profile --model {model}`") from None
    shape, ours = (head_map.num_layers, head_map.num_kv_heads), (geometry.num_layers, geometry.num_kv_heads)
    same_model = head_map.model_id == geometry.model_id or head_map.config_hash == geometry.config_hash
    if shape != ours or not same_model:
        raise ConfigError(HEAD_MAP_PARAMETER, f"head map '{path}' was profiled on model '{head_map.model_id}' "
                                              f"({shape[0]} layers x {shape[1]} KV heads); this node runs "
                                              f"'{model}' ({ours[0]} x {ours[1]}): run `streamcache-profile "
                                              f"--model {model}` for it")
    return head_map, path


class H2svcPolicy(CachePolicy):
    name = "h2svc"

    def __init__(self, w_s: int = 4, w_w: int = 16, n_e: int = 64, ratios: list = list(DEFAULT_RATIOS),  # noqa: B006
                 head_map_path: str = "", granularity: str = "head", frame_vector: str = "mean",
                 unit_by_unit: bool = True, reindex: str = "lazy", reindex_margin: int = 1024,
                 budget_tokens: int = 0):
        # budget_tokens is accepted and unused: H2SVC's budget is its windows and N_e
        super().__init__(0, reindex, reindex_margin)
        if int(w_s) < 1 or int(w_w) < 1:
            raise ValueError(f"w_s and w_w must be >= 1 unit, got {w_s} and {w_w}")
        if int(n_e) < 2:
            raise ValueError(f"n_e must be >= 2 units (the two endpoints are never evicted), got {n_e}")
        if granularity not in ("head", "layer"):
            raise ValueError(f"granularity must be 'head' or 'layer', got '{granularity}'")
        if frame_vector not in ("mean", "flatten"):
            raise ValueError(f"frame_vector must be 'mean' or 'flatten', got '{frame_vector}'")
        self.windows = (int(w_s), int(w_w))  # FIFO length of banks 0 and 1, in units
        self.n_e = int(n_e)
        self.ratios = check_ratios(ratios)
        self.head_map_path = str(head_map_path)
        self.granularity = granularity
        self.frame_vector = frame_vector
        self.prefill_unit_by_unit = bool(unit_by_unit)
        self.head_map: HeadMap | None = None
        self.bank_id: torch.Tensor | None = None  # [L, Hkv]

    def config_dict(self) -> dict[str, Any]:
        return {**super().config_dict(), "w_s": self.windows[0], "w_w": self.windows[1], "n_e": self.n_e,
                "ratios": list(self.ratios), "granularity": self.granularity, "frame_vector": self.frame_vector,
                "unit_by_unit": self.prefill_unit_by_unit,
                "head_map": self.head_map.digest() if self.head_map else ""}

    # -- life cycle -----------------------------------------------------------------------------
    def setup(self, geometry: CacheGeometry) -> None:
        self.head_map, self.head_map_path = find_head_map(self.head_map_path, geometry)
        self.bank_id = self.head_map.bank_ids(self.ratios, self.granularity)
        super().setup(geometry)

    def reset(self) -> None:
        g = self.geometry
        self.banks: list[list[HeadBank]] = []
        self.trajectory_rows: dict[tuple[int, int], torch.Tensor] = {}  # (layer, kind) -> rows
        episodic = 0
        for layer in range(g.num_layers):
            banks = []
            for kind in range(3):
                heads = [h for h in range(g.num_kv_heads) if int(self.bank_id[layer, h]) == kind]
                if heads:
                    banks.append(HeadBank(kind, heads, g))
                    if kind == EPISODIC:
                        self.trajectory_rows[(layer, kind)] = torch.arange(episodic, episodic + len(heads))
                        episodic += len(heads)
            self.banks.append(banks)
        self.trajectory = TrajectoryBank(episodic, self.n_e, g.device)
        self.pending: list[list[int]] = [[] for _ in range(episodic)]  # evicted, not yet removed
        self.newest_unit = -1
        self.dropped_units = 0  # FIFO drops, summed over heads
        self.evicted_age_sum = 0
        self.reindex_events = 0
        self.reindexed_heads = 0

    # -- forward pass ---------------------------------------------------------------------------
    def append(self, layer, k, v, new):
        self._store(layer, k, v, new)

    def attend(self, layer, q, k, v, new, key_filter=None):
        cos, sin = self._store(layer, k, v, new)
        group = self.geometry.group_size
        q = apply_rotary(q, cos.repeat_interleave(group, 0)[None], sin.repeat_interleave(group, 0)[None])
        video = new.units[new.units >= 0]
        first_unit = int(video.min()) if video.numel() else None
        out = torch.empty_like(q)
        for bank in self.banks[layer]:
            visible = self._visible(layer, bank, first_unit, key_filter)
            out[:, bank.query_heads] = self._bank_attention(q[:, bank.query_heads], bank, visible)
        return out

    def _store(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               new: NewTokens) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens to every bank of the layer, each KV head at its own next offset,
        keys rotated; returns the cos/sin [Hkv, Q, D] they were rotated with (for the queries)."""
        g = self.geometry
        banks = self.banks[layer]
        offsets = torch.empty(g.num_kv_heads, dtype=torch.float32, device=k.device)
        for bank in banks:
            offsets[bank.heads] = bank.next_offsets().to(k.device)
        # h2svc_spec §5: positions are per KV head (they differ once heads re-index on their own)
        positions = new.rel_positions.to(k.device)[None] + offsets[:, None, None]  # [Hkv, axes, Q]
        hkv, axes, q_len = positions.shape
        cos, sin = g.rotary.cos_sin(positions.transpose(0, 1).reshape(axes, hkv * q_len), k.dtype)
        cos, sin = cos.view(hkv, q_len, -1), sin.view(hkv, q_len, -1)
        k = apply_rotary(k, cos[None], sin[None])
        for bank in banks:
            bank.append(k[:, bank.heads], v[:, bank.heads], positions[bank.heads], new.units)
        return cos, sin

    def _visible(self, layer: int, bank: HeadBank, first_unit: int | None, key_filter) -> torch.Tensor | None:
        """[n, T] keys each head of the bank may see now, or None for all of them."""
        units = bank.units
        hidden = units == PAD_UNIT if bank.padded else None

        def hide(mask):
            nonlocal hidden
            hidden = mask if hidden is None else hidden | mask

        if bank.kind != EPISODIC and first_unit is not None:
            # §3.2: FIFO drops come before the unit is encoded: units <= f - W are out of the window
            hide((units >= 0) & (units <= first_unit - self.windows[bank.kind]))
        if bank.kind == EPISODIC:
            pending = self._pending_units(layer, bank)
            if pending is not None:
                hide((units[:, :, None] == pending[:, None, :]).any(dim=-1))
        if key_filter is not None:
            hide((units >= 0) & ~torch.isin(units, key_filter.to(units.device)))
        if hidden is None or not bool(hidden.any()):
            return None
        return ~hidden

    def _pending_units(self, layer: int, bank: HeadBank) -> torch.Tensor | None:
        """[n, k] units evicted from each episodic head during this chunk (still stored), or None."""
        rows = self.trajectory_rows[(layer, bank.kind)].tolist()
        lists = [self.pending[r] for r in rows]
        width = max(len(p) for p in lists)
        if width == 0:
            return None
        table = torch.full((len(rows), width), NO_UNIT, dtype=torch.long)
        for i, p in enumerate(lists):
            table[i, :len(p)] = torch.tensor(p, dtype=torch.long)
        return table.to(bank.units.device)

    def _bank_attention(self, q: torch.Tensor, bank: HeadBank, visible: torch.Tensor | None) -> torch.Tensor:
        """§4: the query heads of a bank's KV heads against that bank only (option A: SDPA with an
        explicit bottom-right mask; on CUDA with flash-attn, flash per bank or varlen (option B)
        when heads see different keys)."""
        flash = (self.geometry.attention_backend == "flash" and q.is_cuda
                 and q.dtype in (torch.float16, torch.bfloat16))
        if flash and visible is not None:
            return varlen_attention(q, bank.keys, bank.values, visible)
        return cached_attention(q, bank.keys, bank.values, visible, "flash" if flash else "sdpa")

    # -- arrivals -------------------------------------------------------------------------------
    def after_prefill(self, new: NewTokens) -> None:
        """§3.2 after a unit is encoded: the episodic heads link it and evict one frame each when
        they hold N_e + 1; several units (a chunked prefill) are taken one by one, in order."""
        units = new.units[new.units >= 0]
        for unit in torch.unique_consecutive(units).tolist():
            if self.trajectory.heads:
                evicted = self.trajectory.insert(unit, self._frame_vectors(unit))
                for row, gone in enumerate(evicted.tolist()):
                    if gone >= 0:
                        self.pending[row].append(gone)
                        self.evicted_age_sum += unit - gone
            self.newest_unit = max(self.newest_unit, unit)

    def _frame_vectors(self, unit: int) -> torch.Tensor:
        """[episodic heads, D] (or n_f·D for 'flatten'): §3.3 V̄ of the unit's Value vectors, fp32."""
        parts = []
        for layer, banks in enumerate(self.banks):
            for bank in banks:
                if bank.kind != EPISODIC:
                    continue
                values = bank.values[0, :, bank.unit_columns(unit)].float()  # [n, n_f, D]
                parts.append(values.mean(dim=1) if self.frame_vector == "mean" else values.reshape(bank.rows, -1))
        return torch.cat(parts)

    def after_chunk(self, context: ChunkContext) -> dict[str, Any]:
        evictions = sum(len(p) for p in self.pending)
        freed = self._remove_evicted()
        report = {"stce_evictions": evictions, "freed_tokens": freed}
        g = self.geometry
        if self.reindex_mode == "eager":
            report["reindexed_heads"] = self._reindex(lambda offsets: torch.ones_like(offsets, dtype=torch.bool))
        else:
            # §5 lazy: a head re-indexes when its positions pass max_position_embeddings - margin
            limit = g.max_position_embeddings - self.reindex_margin
            report["reindexed_heads"] = self._reindex(lambda offsets: offsets - 1.0 > limit)
        return report

    def _remove_evicted(self) -> int:
        """Drop what FIFO windows and STCE evictions hid during the chunk; returns tokens freed."""
        freed = 0
        for layer, banks in enumerate(self.banks):
            for bank in banks:
                units = bank.units
                if bank.kind == EPISODIC:
                    pending = self._pending_units(layer, bank)
                    gone = (units[:, :, None] == pending[:, None, :]).any(dim=-1) if pending is not None else None
                else:
                    gone = (units >= 0) & (units <= self.newest_unit - self.windows[bank.kind])
                    self.dropped_units += int(torch.unique(units[gone]).numel()) * bank.rows
                if gone is None or not bool(gone.any()):
                    continue
                keep = ~gone & (units != PAD_UNIT)
                before = int(bank.tokens_per_head().sum())
                bank.compact(keep)
                freed += before - int(bank.tokens_per_head().sum())
        self.pending = [[] for _ in self.pending]
        return freed

    # -- positions ------------------------------------------------------------------------------
    def _reindex(self, select) -> int:
        """Re-index the heads for which ``select(next_offsets [n]) -> bool [n]`` holds."""
        count = 0
        for banks in self.banks:
            for bank in banks:
                rows = torch.nonzero(select(bank.next_offsets())).flatten()
                if rows.numel():
                    bank.reindex_rows(rows, self.geometry.rotary)
                    count += rows.numel()
        if count:
            self.reindex_events += 1
            self.reindexed_heads += count
        return count

    def max_position(self) -> float:
        return max((float(b.next_offsets().max()) - 1.0 for banks in self.banks for b in banks if b.rows),
                   default=-1.0)

    def ensure_room(self, n_tokens: int) -> None:
        limit = self.geometry.max_position_embeddings
        self._reindex(lambda offsets: offsets - 1.0 + n_tokens >= limit)

    # -- temporary tokens -------------------------------------------------------------------------
    def mark(self) -> dict[str, Any]:
        return {"lengths": [[len(b) for b in banks] for banks in self.banks],
                "trajectory": self.trajectory.snapshot(), "pending": [list(p) for p in self.pending],
                "newest_unit": self.newest_unit, "evicted_age_sum": self.evicted_age_sum}

    def truncate(self, mark: dict[str, Any]) -> None:
        for banks, lengths in zip(self.banks, mark["lengths"]):
            for bank, length in zip(banks, lengths):
                bank.truncate(length)
        if self.trajectory.arrivals != mark["trajectory"]["arrivals"]:
            self.trajectory.restore(mark["trajectory"])
        self.pending = [list(p) for p in mark["pending"]]
        self.newest_unit = mark["newest_unit"]
        self.evicted_age_sum = mark["evicted_age_sum"]

    # -- accounting and snapshots -----------------------------------------------------------------
    def stats(self) -> CacheStats:
        g = self.geometry
        layer_totals, bank_tokens, held = [], [0, 0, 0], []
        for banks in self.banks:
            total = 0
            for bank in banks:
                tokens = int(bank.tokens_per_head().sum())
                total += tokens
                bank_tokens[bank.kind] += tokens
                held.append(bank.units.flatten())
            layer_totals.append(total)
        units = torch.unique(torch.cat(held)) if held else torch.empty(0, dtype=torch.long)
        evictions = self.trajectory.evictions
        return CacheStats(
            policy=self.name,
            layer_tokens=[round(t / g.num_kv_heads) for t in layer_totals],  # mean over a layer's KV heads
            kv_tokens=round(sum(layer_totals) / g.num_kv_heads),
            kv_bytes=sum(b.nbytes for banks in self.banks for b in banks),
            budget_tokens=0,
            units=[int(u) for u in units.tolist() if u >= 0],
            max_position=self.max_position(),
            reindex_events=self.reindex_events,
            bank_tokens=bank_tokens,
            extra={"split": [int((self.bank_id == b).sum()) for b in range(3)],
                   "bank_names": list(BANK_NAMES),
                   "stce_evictions": evictions,
                   "score_evaluations_last_arrival": int(self.trajectory.last_evaluations.max())
                   if self.trajectory.heads else 0,
                   "evicted_age_mean": self.evicted_age_sum / evictions if evictions else 0.0,
                   "fifo_dropped_units": self.dropped_units,
                   "reindexed_heads": self.reindexed_heads,
                   "head_map": self.head_map_path},
        )

    def state_dict(self) -> dict[str, Any]:
        return {"bank_id": self.bank_id.tolist(), "banks": [[b.state() for b in banks] for banks in self.banks],
                "trajectory": self.trajectory.state(), "pending": [list(p) for p in self.pending],
                "newest_unit": self.newest_unit, "dropped_units": self.dropped_units,
                "evicted_age_sum": self.evicted_age_sum, "reindex_events": self.reindex_events,
                "reindexed_heads": self.reindexed_heads}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["bank_id"] != self.bank_id.tolist():
            raise ValueError("the snapshot's heads are split into other banks")
        self.reset()
        for banks, saved in zip(self.banks, state["banks"], strict=True):
            for bank, bank_state in zip(banks, saved, strict=True):
                bank.load(bank_state, self.geometry)
        self.trajectory.load(state["trajectory"])
        self.pending = [list(p) for p in state["pending"]]
        self.newest_unit = int(state["newest_unit"])
        self.dropped_units = int(state["dropped_units"])
        self.evicted_age_sum = int(state["evicted_age_sum"])
        self.reindex_events = int(state["reindex_events"])
        self.reindexed_heads = int(state["reindexed_heads"])
