"""Baseline ``fifo``: a sliding window of the last ``budget_tokens`` video tokens per layer.

The system prefix is always kept, on top of the budget (as HERMES does, hermes_spec §9).
"""
from __future__ import annotations

import torch

from .base import PREFIX_UNIT, ChunkContext, LayerwisePolicy


class FifoCachePolicy(LayerwisePolicy):
    name = "fifo"

    def __init__(self, budget_tokens: int = 6000, reindex: str = "lazy", reindex_margin: int = 1024,
                 qwen_reindex: str = "shift", **_):
        if budget_tokens <= 0:
            raise ValueError(f"fifo needs budget_tokens > 0, got {budget_tokens}")
        super().__init__(budget_tokens, reindex, reindex_margin, qwen_reindex)

    def compress(self, context: ChunkContext) -> dict:
        evicted = 0
        for i, store in enumerate(self.layers):
            is_prefix = store.units == PREFIX_UNIT
            video = torch.nonzero(~is_prefix).flatten()
            if video.numel() <= self.budget_tokens:
                continue
            keep = torch.cat((torch.nonzero(is_prefix).flatten(), video[-self.budget_tokens:]))
            evicted += video.numel() - self.budget_tokens
            self.layers[i] = store.select(keep)
        return {"evicted_tokens": evicted}
