"""Build a Session from flat parameters (the node's ROS parameters, a YAML file, the CLI).

Names are the node's parameter names (CONTRACT.md); a policy's own parameters are prefixed with
its name (``hermes.reindex``, ``h2svc.w_s``) and passed to its constructor without the prefix.
A bad value raises ConfigError naming the parameter.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .adapters import load_adapter
from .cache import POLICIES, make_policy
from .errors import ConfigError
from .models import DEFAULT_MODEL
from .session import Session, SessionConfig

ENGINE_DEFAULTS: dict[str, Any] = {
    "model_path": DEFAULT_MODEL,
    "policy": "hermes",
    "budget_tokens": 6000,
    "sample_fps": 1.0,
    "chunk_frames": 8,
    "device": "auto",
    "dtype": "auto",
    "attention": "auto",
    "max_question_tokens": 512,
    "max_new_tokens": 64,
    "repetition_penalty": 1.0,
    "reindex": "lazy",
    "reindex_margin": 1024,
}
# The policies that take a token budget; the others ignore budget_tokens.
BUDGETED = {"fifo", "hermes"}
# A camera frame of this size is what "holds at least one frame" is checked against.
REFERENCE_FRAME = (480, 640)


def policy_params(params: dict[str, Any], policy: str) -> dict[str, Any]:
    prefix = policy + "."
    return {key[len(prefix):]: value for key, value in params.items() if key.startswith(prefix)}


def build_session(params: dict[str, Any]) -> Session:
    """Load the model and make the session; raises ConfigError / ModelLoadError with clear text."""
    p = {**ENGINE_DEFAULTS, **params}
    if p["policy"] not in POLICIES:
        raise ConfigError("policy", f"unknown policy '{p['policy']}' (one of: {', '.join(sorted(POLICIES))})")
    for name in ("chunk_frames", "max_question_tokens", "max_new_tokens"):
        if int(p[name]) < 1:
            raise ConfigError(name, f"must be >= 1, got {p[name]}")
    if float(p["sample_fps"]) <= 0:
        raise ConfigError("sample_fps", f"must be > 0, got {p['sample_fps']}")
    if p["reindex"] not in ("lazy", "eager"):
        raise ConfigError("reindex", f"must be 'lazy' or 'eager', got '{p['reindex']}'")
    adapter = load_adapter(str(p["model_path"]), device=str(p["device"]), dtype=str(p["dtype"]),
                           attention=str(p["attention"]), sample_fps=float(p["sample_fps"]))
    kwargs = {"reindex": p["reindex"], "reindex_margin": int(p["reindex_margin"]),
              **policy_params(p, p["policy"])}
    if p["policy"] in BUDGETED:
        budget = int(p["budget_tokens"])
        per_unit = adapter.preprocess([np.zeros((*REFERENCE_FRAME, 3), np.uint8)]).tokens_per_unit
        if budget < per_unit:
            raise ConfigError("budget_tokens", f"{budget} cannot hold one frame: a {REFERENCE_FRAME[1]}x"
                                               f"{REFERENCE_FRAME[0]} frame is {per_unit} tokens on {adapter.model_id}")
        kwargs["budget_tokens"] = budget
    try:
        policy = make_policy(p["policy"], **kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(p["policy"], str(err)) from None
    config = SessionConfig(chunk_frames=int(p["chunk_frames"]), max_question_tokens=int(p["max_question_tokens"]),
                           max_new_tokens=int(p["max_new_tokens"]),
                           repetition_penalty=float(p["repetition_penalty"]))
    return Session(adapter, policy, config)
