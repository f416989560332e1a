"""Baseline ``full``: keep every token (memory grows linearly with the stream)."""
from __future__ import annotations

from .layerwise import LayerwisePolicy


class FullCachePolicy(LayerwisePolicy):
    name = "full"
