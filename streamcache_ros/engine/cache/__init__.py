"""Cache policies behind one interface: ``full``, ``fifo`` (baselines), ``hermes``, ``h2svc``."""
from __future__ import annotations

import inspect
from typing import Any

from .base import (PREFIX_UNIT, SUMMARY_UNIT, TEXT_UNIT, CacheGeometry, CachePolicy, CacheStats,
                   ChunkContext, LayerwisePolicy, NewTokens)
from .fifo import FifoCachePolicy
from .full import FullCachePolicy
from .h2svc import H2svcPolicy
from .hermes import HermesPolicy

POLICIES: dict[str, type[CachePolicy]] = {
    FullCachePolicy.name: FullCachePolicy,
    FifoCachePolicy.name: FifoCachePolicy,
    HermesPolicy.name: HermesPolicy,
    H2svcPolicy.name: H2svcPolicy,
}


def make_policy(name: str, **params: Any) -> CachePolicy:
    """Build a policy by name; ``params`` are its constructor's keyword arguments."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy '{name}' (one of: {', '.join(sorted(POLICIES))})") from None
    return cls(**params)


# Constructor arguments every policy gets from the node's general parameters, not "<policy>.<name>".
GENERAL_ARGUMENTS = ("budget_tokens",)


def policy_parameters(name: str) -> dict[str, Any]:
    """A policy's own parameters and their defaults: its constructor's keyword arguments (the node
    declares each as "<policy>.<argument>", e.g. "hermes.reindex")."""
    params = inspect.signature(POLICIES[name].__init__).parameters.values()
    return {p.name: p.default for p in params
            if p.name != "self" and p.name not in GENERAL_ARGUMENTS and p.default is not inspect.Parameter.empty}


__all__ = ["policy_parameters", "GENERAL_ARGUMENTS", "POLICIES", "make_policy", "CachePolicy", "LayerwisePolicy", "CacheGeometry", "CacheStats",
           "ChunkContext", "NewTokens", "PREFIX_UNIT", "SUMMARY_UNIT", "TEXT_UNIT"]
