"""Baseline ``full``: keep every token (memory grows linearly with the stream)."""
from __future__ import annotations

from dataclasses import dataclass

from .layerwise import LayerwisePolicy, LayerwiseSettings


@dataclass(frozen=True)
class FullSettings(LayerwiseSettings):
    """Only the re-index settings: the full cache takes no budget."""


class FullCachePolicy(LayerwisePolicy):
    name = "full"
    settings_class = FullSettings
