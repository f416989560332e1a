"""Baseline ``fifo``: a sliding window of the last ``budget_tokens`` video tokens per layer.

The system prefix is always kept, on top of the budget (as HERMES does, docs/hermes.md §9).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import ChunkContext, ChunkOutcome
from .layerwise import LayerwisePolicy, LayerwiseSettings, budget_setting
from .units import PREFIX_UNIT


@dataclass(frozen=True)
class FifoSettings(LayerwiseSettings):
    budget_tokens: int = budget_setting()


class FifoCachePolicy(LayerwisePolicy):
    name = "fifo"
    settings_class = FifoSettings

    def evict(self, context: ChunkContext) -> ChunkOutcome:
        evicted, budget = 0, self.budget_tokens
        for store in self.layers:
            is_prefix = store.units == PREFIX_UNIT
            video = torch.nonzero(~is_prefix).flatten()
            if video.numel() <= budget:
                continue
            keep = torch.cat((torch.nonzero(is_prefix).flatten(), video[-budget:]))
            evicted += video.numel() - budget
            store.keep(keep)
        return ChunkOutcome(evicted_tokens=evicted)
