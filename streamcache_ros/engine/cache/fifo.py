"""Baseline ``fifo``: a sliding window of the last ``budget_tokens`` video tokens per layer.

The system prefix is always kept, on top of the budget (as HERMES does, docs/hermes.md §9). With
several cameras and ``camera_budget_share: equal`` each camera's window is its fair share of the
budget (clocks.fair_shares): a quiet camera keeps its newest tokens however busy the others are.
With ``instant_frames`` the instant window's tokens stay beside the window, which slides over the
tokens older than them (instant.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .types import ChunkContext, ChunkOutcome
from .clocks import camera_share_setting, fair_shares
from .instant import instant_setting
from .layerwise import LayerwisePolicy, LayerwiseSettings, budget_setting
from .units import PREFIX_UNIT


@dataclass(frozen=True)
class FifoSettings(LayerwiseSettings):
    budget_tokens: int = budget_setting()
    camera_budget_share: str = camera_share_setting()
    instant_frames: int = instant_setting()


class FifoCachePolicy(LayerwisePolicy):
    name = "fifo"
    settings_class = FifoSettings

    def evict(self, context: ChunkContext) -> ChunkOutcome:
        evicted, budget = 0, self.budget_tokens
        instant = self.instant_units()
        for store in self.layers:
            is_prefix = store.units == PREFIX_UNIT
            protected = torch.isin(store.units, instant.to(store.units.device)) if instant.numel() else None
            video = torch.nonzero(~is_prefix if protected is None else ~is_prefix & ~protected).flatten()
            if video.numel() <= budget:
                continue
            lanes = self.lanes(store)
            if len(lanes) == 1:
                kept = video[-budget:]
            else:  # each camera's newest tokens, its share of the budget
                clocks = store.clocks[video]
                shares = fair_shares({c: int((clocks == c).sum()) for c in lanes}, budget)
                kept = torch.sort(torch.cat([video[clocks == c][-shares[c]:] if shares[c] else video[:0]
                                             for c in lanes])).values
            keep = torch.cat((torch.nonzero(is_prefix).flatten(), kept))
            if protected is not None:
                keep = torch.sort(torch.cat((keep, torch.nonzero(protected).flatten()))).values
            evicted += video.numel() - kept.numel()
            store.keep(keep)
        return ChunkOutcome(evicted_tokens=evicted)
