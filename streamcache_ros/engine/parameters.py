"""The engine's parameters as a front end declares them (the node's ROS parameters, a YAML file).

Every name ``factory.build_session`` takes (``ENGINE_DEFAULTS``) and every registered policy's own
settings as "<policy>.<setting>" (``hermes.reindex``, ``h2svc.w_s``), old names included, each with
its default, a description, its inclusive range and whether it may change while the stream runs
(``Session.tune``). A policy's settings come from its settings dataclass, so a new policy's
parameters appear here as soon as it is registered. ROS-free: the node declares these and reads
nothing under engine/cache (docs/interfaces.md, "Parameters").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .cache import POLICIES, SettingInfo, policy_settings
from .cache import takes_budget as _takes_budget
from .cache.settings import INHERITED
from .factory import ENGINE_DEFAULTS, FALLBACK_BUDGET_TOKENS, REFERENCE_FRAME, family_aliases
from .config import SessionConfig


@dataclass(frozen=True)
class ParameterInfo:
    """One parameter: what a front end needs to declare it and say what it is."""

    default: Any
    description: str
    low: float | int | None = None  # inclusive range; None: open at that end
    high: float | int | None = None
    runtime: bool = False  # may change while the stream runs
    inherits: str | None = None  # its default is this general parameter's value


# the policies by name, and what Session.tune takes (may change while the stream runs)
POLICY_NAMES: tuple[str, ...] = tuple(sorted(POLICIES))
RUNTIME = ("max_new_tokens", "sample_fps", "budget_tokens")


def takes_budget(policy: str) -> bool:
    """Whether ``policy`` keeps a token budget (``budget_tokens``)."""
    return _takes_budget(policy)


def budget_policies() -> tuple[str, ...]:
    return tuple(name for name in POLICY_NAMES if takes_budget(name))


_W, _H = REFERENCE_FRAME[1], REFERENCE_FRAME[0]
DESCRIPTIONS = {
    "model_path": "Model: a bundled model's name (world-qwen2_5_vl, world-llava_onevision: trained on the shape "
                  "world; tiny-*: random weights), a local directory or a Hugging Face hub id (Qwen2.5-VL or "
                  "LLaVA-OneVision)",
    "policy": "KV cache policy: one of " + "|".join(POLICY_NAMES),
    "budget_tokens": f"Video tokens kept per layer, on top of the system prompt, by the policies that keep a budget "
                     f"({', '.join(budget_policies())}); must hold one {_W}x{_H} frame; 0 = the model folder's own "
                     f"(streamcache.json), else {FALLBACK_BUDGET_TOKENS}. While the node is configured it shows the "
                     "budget in force (0 set at runtime: the model's own again)",
    "sample_fps": "Frames per second taken into memory from each camera, by message stamp",
    "chunk_frames": "Frames per camera encoded and prefilled together",
    "device": "cpu | cuda | cuda:N | auto",
    "dtype": "auto | float32 | float16 | bfloat16 (auto: float32 on CPU; on CUDA bfloat16, or float16 where "
             "bfloat16 is missing)",
    "attention": "auto | sdpa | flash (auto: flash-attn when importable on CUDA, else SDPA)",
    "max_question_tokens": "Longest question accepted, in tokens with its prompt",
    "max_new_tokens": f"Default answer length in tokens (a request's max_new_tokens = 0; "
                      f"{SessionConfig.mc_max_new_tokens} for a question with options)",
    "repetition_penalty": "Greedy decoding's repetition penalty (1.0 = none; 1.1 decodes as the HERMES reference)",
    "reindex": "Position re-index: lazy (near max_position_embeddings) | eager (after every chunk)",
    "reindex_margin": "Lazy re-index starts this many positions before max_position_embeddings",
    "vision_backend": "Vision encoder: torch | onnxruntime (docs/vision-encoder.md)",
    "vision_onnx_path": "The .onnx file (or its directory) from streamcache-export-encoder (vision_backend onnxruntime)",
    "vision_onnx_providers": "onnxruntime execution providers: auto (TensorRT, CUDA, CPU as available) or e.g. 'cuda,cpu'",
    "evidence_k": "Evidence frames an answer names (a request's evidence_k = 0); 0 = none, and no attention "
                  "mass is computed",
    "evidence_layers": "Layers whose attention defines evidence; [] = the model folder's evidence_layers.json, "
                       "else the middle half of the layers",
    "camera_budget_share": "With several cameras, how a bounded policy's budget is shared: equal (each camera in "
                           "memory keeps its share; one that needs less leaves the rest to the others) | shared "
                           "(one budget for all: a busy camera pushes a quiet one's history out)",
    "options_mode": "How a question with options is answered: scored (the option the model finds most likely, "
                    "with option_probabilities; always an option) | generated (free generation matched to an "
                    "option, the HERMES reference's way)",
    "prefill_block_tokens": "A chunk's tokens are prefilled in blocks of at most this many (each attends to the cache "
                            "and the blocks before it; the result equals one forward): bounds a chunk's activation "
                            "memory on an edge board; 0 = the whole chunk in one forward (docs/performance.md)",
    "rows_per_pass": "Questions asked together in one forward pass (the when search's windows, standing "
                     "questions): more is faster and takes more memory for the pass",
}
RANGES = {
    "budget_tokens": (0, None), "sample_fps": (0.001, 1000.0), "chunk_frames": (1, 4096),
    "max_question_tokens": (1, None), "max_new_tokens": (1, None), "repetition_penalty": (0.0, 100.0),
    "reindex_margin": (0, None), "evidence_k": (0, 4096), "rows_per_pass": (1, 4096), "prefill_block_tokens": (0, None),
}


def engine_parameters() -> dict[str, ParameterInfo]:
    """The general parameters ``build_session`` takes."""
    return {name: ParameterInfo(default, DESCRIPTIONS.get(name, "Engine parameter (docs/interfaces.md)"),
                                *RANGES.get(name, (None, None)), runtime=name in RUNTIME)
            for name, default in ENGINE_DEFAULTS.items()}


def _setting(policy: str, info: SettingInfo, default: Any = None, description: str = "") -> ParameterInfo:
    """A policy setting's parameter: description, choices and range from the settings dataclass. An
    ``inherited`` setting (``reindex``, ``reindex_margin``) defaults to the general parameter's
    value, so ``reindex: eager`` applies to every policy and ``hermes.reindex: eager`` to hermes alone."""
    text = f"{policy}: {description or info.description}"
    if info.choices:
        text += f" (one of: {' | '.join(info.choices)})"
    inherits = info.name if info.scope == INHERITED else None
    if inherits:
        text += f" (default: the value of '{info.name}')"
    return ParameterInfo(info.default if default is None else default, text, info.low, info.high, inherits=inherits)


def setting_parameters() -> dict[str, ParameterInfo]:
    """"<policy>.<setting>" for every registered policy's own settings, and their old names (the
    settings' own, and each model family's, whose default is that family's preset)."""
    out = {}
    for policy in POLICY_NAMES:
        infos = {info.name: info for info in policy_settings(policy)}
        for info in infos.values():
            out[f"{policy}.{info.name}"] = _setting(policy, info)
            for alias in info.aliases:
                out[f"{policy}.{alias}"] = _setting(policy, info, description=f"old name of '{policy}.{info.name}'")
        for alias, (target, default, adapter) in family_aliases(policy).items():
            out[f"{policy}.{alias}"] = _setting(
                policy, infos[target], default=default,
                description=f"'{policy}.{target}' for {adapter.family} models (old name; its default is that "
                            f"family's preset)")
    return out
