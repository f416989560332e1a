"""Layer-managed policies (full, fifo, uniform, hermes): every KV head of a layer holds the same
tokens (``LayerStorage``: one store per layer, positions per layer); ``evict`` decides what each
layer keeps."""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import torch

from .attention import cached_attention
from .base import CachePolicy
from .types import CacheStats, ChunkContext, ChunkOutcome, ChunkShape, NewTokens
from .clocks import clocks_held, stored_clock
from .instant import InstantWindow
from .positions import MROPE_MODES, ReindexSettings, renumber
from .rope import apply_rotary
from .rows import QueryRows
from .settings import GENERAL, setting
from .storage import LayerStorage
from .store import KVStore
from .units import PREFIX_UNIT, SUMMARY_UNIT


@dataclass(frozen=True)
class LayerwiseSettings(ReindexSettings):
    mrope_reindex: str = setting("shift", "M-RoPE models (Qwen2.5-VL): how kept tokens are renumbered: shift (each "
                                          "chunk moved by one delta, its t/h/w geometry kept) | dense_rank (the "
                                          "reference: a dense rank per axis)",
                                 choices=MROPE_MODES, aliases=("qwen_reindex",))


def budget_setting(default: int = 6000):
    """The general ``budget_tokens`` parameter, for a policy that keeps a token budget."""
    return setting(default, "Video tokens kept per layer (the system prompt is kept on top); must hold at least "
                            "one frame", low=1, scope=GENERAL)


class LayerwisePolicy(CachePolicy):
    """Per-layer storage with per-layer positions."""

    settings_class = LayerwiseSettings

    def new_storage(self) -> LayerStorage:
        return LayerStorage(self.geometry, self.rotary_positions)

    @property
    def layers(self) -> list[KVStore]:
        return self.storage.layers

    def reset(self) -> None:
        super().reset()
        self.rule = self.settings.reindex_rule(self.geometry.max_position_embeddings)
        self.dense_fallbacks = 0  # shift re-indexes that did not fit under the threshold and were ranked densely
        self.arriving: int | None = None  # the clock of the chunk being stored (until it is compressed)
        self.window = InstantWindow(self.instant_frames)

    def attend(self, layer, q, k, v, new, key_filter=None):
        cos, sin = self.store(layer, k, v, new)
        store = self.layers[layer]
        q = apply_rotary(q, cos, sin)
        if isinstance(key_filter, QueryRows):
            return cached_attention(q, store.keys, store.values, query_mask=key_filter.mask(store, new.clock),
                                    query_rows=key_filter.rows)
        # a pass on a camera's clock sees only the prefix and that camera's tokens (clocks.py)
        key_mask = store.clock_mask(new.clock) if key_filter is None else store.visible(key_filter, new.clock)
        if self.probe is not None:
            self.probe.observe(layer, store, q, key_mask)
        return cached_attention(q, store.keys, store.values, key_mask, self.geometry.attention_backend)

    def video_stored(self, new: NewTokens) -> None:
        self.arriving = stored_clock(new.clock)

    def rotary_positions(self, layer: int, positions: torch.Tensor, new: NewTokens) -> torch.Tensor:
        """Where ``layer``'s new tokens are rotated: at the positions recorded for them."""
        return positions

    def compress(self, context: ChunkContext) -> ChunkOutcome:
        self.window.record(context.unit_frames)
        before = self.clock_counts()
        outcome = self.evict(context)
        due = self.due_clocks(self.changed_clocks(before))
        if due:
            self.reindex(clocks=due)
            outcome.reindexed = True
        self.arriving = None
        self.window.forget(self.layers[0].units)
        return outcome

    def evict(self, context: ChunkContext) -> ChunkOutcome:
        """Select what each layer keeps, leaving ``instant_units`` whole. The baseline ``full``
        keeps everything."""
        return ChunkOutcome()

    # -- the instant window (instant.py) ------------------------------------------------------------
    def instant_units(self) -> torch.Tensor:
        """The units in the instant window (ascending; empty when it is off). Every layer holds
        them whole, so layer 0 says which they are."""
        store = self.layers[0]
        return self.window.units(store.units, store.clocks)

    @contextlib.contextmanager
    def instant_aside(self):
        """Take the instant window's tokens out of every layer while the policy decides on the
        past, and put them back after, at their positions, rotated as they were; yields whether
        any were taken. Back at the end of each layer, so each camera's tokens stay in arrival
        order (HERMES scores each camera on its own, so no order between cameras is read)."""
        instant = self.instant_units()
        if not instant.numel():
            yield False
            return
        aside = []
        for store in self.layers:
            mine = torch.isin(store.units, instant.to(store.units.device))
            aside.append(store.select(torch.nonzero(mine).flatten()))
            store.keep(torch.nonzero(~mine).flatten())
        try:
            yield True
        finally:
            for store, side in zip(self.layers, aside):
                clocks = side.clocks.tolist()
                start = 0
                for end in range(1, len(clocks) + 1):  # a run of one clock at a time: append takes one
                    if end == len(clocks) or clocks[end] != clocks[start]:
                        store.append(side.keys[:, :, start:end], side.values[:, :, start:end],
                                     side.positions[:, start:end], side.units[start:end], side.chunks[start:end],
                                     clocks[start])
                        start = end

    def prefix_len(self) -> int:
        return int((self.layers[0].units == PREFIX_UNIT).sum().item())

    @property
    def camera_shares(self) -> bool:
        """Each camera keeps its own share of the budget (``camera_budget_share: equal``, clocks.py)."""
        return getattr(self.settings, "camera_budget_share", "shared") == "equal"

    def lanes(self, store: KVStore) -> list[int]:
        """The clocks of a layer's video tokens that share out its budget: several only with
        ``camera_budget_share: equal`` and more than one camera in memory."""
        held = clocks_held(store.units, store.clocks)
        return held if self.camera_shares and len(held) > 1 else held[:1]

    # -- positions ------------------------------------------------------------------------------
    def clock_ids(self) -> list[int]:
        """The clocks of the video held in any layer (ascending)."""
        return sorted({c for s in self.layers for c in clocks_held(s.units, s.clocks)})

    def clock_counts(self) -> dict[int, int]:
        """Video tokens (and summaries) held per clock, over every layer."""
        counts: dict[int, int] = {}
        for store in self.layers:
            ids, held = torch.unique(store.clocks[store.units != PREFIX_UNIT], return_counts=True)
            for clock, n in zip(ids.tolist(), held.tolist()):
                counts[clock] = counts.get(clock, 0) + n
        return counts

    def changed_clocks(self, before: dict[int, int]) -> list[int]:
        """The clocks a compression changed: the chunk's own, and any that lost tokens (``before``:
        ``clock_counts`` before it); every clock when no chunk was stored (a direct call)."""
        after = self.clock_counts()
        if self.arriving is None:
            return sorted(after)
        return sorted({self.arriving} | {c for c in after if after[c] != before.get(c, 0)})

    def due_clocks(self, changed: list[int] | None = None) -> list[int]:
        """The clocks a compression re-indexes (every camera's clock decides for itself,
        clocks.py): eager, those it ``changed`` (default: all), as a camera alone is re-indexed
        after each of its own compressions; lazy, each whose own positions passed the threshold."""
        if self.rule.mode == "eager":
            return self.clock_ids() if changed is None else list(changed)
        return [c for c in self.clock_ids() if self.rule.due(self.max_position(c))]

    def ensure_room(self, n_tokens: int, clock: int | None = None) -> None:
        if clock is not None:
            crowded = [clock] if self.rule.overflows(self.max_position(clock), n_tokens) else []
        else:  # a pass after every position: every clock that would leave no room
            crowded = [c for c in self.clock_ids() if self.rule.overflows(self.max_position(c), n_tokens)]
            if not crowded and self.rule.overflows(self.max_position(), n_tokens):
                crowded = None  # (the prefix alone)
        if crowded != []:
            self.reindex(room=n_tokens, clocks=crowded)
            self.rule.require(self.max_position(clock), n_tokens)

    @property
    def bounding_setting(self) -> str:
        return "budget_tokens" if self.settings_class.takes("budget_tokens") else ""

    def kept_positions(self, value: int, shape: ChunkShape) -> int:
        # 1D renumbers the kept tokens 0..n-1: one position each. M-RoPE shifts each kept chunk back
        # to back, keeping its extent: a budget in whole chunks (and a partial one) by the
        # chunk-start rule, never more than one position per token (a shift that would take more
        # ranks densely, positions.renumber). The instant window's tokens come on top, a unit per
        # frame at most (a partial chunk may end in a unit of one frame)
        value += self.instant_frames * shape.unit_tokens
        chunks = -(-value // shape.chunk_tokens) + 1
        return min(value, chunks * shape.chunk_positions)

    def reindex(self, room: int = 0, clocks: list[int] | None = None) -> None:
        """Renumber every layer's kept tokens compactly (each clock on its own; ``clocks``: only
        those) and rotate their keys by the delta, leaving ``room`` positions free below the
        model's range."""
        self.storage.reindex(functools.partial(self.renumber, room=room), clocks)
        self.reindex_events += 1

    def renumber(self, old: torch.Tensor, units: torch.Tensor, chunks: torch.Tensor, room: int = 0) -> torch.Tensor:
        """New positions of one layer's kept tokens (positions.renumber): a chunk moves as one group,
        a summary token is a group of its own (prefix tokens have chunk id -1). An M-RoPE shift must
        end under the lazy threshold and leave ``room`` positions in the range, or ranks densely."""
        groups = torch.where(units == SUMMARY_UNIT, -2 - torch.arange(len(units), device=units.device), chunks)
        limit = min(self.rule.threshold, self.rule.limit - 1 - room)
        new, fell_back = renumber(old, units, groups, self.geometry.traits.rope_layout,
                                  self.settings.mrope_reindex, limit=limit)
        self.dense_fallbacks += int(fell_back)
        return new

    # -- accounting and snapshots -----------------------------------------------------------------
    def stats(self) -> CacheStats:
        stats = super().stats()
        stats.extra = {"dense_fallbacks": self.dense_fallbacks, **stats.extra}
        if self.window:
            stats.instant_tokens = int(torch.isin(self.layers[0].units, self.instant_units()).sum())
        return stats

    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "dense_fallbacks": self.dense_fallbacks}
        if self.window:
            state["instant_unit_frames"] = self.window.state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.dense_fallbacks = int(state.get("dense_fallbacks", 0))
        self.window.load(state.get("instant_unit_frames"))
