"""Baseline ``full``: keep every token (memory grows linearly with the stream)."""
from __future__ import annotations

from .base import LayerwisePolicy


class FullCachePolicy(LayerwisePolicy):
    name = "full"

    def __init__(self, reindex: str = "lazy", reindex_margin: int = 1024, qwen_reindex: str = "shift", **_):
        super().__init__(budget_tokens=0, reindex=reindex, reindex_margin=reindex_margin,
                         qwen_reindex=qwen_reindex)
