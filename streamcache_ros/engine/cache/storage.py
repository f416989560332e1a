"""Where a policy keeps its tokens, apart from what it decides to keep (docs/architecture.md, "The
cache-policy interface").

One interface, two shapes: ``LayerStorage`` holds one shared ``KVStore`` per layer (every KV head of
a layer holds the same tokens: full, fifo, uniform, hermes); ``HeadGroupStorage`` holds each layer's
KV heads in groups by bank, one per-row store each, so every head keeps its own tokens (H2SVC). The
storage stores new tokens at its own positions, and answers what every policy needs answered the
same way: a mark and a truncate for temporary tokens, what it holds (stats, unit tokens), its state
for a snapshot, and re-indexing. A policy only says what stays.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .types import CacheGeometry, CacheStats, NewTokens, UnitTokens
from .rope import apply_rotary
from .store import KVStore, Renumber
from .units import PAD_UNIT, PREFIX_UNIT

# (layer, positions recorded for its new tokens [axes, Q], the tokens) -> the positions they are rotated at
RotateAt = Callable[[int, torch.Tensor, NewTokens], torch.Tensor]
# a store's next offsets on a clock [rows] -> the rows that re-index [rows] bool
Due = Callable[[torch.Tensor], torch.Tensor]


def held_tokens(store: KVStore) -> int:
    """Tokens a store holds over its rows, padding excluded."""
    return len(store) * store.rows if store.shared else int(store.tokens_per_row().sum())


class CacheStorage(abc.ABC):
    """The KV tensors of every layer, and what is asked of them whatever the policy."""

    banks = 0  # banks the heads are split into (0: none)

    def __init__(self, geometry: CacheGeometry):
        self.geometry = geometry

    @abc.abstractmethod
    def layer_stores(self) -> list[list[tuple[int, KVStore]]]:
        """Per layer, the stores holding its KV heads, each with its bank (-1: no banks)."""

    @abc.abstractmethod
    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               new: NewTokens) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new k [1,Hkv,Q,D] / v after what the layer holds on ``new.clock``, keys rotated;
        returns the cos/sin they were rotated with, for the queries of the same tokens."""

    @abc.abstractmethod
    def state(self) -> dict[str, Any]:
        """The tokens held, copied, as a snapshot stores them."""

    @abc.abstractmethod
    def load(self, state: dict[str, Any]) -> None:
        """Hold the tokens of ``state``; a ValueError where it does not fit this model or split."""

    def stores(self) -> list[KVStore]:
        return [store for entries in self.layer_stores() for _, store in entries]

    # -- temporary tokens -----------------------------------------------------------------------------
    def mark(self) -> list[int]:
        return [len(store) for store in self.stores()]

    def truncate(self, mark: list[int]) -> None:
        for store, length in zip(self.stores(), mark):
            store.truncate(length)

    def reserve(self, extra: int) -> None:
        """Room for ``extra`` more tokens in every store (KVStore.reserve)."""
        for store in self.stores():
            store.reserve(extra)

    # -- positions ------------------------------------------------------------------------------------
    def max_position(self, clock: int | None = None) -> float:
        """The largest position on ``clock`` (None: of every token), over every store."""
        return max((store.next_offset(clock) - 1.0 for store in self.stores()), default=-1.0)

    def reindex(self, renumber: Renumber, clocks: list[int] | None = None, due: Due | None = None) -> int:
        """Renumber the kept tokens on ``clocks`` (None: every clock) and turn their keys by the delta
        (KVStore.reindex). ``due``: only the rows it picks by their own next offsets, clock by clock
        (docs/h2svc.md §5: a head re-indexes on its own); None: every row. Returns the rows moved."""
        moved = 0
        for store in self.stores():
            if due is None:
                store.reindex(self.geometry.rotary, renumber, clocks=clocks)
                moved += store.rows
                continue
            if clocks is None:
                video = (store.units != PREFIX_UNIT) & (store.units != PAD_UNIT)
                ticks = torch.unique(store.clocks[video]).tolist() or [None]
            else:
                ticks = clocks
            rows_moved = set()
            for clock in ticks:
                rows = torch.nonzero(due(store.next_offsets(clock))).flatten()
                if rows.numel():
                    store.reindex(self.geometry.rotary, renumber, rows, None if clock is None else [clock])
                    rows_moved.update(rows.tolist())
            moved += len(rows_moved)
        return moved

    # -- accounting -----------------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        """Tokens and bytes held (a layer's tokens: the mean over its KV heads), per bank, and the
        units held; the policy fills in its own figures."""
        heads = self.geometry.num_kv_heads
        layer_totals = [sum(held_tokens(store) for _, store in entries) for entries in self.layer_stores()]
        bank_tokens = [0] * self.banks
        for entries in self.layer_stores():
            for bank, store in entries:
                if bank >= 0:
                    bank_tokens[bank] += held_tokens(store)
        stores = self.stores()
        units = torch.unique(torch.cat([s.units.flatten() for s in stores])) if stores else torch.empty(0)
        return CacheStats(layer_tokens=[round(t / heads) for t in layer_totals],
                          kv_tokens=round(sum(layer_totals) / heads), kv_bytes=sum(s.nbytes for s in stores),
                          units=[int(u) for u in units.tolist() if u >= 0], max_position=self.max_position(),
                          bank_tokens=bank_tokens, extra={"kv_reserved_bytes": sum(s.reserved_bytes for s in stores)})

    def held_units(self) -> list[int]:
        """The video units with a token held anywhere, ascending: what ``stats().units`` lists,
        without the rest of the accounting (the policy asks before and after every chunk)."""
        rows = [s.units.flatten() for s in self.stores()]
        video = torch.cat(rows) if rows else torch.empty(0, dtype=torch.long)
        video = video[video >= 0]
        if not video.numel():
            return []
        seen = torch.zeros(int(video.max()) + 1, dtype=torch.bool, device=video.device)
        seen[video] = True
        return torch.nonzero(seen).flatten().tolist()

    def unit_tokens(self) -> UnitTokens:
        """Tokens held per video unit and row (a layer's shared store is one row, a head one)."""
        rows = [row for store in self.stores() for row in (store.units[None] if store.shared else store.units)]
        rows_per_layer = sum(1 if store.shared else store.rows for _, store in self.layer_stores()[0])
        return UnitTokens.of(rows, rows_per_layer=rows_per_layer)


class LayerStorage(CacheStorage):
    """One shared store per layer, each layer on its own positions. ``rotate_at``: where a layer's
    new keys are rotated, given the positions recorded for them (HERMES's D1 rotates every layer at
    layer 0's); None: at those positions."""

    def __init__(self, geometry: CacheGeometry, rotate_at: RotateAt | None = None):
        super().__init__(geometry)
        self.layers = [KVStore.empty(geometry) for _ in range(geometry.num_layers)]
        self.rotate_at = rotate_at

    def layer_stores(self) -> list[list[tuple[int, KVStore]]]:
        return [[(-1, store)] for store in self.layers]

    def append(self, layer, k, v, new):
        store = self.layers[layer]
        positions = new.rel_positions.to(k.device) + store.next_offset(new.clock)
        rotated = positions if self.rotate_at is None else self.rotate_at(layer, positions, new)
        cos, sin = self.geometry.rotary.cos_sin(rotated, k.dtype)
        store.append(apply_rotary(k, cos, sin), v, positions, new.units, new.chunks, new.clock)
        return cos, sin

    def state(self) -> dict[str, Any]:
        return {"layers": [store.state() for store in self.layers]}

    def load(self, state: dict[str, Any]) -> None:
        layers = state["layers"]
        if len(layers) != self.geometry.num_layers:
            raise ValueError(f"snapshot has {len(layers)} layers, the model has {self.geometry.num_layers}")
        for store, saved in zip(self.layers, layers):
            store.load(saved, self.geometry)


@dataclass
class HeadGroup:
    """The KV heads of one layer in one bank: their store, one row per head, and the query heads
    that read them."""

    bank: int
    store: KVStore
    query_heads: torch.Tensor
    span: slice | None = None  # the KV heads as a slice, when they are consecutive

    def kv_rows(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """The group's KV heads of ``x`` along ``dim``: a view when they are consecutive."""
        if self.span is not None:
            return x.narrow(dim, self.span.start, self.span.stop - self.span.start)
        return x.index_select(dim, self.store.heads.to(x.device))


class HeadGroupStorage(CacheStorage):
    """Each layer's KV heads grouped by their bank (``bank_id`` [L, Hkv]), every head a row with its
    own tokens and positions (docs/h2svc.md §4, §5)."""

    def __init__(self, geometry: CacheGeometry, bank_id: torch.Tensor, banks: int):
        super().__init__(geometry)
        self.bank_id = bank_id
        self.banks = banks
        g = geometry
        self.groups: list[list[HeadGroup]] = []
        for layer in range(g.num_layers):
            groups = []
            for bank in range(banks):
                heads = [h for h in range(g.num_kv_heads) if int(bank_id[layer, h]) == bank]
                if heads:
                    query_heads = torch.tensor([h * g.group_size + i for h in heads for i in range(g.group_size)],
                                               dtype=torch.long, device=g.device)
                    span = slice(heads[0], heads[-1] + 1) if heads[-1] - heads[0] == len(heads) - 1 else None
                    groups.append(HeadGroup(bank, KVStore.empty(g, heads, shared=False), query_heads, span))
            self.groups.append(groups)

    def layer_stores(self) -> list[list[tuple[int, KVStore]]]:
        return [[(group.bank, group.store) for group in groups] for groups in self.groups]

    def append(self, layer, k, v, new):
        g = self.geometry
        groups = self.groups[layer]
        if len(groups) == 1:  # one bank in this layer (a map that puts every head in one)
            offsets = groups[0].store.next_offsets(new.clock).to(k.device)
        else:
            offsets = torch.empty(g.num_kv_heads, dtype=torch.float32, device=k.device)
            for group in groups:
                offsets[group.store.heads] = group.store.next_offsets(new.clock).to(k.device)
        # docs/h2svc.md §5: positions are per KV head (they differ once heads re-index on their own)
        positions = new.rel_positions.to(k.device)[None] + offsets[:, None, None]  # [Hkv, axes, Q]
        hkv, axes, q_len = positions.shape
        cos, sin = g.rotary.cos_sin(positions.transpose(0, 1).reshape(axes, hkv * q_len), k.dtype)
        cos, sin = cos.view(hkv, q_len, -1), sin.view(hkv, q_len, -1)
        k = apply_rotary(k, cos[None], sin[None])
        # views where a group's heads are consecutive: a copy of each less, per layer and forward,
        # of H2SVC's unit-by-unit prefill (docs/performance.md "H2SVC's prefill")
        for group in groups:
            group.store.append(group.kv_rows(k, 1), group.kv_rows(v, 1), group.kv_rows(positions, 0), new.units,
                               new.chunks, new.clock)
        return cos, sin

    def state(self) -> dict[str, Any]:
        return {"bank_id": self.bank_id.tolist(),
                "groups": [[{"bank": g.bank, **g.store.state()} for g in groups] for groups in self.groups]}

    def load(self, state: dict[str, Any]) -> None:
        if state["bank_id"] != self.bank_id.tolist():
            raise ValueError("the snapshot's heads are split into other banks")
        for groups, saved in zip(self.groups, state["groups"], strict=True):
            for group, group_state in zip(groups, saved, strict=True):
                if group_state["bank"] != group.bank:
                    raise ValueError(f"snapshot group of bank {group_state['bank']} where this cache has {group.bank}")
                group.store.load(group_state, self.geometry)
