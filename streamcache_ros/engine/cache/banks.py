"""Per-head KV storage of different lengths for H2SVC (h2svc_spec §3.5, §5).

A layer's KV heads are grouped by bank kind; each group is one dense tensor [1, n, T, D] whose rows
are the heads' own caches, so memory held is n · T · D per tensor, not the full cache masked out.
All rows of a group share one length T: new tokens are appended to every row, and FIFO rows drop
the same frames. Episodic rows evict different frames; when those frames have different token
counts (cameras of different sizes) the shorter rows are padded with masked ``PAD_UNIT`` slots.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import PREFIX_UNIT, CacheGeometry, tensor_bytes
from .rope import RotarySpec, compact_positions_1d, compact_positions_shift, rotate_by_delta

PAD_UNIT = -4  # a padding slot: never attended, never counted


class HeadBank:
    """The KV heads ``heads`` of one layer that share a bank kind (0, 1, 2)."""

    def __init__(self, kind: int, heads: list[int], geometry: CacheGeometry):
        g = geometry
        self.kind = kind
        self.heads = torch.tensor(heads, dtype=torch.long, device=g.device)
        group = g.group_size
        self.query_heads = torch.tensor([h * group + i for h in heads for i in range(group)],
                                        dtype=torch.long, device=g.device)
        n = len(heads)
        self.keys = torch.empty(1, n, 0, g.head_dim, dtype=g.dtype, device=g.device)
        self.values = self.keys.clone()
        self.positions = torch.empty(n, g.rotary.axes, 0, dtype=torch.float32, device=g.device)
        self.units = torch.empty(n, 0, dtype=torch.long, device=g.device)
        self.padded = False

    def __len__(self) -> int:
        return int(self.keys.shape[2])

    @property
    def rows(self) -> int:
        return int(self.heads.numel())

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.keys, self.values)

    def tokens_per_head(self) -> torch.Tensor:
        return (self.units != PAD_UNIT).sum(dim=1)

    def next_offsets(self) -> torch.Tensor:
        """[n] where each head's next token goes: max position + 1 over all axes (the chunk-start rule)."""
        if len(self) == 0:
            return torch.zeros(self.rows, dtype=torch.float32, device=self.positions.device)
        held = self.positions.masked_fill((self.units == PAD_UNIT)[:, None, :], -1.0)
        return held.amax(dim=(1, 2)) + 1.0

    def append(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, units: torch.Tensor) -> None:
        """k, v [1, n, Q, D]; positions [n, axes, Q]; units [Q] (the same tokens for every row)."""
        self.keys = torch.cat((self.keys, k), dim=2)
        self.values = torch.cat((self.values, v), dim=2)
        self.positions = torch.cat((self.positions, positions), dim=2)
        self.units = torch.cat((self.units, units.to(self.units.device)[None].expand(self.rows, -1)), dim=1)

    def truncate(self, length: int) -> None:
        if length < len(self):
            self.keys = self.keys[:, :, :length].clone()
            self.values = self.values[:, :, :length].clone()
            self.positions = self.positions[:, :, :length].clone()
            self.units = self.units[:, :length].clone()

    def unit_columns(self, unit: int) -> torch.Tensor:
        """Columns of ``unit``'s tokens; appended tokens sit in the same columns in every row."""
        return torch.nonzero(self.units[0] == unit).flatten()

    def compact(self, keep: torch.Tensor) -> None:
        """Keep the tokens where ``keep`` [n, T] is True, in order; rows shorter than the longest
        are padded (only when kept frames have different token counts)."""
        counts = keep.sum(dim=1)
        width = int(counts.max()) if self.rows else 0
        # kept columns first, in their order (a stable sort of "dropped" flags)
        order = torch.argsort((~keep).to(torch.int32), dim=1, stable=True)[:, :width]
        dim = self.keys.shape[-1]
        take = order[None, :, :, None].expand(1, -1, -1, dim)
        keys, values = self.keys.gather(2, take), self.values.gather(2, take)
        positions = self.positions.gather(2, order[:, None, :].expand(-1, self.positions.shape[1], -1))
        units = self.units.gather(1, order)
        filled = torch.arange(width, device=keep.device)[None, :] < counts[:, None]
        self.padded = not bool(filled.all())
        if self.padded:
            keys = keys.masked_fill(~filled[None, :, :, None], 0)
            values = values.masked_fill(~filled[None, :, :, None], 0)
            positions = positions.masked_fill(~filled[:, None, :], 0)
            units = units.masked_fill(~filled, PAD_UNIT)
        self.keys, self.values, self.positions, self.units = keys, values, positions, units

    def reindex_rows(self, rows: torch.Tensor, rotary: RotarySpec) -> None:
        """h2svc_spec §5: renumber each given head's kept tokens contiguously in stream order (1D:
        0..n-1; M-RoPE: frames laid back to back by the chunk-start rule, each keeping its grid)
        and turn its cached keys by the position delta (hermes_spec §10.3). Prefix unchanged."""
        for row in rows.tolist():
            valid = self.units[row] != PAD_UNIT
            old = self.positions[row][:, valid]
            units = self.units[row][valid]
            if rotary.axes == 1:
                new = compact_positions_1d(old.shape[1], old.device)
            else:
                new = compact_positions_shift(old, units, int((units == PREFIX_UNIT).sum()))
            self.keys[0, row, valid] = rotate_by_delta(self.keys[0, row, valid], rotary, new - old)
            self.positions[row][:, valid] = new

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "heads": self.heads.tolist(), "keys": self.keys.cpu(),
                "values": self.values.cpu(), "positions": self.positions.cpu(), "units": self.units.cpu()}

    def load(self, state: dict[str, Any], geometry: CacheGeometry) -> None:
        if state["kind"] != self.kind or state["heads"] != self.heads.tolist():
            raise ValueError(f"snapshot bank {state['kind']} heads {state['heads']} != "
                             f"bank {self.kind} heads {self.heads.tolist()}")
        d = geometry.device
        self.keys = state["keys"].to(d, geometry.dtype)
        self.values = state["values"].to(d, geometry.dtype)
        self.positions = state["positions"].to(d)
        self.units = state["units"].to(d)
        self.padded = bool((self.units == PAD_UNIT).any())
