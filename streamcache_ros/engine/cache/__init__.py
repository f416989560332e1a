"""Cache policies behind one interface: ``full``, ``fifo``, ``uniform`` (baselines), ``hermes``, ``h2svc``.

A new policy is one file (its settings dataclass and its CachePolicy subclass) and one line in
``POLICIES``: the factory, the node's parameters and their descriptors follow from its settings.
"""
from __future__ import annotations

from typing import Any

from .base import CachePolicy
from .types import (CacheGeometry, CacheStats, ChunkContext, ChunkOutcome, ChunkShape, FamilyTraits, GuidancePass,
                    GuidancePrompt, GuidanceRequest, NewTokens)
from .fifo import FifoCachePolicy
from .full import FullCachePolicy
from .h2svc import H2svcPolicy
from .hermes import HermesPolicy
from .layerwise import LayerwisePolicy
from .rows import QueryRows
from .settings import GENERAL, PolicySettings, SettingError, SettingInfo
from .store import KVStore
from .uniform import UniformCachePolicy
from .units import PAD_UNIT, PREFIX_UNIT, SUMMARY_UNIT, TEXT_UNIT

POLICIES: dict[str, type[CachePolicy]] = {
    FullCachePolicy.name: FullCachePolicy,
    FifoCachePolicy.name: FifoCachePolicy,
    UniformCachePolicy.name: UniformCachePolicy,
    HermesPolicy.name: HermesPolicy,
    H2svcPolicy.name: H2svcPolicy,
}


def policy_class(name: str) -> type[CachePolicy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy '{name}' (one of: {', '.join(sorted(POLICIES))})") from None


def make_policy(name: str, **params: Any) -> CachePolicy:
    """Build a policy by name: ``params`` are its settings (old names work too) and the objects it
    is built with (``inputs``, e.g. H2SVC's ``head_map``)."""
    cls = policy_class(name)
    inputs = {key: params.pop(key) for key in cls.inputs if key in params}
    return cls(cls.settings_class.from_params(params), **inputs)


def policy_settings(name: str) -> list[SettingInfo]:
    """A policy's own settings (the node declares each as "<policy>.<name>"), general ones left out."""
    return [info for info in policy_class(name).settings_class.infos() if info.scope != GENERAL]


def policy_parameters(name: str) -> dict[str, Any]:
    """A policy's own parameters and their defaults, e.g. {"reindex": "lazy", ...} for "hermes"."""
    return {info.name: info.default for info in policy_settings(name)}


def takes_budget(name: str) -> bool:
    """Whether a policy keeps a token budget (its settings have ``budget_tokens``)."""
    return policy_class(name).settings_class.takes("budget_tokens")


__all__ = ["POLICIES", "CacheGeometry", "CachePolicy", "CacheStats", "ChunkContext", "ChunkOutcome", "ChunkShape",
           "FamilyTraits", "GuidancePass", "GuidancePrompt", "GuidanceRequest", "KVStore", "LayerwisePolicy", "NewTokens", "QueryRows",
           "PAD_UNIT", "PREFIX_UNIT", "PolicySettings", "SUMMARY_UNIT", "SettingError", "SettingInfo", "TEXT_UNIT",
           "make_policy", "policy_class", "policy_parameters", "policy_settings", "takes_budget"]
