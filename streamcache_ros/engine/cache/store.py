"""The KV storage every policy keeps: one store class whose rows are KV heads.

A store holds post-RoPE keys and values [1, rows, T, D] and, for every slot, its position, its
stream unit and its chunk. Positions and unit ids are either *shared* by all rows (the
layer-managed policies: every KV head of a layer holds the same tokens; positions [axes, T], units
and chunks [T]) or kept *per row* (H2SVC: each head evicts on its own; positions [rows, axes, T],
units and chunks [rows, T]). The rows of a store always have one length T: when per-row stores keep
different numbers of tokens the shorter rows are padded with ``PAD_UNIT`` slots, never attended to
and never counted, so the bytes held are rows · T · D per tensor, not a full cache masked out.

Tensors are replaced, never edited in place: the forward pass appends under inference mode, and
compression and re-indexing may run outside it, where an in-place edit of an inference tensor is an
error.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ..layout import next_offset
from .rope import RotarySpec, rotate_by_delta
from .units import PAD_UNIT, PREFIX_UNIT, TEXT_UNIT

# (old positions [axes, n], unit ids [n], chunk ids [n]) of one row's kept tokens -> new positions
Renumber = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class KVStore:
    """The KV heads ``heads`` of one layer (all of them, or an H2SVC group)."""

    def __init__(self, keys, values, positions, units, chunks, heads: torch.Tensor, shared: bool):
        self.keys, self.values = keys, values
        self.positions, self.units, self.chunks = positions, units, chunks
        self.heads = heads
        self.shared = shared
        self.padded = False

    @classmethod
    def empty(cls, geometry, heads: list[int] | None = None, shared: bool = True) -> "KVStore":
        g = geometry
        heads = list(range(g.num_kv_heads)) if heads is None else list(heads)
        rows = () if shared else (len(heads),)
        keys = torch.empty(1, len(heads), 0, g.head_dim, dtype=g.dtype, device=g.device)
        ids = torch.empty(*rows, 0, dtype=torch.long, device=g.device)
        return cls(keys, keys.clone(), torch.empty(*rows, g.rotary.axes, 0, device=g.device), ids, ids.clone(),
                   torch.tensor(heads, dtype=torch.long, device=g.device), shared)

    # -- shape ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.keys.shape[2])

    @property
    def rows(self) -> int:
        return int(self.heads.numel())

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.keys, self.values)

    def _per_row(self, x: torch.Tensor) -> torch.Tensor:
        """Positions, units or chunks with a leading row axis (a view when shared)."""
        return x[None] if self.shared else x

    def _as_stored(self, x: torch.Tensor) -> torch.Tensor:
        return x[0] if self.shared else x

    def tokens_per_row(self) -> torch.Tensor:
        """[rows] tokens each row holds, padding excluded."""
        if self.shared:
            return torch.full((self.rows,), len(self), dtype=torch.long, device=self.units.device)
        return (self.units != PAD_UNIT).sum(dim=1)

    def next_offset(self) -> float:
        """Where the next token goes: max position + 1 over all axes (docs/hermes.md §3)."""
        if self.shared:
            return next_offset(self.positions)
        return float(self.next_offsets().max()) if self.rows else 0.0

    def next_offsets(self) -> torch.Tensor:
        """[rows] where each row's next token goes (all equal when shared)."""
        if len(self) == 0:
            return torch.zeros(self.rows, dtype=torch.float32, device=self.positions.device)
        positions, units = self._per_row(self.positions), self._per_row(self.units)
        held = positions.masked_fill((units == PAD_UNIT)[:, None, :], -1.0)
        return (held.amax(dim=(1, 2)) + 1.0).expand(self.rows)

    def unit_columns(self, unit: int) -> torch.Tensor:
        """Slots of ``unit``'s tokens; appended tokens sit in the same slots in every row."""
        return torch.nonzero(self._per_row(self.units)[0] == unit).flatten()

    # -- writing ----------------------------------------------------------------------------------
    def append(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, units: torch.Tensor,
               chunks: torch.Tensor) -> None:
        """k, v [1, rows, Q, D]; positions [axes, Q] (shared) or [rows, axes, Q]; units and chunks
        [Q]: the same tokens for every row."""
        units, chunks = units.to(self.units.device), chunks.to(self.chunks.device)
        if not self.shared:
            units, chunks = units[None].expand(self.rows, -1), chunks[None].expand(self.rows, -1)
        self.keys = torch.cat((self.keys, k), dim=2)
        self.values = torch.cat((self.values, v), dim=2)
        self.positions = torch.cat((self.positions, positions), dim=-1)
        self.units = torch.cat((self.units, units), dim=-1)
        self.chunks = torch.cat((self.chunks, chunks), dim=-1)

    def truncate(self, length: int) -> None:
        if length < len(self):
            self.keys = self.keys[:, :, :length].clone()
            self.values = self.values[:, :, :length].clone()
            self.positions = self.positions[..., :length].clone()
            self.units = self.units[..., :length].clone()
            self.chunks = self.chunks[..., :length].clone()

    def select(self, index: torch.Tensor) -> "KVStore":
        """A new store of the slots ``index`` [n], in that order, for every row."""
        index = index.to(self.keys.device)
        store = KVStore(self.keys.index_select(2, index), self.values.index_select(2, index),
                        self.positions.index_select(-1, index), self.units.index_select(-1, index),
                        self.chunks.index_select(-1, index), self.heads, self.shared)
        store.padded = self.padded
        return store

    def compact(self, keep: torch.Tensor) -> None:
        """Keep the slots where ``keep`` ([T], or [rows, T] per row) is True, in order; rows shorter
        than the longest are padded (only when they kept different numbers of tokens)."""
        if self.shared:
            kept = self.select(torch.nonzero(keep).flatten())
            self.keys, self.values, self.positions, self.units, self.chunks = (
                kept.keys, kept.values, kept.positions, kept.units, kept.chunks)
            return
        counts = keep.sum(dim=1)
        width = int(counts.max()) if self.rows else 0
        # kept slots first, in their order (a stable sort of "dropped" flags)
        order = torch.argsort((~keep).to(torch.int32), dim=1, stable=True)[:, :width]
        take = order[None, :, :, None].expand(1, -1, -1, self.keys.shape[-1])
        keys, values = self.keys.gather(2, take), self.values.gather(2, take)
        positions = self.positions.gather(2, order[:, None, :].expand(-1, self.positions.shape[1], -1))
        units, chunks = self.units.gather(1, order), self.chunks.gather(1, order)
        filled = torch.arange(width, device=keep.device)[None, :] < counts[:, None]
        self.padded = not bool(filled.all())
        if self.padded:
            keys = keys.masked_fill(~filled[None, :, :, None], 0)
            values = values.masked_fill(~filled[None, :, :, None], 0)
            positions = positions.masked_fill(~filled[:, None, :], 0)
            units = units.masked_fill(~filled, PAD_UNIT)
            chunks = chunks.masked_fill(~filled, -1)
        self.keys, self.values, self.positions, self.units, self.chunks = keys, values, positions, units, chunks

    def reindex(self, rotary: RotarySpec, renumber: Renumber, rows: torch.Tensor | None = None) -> None:
        """Renumber the kept tokens of ``rows`` (all of them by default; a shared store renumbers all
        its rows at once) with ``renumber`` and turn their cached keys by the position delta
        (docs/hermes.md §10.3). Padding slots keep their place."""
        positions, units, chunks = self._per_row(self.positions), self._per_row(self.units), \
            self._per_row(self.chunks)
        new = positions.clone()
        tracks = range(positions.shape[0]) if rows is None or self.shared else rows.tolist()
        for row in tracks:
            valid = units[row] != PAD_UNIT
            new[row][:, valid] = renumber(positions[row][:, valid], units[row][valid], chunks[row][valid])
        delta = self._as_stored(new - positions)
        self.keys = rotate_by_delta(self.keys, rotary, delta)
        self.positions = self._as_stored(new)

    # -- reading ----------------------------------------------------------------------------------
    def visible(self, allowed_units: torch.Tensor) -> torch.Tensor:
        """Slots a question limited to ``allowed_units`` may see: those units, and the system prompt
        and the question's own text always; a summary token only when ``allowed_units`` lists
        SUMMARY_UNIT (a time window hides it, docs/interfaces.md "Time windows and evidence");
        never padding."""
        units = self.units
        return (units == PREFIX_UNIT) | (units == TEXT_UNIT) | torch.isin(units, allowed_units.to(units.device))

    def attention_mass(self, q: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
        """The attention weights of the newest query over this store, summed over each row's query
        heads: [rows, T] float32 (docs/interfaces.md "Time windows and evidence").

        q [1, rows·G, Q, D] rotated (only its last row, the newest token, is read: it sees every key,
        so no causal mask applies); ``visible`` [T] or [rows, T] (None: every slot), the mask the
        attention itself used. The logits q·K / sqrt(D) in the model's dtype and the softmax in
        float32, as transformers' eager attention computes the weights it returns: SDPA and flash
        return none, so only this, for the chosen layers, is computed again.
        """
        rows, dim = self.rows, self.keys.shape[-1]
        query = q[0, :, -1].reshape(rows, -1, dim)  # [rows, G, D]: a row's query heads
        logits = torch.matmul(query, self.keys[0].transpose(1, 2)).float() / math.sqrt(dim)  # [rows, G, T]
        if visible is not None:
            mask = (visible if visible.dim() == 2 else visible[None]).to(logits.device)
            logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
        return torch.softmax(logits, dim=-1).sum(dim=1)

    def unit_tokens(self, size: int) -> torch.Tensor:
        """[size] tokens each stream unit 0 .. size-1 holds here, summed over the rows."""
        units = self._per_row(self.units).expand(self.rows, -1)
        held = units[units >= 0]
        counts = torch.zeros(size, dtype=torch.long, device=units.device)
        return counts.index_add_(0, held, torch.ones_like(held))

    # -- snapshots ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"heads": self.heads.cpu(), "keys": self.keys.cpu(), "values": self.values.cpu(),
                "positions": self.positions.cpu(), "units": self.units.cpu(), "chunks": self.chunks.cpu()}

    def load(self, state: dict[str, Any], geometry) -> None:
        theirs = [int(h) for h in state["heads"]]
        if theirs != self.heads.tolist():
            raise ValueError(f"the snapshot stores KV heads {theirs} where this cache stores {self.heads.tolist()}")
        d = geometry.device
        self.keys = state["keys"].to(d, geometry.dtype)
        self.values = state["values"].to(d, geometry.dtype)
        self.positions = state["positions"].to(d)
        self.units = state["units"].to(d)
        self.chunks = state["chunks"].to(d)
        self.padded = bool((self.units == PAD_UNIT).any())
