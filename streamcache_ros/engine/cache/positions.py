"""Positions of kept tokens: when to re-index, and how kept tokens are renumbered (one place).

Keys are cached post-RoPE, so renumbering the kept tokens means turning each key by its position
delta (rope.rotate_by_delta). How tokens are renumbered follows the model family's RoPE layout
(``FamilyTraits.rope_layout``), never a family name:

- ``1d`` (LLaVA-OneVision): every kept token, prefix included, becomes 0..n-1 (docs/hermes.md
  §10.1);
- ``mrope`` (t/h/w axes, Qwen2.5-VL), in one of two modes (docs/hermes.md §10.2, D5):
  ``shift`` moves each group of tokens (a chunk, a frame, a summary token) by one delta on every
  axis and lays the groups back to back by the chunk-start rule, so a frame keeps its geometry;
  ``dense_rank`` (the reference) ranks each axis densely after the prefix.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .settings import INHERITED, PolicySettings, setting
from .units import PREFIX_UNIT

MROPE_MODES = ("shift", "dense_rank")
REINDEX_MODES = ("lazy", "eager")


def next_offset(positions: torch.Tensor) -> float:
    """Where the next chunk, question or token starts: the max position over every axis + 1 (0 for
    an empty cache)."""
    return float(positions.max().item()) + 1.0 if positions.numel() else 0.0


class PositionRangeError(RuntimeError):
    """More tokens than the model's position range holds, even after the kept tokens were
    renumbered: ``ensure_room`` raises it rather than place a token past the range."""

    def __init__(self, limit: int, max_position: float, n_tokens: int):
        super().__init__(f"{n_tokens} more positions after position {max_position:.0f} would pass the model's range "
                         f"(max_position_embeddings {limit}), even after re-indexing")
        self.limit, self.max_position, self.n_tokens = limit, max_position, n_tokens


@dataclass(frozen=True)
class ReindexSettings(PolicySettings):
    """The re-index settings every policy has (each checked here, once)."""

    reindex: str = setting("lazy", "Position re-index: lazy (when positions pass max_position_embeddings - "
                                   "reindex_margin) | eager (after every compression)",
                           choices=REINDEX_MODES, scope=INHERITED)
    reindex_margin: int = setting(1024, "Lazy re-index starts this many positions before max_position_embeddings",
                                  low=0, scope=INHERITED)

    def reindex_rule(self, max_position_embeddings: int) -> "ReindexRule":
        return ReindexRule(self.reindex, self.reindex_margin, max_position_embeddings)


@dataclass(frozen=True)
class ReindexRule:
    """When positions are renumbered: ``eager`` after every compression; ``lazy`` once they pass
    ``limit - margin`` (limit: the model's max_position_embeddings; docs/hermes.md §10)."""

    mode: str
    margin: int
    limit: int

    @property
    def threshold(self) -> float:
        return float(self.limit - self.margin)

    def due(self, max_position: float) -> bool:
        """Re-index after a compression whose cache reaches ``max_position``."""
        return self.mode == "eager" or max_position > self.threshold

    def overflows(self, max_position, n_tokens: int):
        """``n_tokens`` more tokens after ``max_position`` (a float, or a tensor of them) would pass
        the model's range."""
        return max_position + n_tokens >= self.limit

    def require(self, max_position: float, n_tokens: int) -> None:
        """Raise PositionRangeError when ``n_tokens`` more tokens after ``max_position`` would pass
        the range (what ``ensure_room`` checks once it has re-indexed)."""
        if self.overflows(max_position, n_tokens):
            raise PositionRangeError(self.limit, max_position, n_tokens)


def sequential_positions(count: int, device=None) -> torch.Tensor:
    """[1, count]: kept tokens, prefix included, become 0..n-1."""
    return torch.arange(count, dtype=torch.float32, device=device)[None, :]


def shift_positions(old: torch.Tensor, groups: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """[3, n] M-RoPE positions after a ``shift`` re-index: the prefix keeps 0..P-1; every other group
    moves by one delta on t, h and w, groups laid back to back (a group starts at the max of all
    positions so far + 1). ``old`` is [3, n] in cache order; ``groups`` [n] group ids, taken in order
    of first appearance (a summary token sorts before the chunks it follows)."""
    new = old.clone()
    if old.shape[1] <= prefix_len:
        return new
    cursor = float(old[:, :prefix_len].max().item()) + 1.0 if prefix_len > 0 else 0.0
    for gid in dict.fromkeys(groups[prefix_len:].tolist()):
        cols = torch.nonzero(groups == gid).flatten()
        cols = cols[cols >= prefix_len]
        start = old[:, cols].min()
        new[:, cols] = old[:, cols] - start + cursor
        cursor = float(new[:, cols].max().item()) + 1.0
    return new


def dense_rank_positions(old: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """The reference's M-RoPE re-index (``dense_rank``): on each axis independently, the tokens after
    the prefix get P + the dense rank of their value; the prefix keeps its positions."""
    new = old.clone()
    for axis in range(old.shape[0]):
        values = old[axis, prefix_len:]
        if values.numel() == 0:
            continue
        _, rank = torch.unique(values, sorted=True, return_inverse=True)
        new[axis, prefix_len:] = (rank + prefix_len).to(old.dtype)
    return new


def renumber(old: torch.Tensor, units: torch.Tensor, groups: torch.Tensor, rope_layout: str,
             mode: str = "shift", limit: float | None = None) -> tuple[torch.Tensor, bool]:
    """New positions [axes, n] for kept tokens ``old`` [axes, n] (cache order, prefix first) with unit
    ids ``units`` and ``groups`` [n]. With ``limit``, a ``shift`` whose groups do not fit under it
    (a shifted group keeps its whole span) falls back to dense ranks, which need at most one position
    per token. Returns (positions, fell back)."""
    if rope_layout == "1d":
        return sequential_positions(old.shape[1], old.device), False
    prefix_len = int((units == PREFIX_UNIT).sum().item())
    if mode == "shift":
        new = shift_positions(old, groups, prefix_len)
        if limit is None or new.numel() == 0 or float(new.max()) <= limit:
            return new, False
        return dense_rank_positions(old, prefix_len), True
    return dense_rank_positions(old, prefix_len), False
