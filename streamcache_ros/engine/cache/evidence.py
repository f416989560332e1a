"""What an answer drew on: the attention mass its tokens put on each stream unit, per layer
(docs/interfaces.md "Time windows and evidence").

While a question is answered the session lends the policy an ``AttentionMass``; every policy's
``attend`` hands it the store it attends over, the rotated queries and the mask it used, once per
store (a layer, or an H2SVC bank's heads of a layer). The weights come from the one KV store class
(``KVStore.attention_mass``), so every policy, H2SVC's per-head stores of different lengths
included, is measured the same way. Only the layers asked for are computed, and only the newest
query of each forward: the question's last token (which chose the first answer token) and each
answer token fed back (which chose the next), the queries that produced the answer.
"""
from __future__ import annotations

from typing import Iterable

import torch

from .store import KVStore
from .units import PAD_UNIT

# unit id -> column: the sentinels (PAD_UNIT = -4 ... PREFIX_UNIT = -1) first, then units 0, 1, 2 ...
OFFSET = -PAD_UNIT


class AttentionMass:
    """Attention weights summed per stream unit (and per sentinel: prefix, summary, text), over the
    observed queries and every query head, one row per layer."""

    def __init__(self, layers: Iterable[int], num_layers: int, units: int, device=None):
        """``layers``: those whose attention is measured; ``units``: one more than the largest
        unit id the cache may hold."""
        self.layers = frozenset(int(layer) for layer in layers)
        self.mass = torch.zeros(num_layers, units + OFFSET, dtype=torch.float32, device=device)

    def observe(self, layer: int, store: KVStore, q: torch.Tensor, visible: torch.Tensor | None) -> None:
        """Add the newest query's weights over ``store`` (q [1, rows·G, Q, D] rotated; ``visible``
        the mask its attention used) to ``layer``'s row."""
        if layer not in self.layers:
            return
        weights = store.attention_mass(q, visible)  # [rows, T]
        columns = store.units.expand_as(weights) + OFFSET  # [T] shared by the rows, or [rows, T]
        self.mass[layer].index_add_(0, columns.flatten().to(self.mass.device), weights.flatten().to(self.mass.device))

    def of(self, unit: int, layers: Iterable[int] | None = None) -> float:
        """The mass on ``unit`` (an id or a sentinel), summed over ``layers`` (default: the measured)."""
        return float(self.totals(layers)[unit + OFFSET])

    def totals(self, layers: Iterable[int] | None = None) -> torch.Tensor:
        """[units + OFFSET] mass per column, summed over ``layers`` (default: the measured ones)."""
        chosen = sorted(self.layers if layers is None else set(layers))
        return self.mass[chosen].sum(dim=0).cpu()


def retention(stores: list[list[tuple[int, KVStore]]], size: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                            dict[int, torch.Tensor], dict[int, int]]:
    """What the memory still holds of each stream unit 0 .. size-1, from a policy's ``layer_stores``:
    tokens per layer [L, size] (summed over the layer's KV heads), the KV heads per layer [L], and,
    for a policy with banks (H2SVC), tokens per bank {bank: [size]} over every layer and the KV heads
    each bank has over every layer {bank: n}."""
    layer_tokens = torch.zeros(len(stores), size, dtype=torch.long)
    layer_rows = torch.zeros(len(stores), dtype=torch.long)
    bank_tokens: dict[int, torch.Tensor] = {}
    bank_rows: dict[int, int] = {}
    for layer, pairs in enumerate(stores):
        for bank, store in pairs:
            held = store.unit_tokens(size).cpu()
            layer_tokens[layer] += held
            layer_rows[layer] += store.rows
            if bank >= 0:
                bank_tokens[bank] = bank_tokens.get(bank, torch.zeros(size, dtype=torch.long)) + held
                bank_rows[bank] = bank_rows.get(bank, 0) + store.rows
    return layer_tokens, layer_rows, bank_tokens, bank_rows
