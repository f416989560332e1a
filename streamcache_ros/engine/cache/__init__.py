"""Cache policies behind one interface: ``full``, ``fifo`` (baselines), ``hermes``, ``h2svc``."""
from __future__ import annotations

from typing import Any

from .base import (PREFIX_UNIT, SUMMARY_UNIT, TEXT_UNIT, CacheGeometry, CachePolicy, CacheStats,
                   ChunkContext, LayerwisePolicy, NewTokens)
from .fifo import FifoCachePolicy
from .full import FullCachePolicy

POLICIES: dict[str, type[CachePolicy]] = {
    FullCachePolicy.name: FullCachePolicy,
    FifoCachePolicy.name: FifoCachePolicy,
}


def make_policy(name: str, **params: Any) -> CachePolicy:
    """Build a policy by name; ``params`` are its constructor's keyword arguments."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy '{name}' (one of: {', '.join(sorted(POLICIES))})") from None
    return cls(**params)


__all__ = ["POLICIES", "make_policy", "CachePolicy", "LayerwisePolicy", "CacheGeometry", "CacheStats",
           "ChunkContext", "NewTokens", "PREFIX_UNIT", "SUMMARY_UNIT", "TEXT_UNIT"]
