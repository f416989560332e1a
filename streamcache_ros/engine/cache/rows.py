"""Several questions in one forward pass over the same cache, each with its own key mask.

The ``when`` search and option scoring ask many questions that differ only in what they may see
(a time window each) or in the tokens that follow the prompt (an option each). Rather than one
forward per question, their tokens are appended as one sequence of rows, row after row, all at the
same positions after the cache, and each query attends to:

- the cached keys its own row's key filter allows (a unit filter as ``KVStore.visible`` reads it;
  None: every key), and
- its own row's tokens up to itself, never another row's.

So each row computes exactly what it would alone. The tokens are removed again afterwards
(``truncate``), like any question's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .store import KVStore


@dataclass
class QueryRows:
    """``rows[i]``: the row of the i-th new token (rows contiguous, in order); ``filters[r]``: the
    unit ids row r may see (None: all)."""

    rows: torch.Tensor  # [Q] int64
    filters: list[torch.Tensor | None]

    @classmethod
    def of(cls, lengths: list[int], filters: list[torch.Tensor | None]) -> "QueryRows":
        if len(lengths) != len(filters):
            raise ValueError(f"{len(lengths)} rows with {len(filters)} key filters")
        return cls(torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)), list(filters))

    def mask(self, store: KVStore, clock: int | None = None) -> torch.Tensor:
        """[Q, T] (a shared store) or [rows of the store, Q, T]: which key each new query may see
        (rows on ``clock`` see only its tokens, clocks.py); the store's last Q keys are the new
        tokens themselves."""
        units = store.units
        q_len = int(self.rows.numel())
        every = store.clock_mask(clock)
        every = torch.ones_like(units, dtype=torch.bool) if every is None else every
        cached = torch.stack([every if f is None else store.visible(f, clock)
                              for f in self.filters])  # [R, (store rows,) T]
        rows = self.rows.to(units.device)
        per_query = cached[rows]  # [Q, (store rows,) T]
        if per_query.dim() == 3:
            per_query = per_query.transpose(0, 1)  # [store rows, Q, T]
        own = rows[:, None] == rows[None, :]
        own &= torch.ones(q_len, q_len, dtype=torch.bool, device=units.device).tril()
        per_query = per_query.clone()
        per_query[..., -q_len:] = own
        return per_query


def combine(rows_mask: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """A per-query mask [n, Q, T] and a policy's own key mask [n, T] (None: every key) together."""
    if key_mask is None:
        return rows_mask
    if rows_mask.dim() == 2:
        rows_mask = rows_mask[None]
    return rows_mask & key_mask[:, None, :]
