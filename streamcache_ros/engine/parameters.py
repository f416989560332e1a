"""The engine's parameters as a front end declares them (the node's ROS parameters, a YAML file).

Every name ``factory.build_session`` takes and every registered policy's own settings as
"<policy>.<setting>" (``hermes.reindex``, ``h2svc.w_s``), old names included, each declared once
here with its default, a description, its inclusive range, its choices and whether it may change
while the stream runs (``Session.tune``). A policy's settings come from its settings dataclass, so a
new policy's parameters appear here as soon as it is registered. ROS-free: the node and the docs'
parameter tables read these declarations and nothing under engine/cache (docs/interfaces.md,
"Parameters").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .adapters import ADAPTERS, ModelAdapter, VisionInputs
from .recall.archive import DEFAULT_MAX_BYTES as DEFAULT_ARCHIVE_MAX_BYTES
from .recall.archive import DEFAULT_THUMBNAIL_PX
from .cache import POLICIES, SettingInfo, policy_settings
from .cache import takes_budget as _takes_budget
from .cache.settings import INHERITED
from .config import SessionConfig
from .errors import ConfigError
from .adapters.models import DEFAULT_MODEL


@dataclass(frozen=True)
class ParameterInfo:
    """One parameter: what a front end needs to declare it, check it and say what it is."""

    default: Any
    description: str
    low: float | int | None = None  # inclusive range; None: open at that end
    high: float | int | None = None
    runtime: bool = False  # may change while the stream runs
    inherits: str | None = None  # its default is this general parameter's value
    choices: tuple[str, ...] = ()  # a string parameter's every value, where the declaration knows them all
    fallback: Any = None  # what the default stands for when the model names nothing (budget_tokens 0)
    alias_of: str | None = None  # an old name: the "<policy>.<setting>" it sets


# the policies by name, and what Session.tune takes (may change while the stream runs)
POLICY_NAMES: tuple[str, ...] = tuple(sorted(POLICIES))
RUNTIME = ("max_new_tokens", "sample_fps", "budget_tokens")
# The budget of a model whose folder names none (HERMES's M, docs/hermes.md "Budgets")
FALLBACK_BUDGET_TOKENS = 6000
# A camera frame of this size is what "holds at least one frame" is checked against.
REFERENCE_FRAME = (480, 640)


def takes_budget(policy: str) -> bool:
    """Whether ``policy`` keeps a token budget (``budget_tokens``)."""
    return _takes_budget(policy)


def budget_policies() -> tuple[str, ...]:
    return tuple(name for name in POLICY_NAMES if takes_budget(name))


_W, _H = REFERENCE_FRAME[1], REFERENCE_FRAME[0]
_P = ParameterInfo
ENGINE_PARAMETERS: dict[str, ParameterInfo] = {
    "model_path": _P(DEFAULT_MODEL, "Model: a bundled model's name (world-qwen2_5_vl, world-llava_onevision: trained "
                                    "on the shape world; tiny-*: random weights), a local directory or a Hugging Face "
                                    "hub id (Qwen2.5-VL or LLaVA-OneVision)"),
    "policy": _P("hermes", "KV cache policy: one of " + "|".join(POLICY_NAMES)),
    "budget_tokens": _P(0, f"Video tokens kept per layer, on top of the system prompt, by the policies that keep a "
                           f"budget ({', '.join(budget_policies())}); must hold one {_W}x{_H} frame; 0 = the model "
                           f"folder's own (streamcache.json), else {FALLBACK_BUDGET_TOKENS}. While the node is "
                           "configured it shows the budget in force (0 set at runtime: the model's own again)",
                        0, None, runtime=True, fallback=FALLBACK_BUDGET_TOKENS),
    # how cameras share the bound of a bounded policy (cache/clocks.py)
    "camera_budget_share": _P("equal", "With several cameras, how a bounded policy's budget is shared: equal (each "
                                       "camera in memory keeps its share; one that needs less leaves the rest to the "
                                       "others) | shared (one budget for all: a busy camera pushes a quiet one's "
                                       "history out)", choices=("equal", "shared")),
    # the newest frames of each camera kept whole beside a bounded policy's past (cache/instant.py)
    "instant_frames": _P(0, "The newest this many frames of each camera are kept whole (every layer, every KV head) "
                            "beside what a bounded policy keeps of the past, on top of its bound (budget_tokens; "
                            "h2svc: its banks); 0 = off (docs/architecture.md \"The instant window\")", 0, None),
    "sample_fps": _P(1.0, "Frames per second taken into memory from each camera, by message stamp", 0.001, 1000.0,
                     runtime=True),
    "chunk_frames": _P(8, "Frames per camera encoded and prefilled together", 1, 4096),
    "device": _P("auto", "cpu | cuda | cuda:N | auto"),
    "dtype": _P("auto", "auto | float32 | float16 | bfloat16 (auto: float32 on CPU; on CUDA bfloat16, or float16 "
                        "where bfloat16 is missing)"),
    "attention": _P("auto", "auto | sdpa | flash (auto: flash-attn when importable on CUDA, else SDPA)",
                    choices=("auto", "sdpa", "flash")),
    "max_question_tokens": _P(512, "Longest question accepted, in tokens with its prompt", 1, None),
    "max_new_tokens": _P(64, f"Default answer length in tokens (a request's max_new_tokens = 0; "
                             f"{SessionConfig.mc_max_new_tokens} for a question with options)", 1, None, runtime=True),
    "repetition_penalty": _P(1.0, "Greedy decoding's repetition penalty (1.0 = none; 1.1 decodes as the HERMES "
                                  "reference)", 0.0, 100.0),
    "reindex": _P("lazy", "Position re-index: lazy (near max_position_embeddings) | eager (after every chunk)"),
    "reindex_margin": _P(1024, "Lazy re-index starts this many positions before max_position_embeddings", 0, None),
    "vision_backend": _P("torch", "Vision encoder: torch | onnxruntime (docs/vision-encoder.md)"),
    "vision_onnx_path": _P("", "The .onnx file (or its directory) from streamcache-export-encoder (vision_backend "
                               "onnxruntime)"),
    "vision_onnx_providers": _P("auto", "onnxruntime execution providers: auto (TensorRT, CUDA, CPU as available) or "
                                        "e.g. 'cuda,cpu'"),
    "evidence_k": _P(3, "Evidence frames an answer names (a request's evidence_k = 0); 0 = none, and no attention "
                        "mass is computed", 0, 4096),
    "evidence_layers": _P([], "Layers whose attention defines evidence; [] = the model folder's "
                              "evidence_layers.json, else the middle half of the layers"),
    "options_mode": _P("scored", "How a question with options is answered: scored (the option the model finds most "
                                 "likely, with option_probabilities; always an option) | generated (free generation "
                                 "matched to an option, the HERMES reference's way)", choices=("scored", "generated")),
    "when_verify_chunks": _P(4, "`when` and \"did you see\" over the archive: the index's candidates replayed at most "
                                "(docs/archive.md \"When with the index\"); with when_walk_chunks, what bounds a "
                                "search's worst case", 1, 1024),
    "when_walk_chunks": _P(16, "Where the index cannot settle a window (not trusted, or more candidates than it "
                               "verified): its chunks walked at most, each replayed alone; the reply says whether it "
                               "read all of them (search_complete)", 0, 100000),
    "rows_per_pass": _P(64, "Questions asked together in one forward pass (the when search's windows, standing "
                            "questions): more is faster and takes more memory for the pass", 1, 4096),
    "prefill_block_tokens": _P(128, "A chunk's tokens are prefilled in blocks of at most this many (each attends to "
                                    "the cache and the blocks before it; the result equals one forward): bounds a "
                                    "chunk's activation memory on an edge board; 0 = the whole chunk in one forward "
                                    "(docs/performance.md)", 0, None),
    # the archive tier (recall/; docs/archive.md): opened by build_session, so every front end gets it
    "archive_path": _P("", "The archive (docs/archive.md): every chunk also kept on disk, recalled by questions that "
                           "reach past the working memory, kept across restarts; a folder, '' or 'off' = off"),
    "archive_max_bytes": _P(DEFAULT_ARCHIVE_MAX_BYTES, "The archive's bound in bytes: past it the oldest chunks go "
                                                       "(the first chunk of each camera stays)", 1, None),
    "archive_thumbnail_px": _P(DEFAULT_THUMBNAIL_PX, "A JPEG of every archived frame, its longest side this many "
                                                     "pixels, counted in archive_max_bytes: what the archive CLI, "
                                                     "with_images answers and the shown topic show (docs/show.md); "
                                                     "0 = none", 0, 4096),
    "archive_content": _P("auto", "What an archived chunk keeps to be replayed (docs/archive.md \"What a chunk "
                                  "keeps\"): embeddings (the vision encoder's output: no encoding on a replay), "
                                  "frames (each frame's JPEG at the model's input size, encoded again on a replay: a "
                                  "7B model's day on an edge disk), or auto (frames where the embeddings take 128 kB "
                                  "a frame or more: a 3B or 7B model; embeddings for the bundled ones)",
                          choices=("auto", "embeddings", "frames")),
    "archive_sync": _P("normal", "When the archive's commits reach the disk (docs/archive.md \"Durability\"): normal = at "
                                 "each checkpoint (a kill -9 loses nothing committed, a power cut may lose the chunks "
                                 "since the last checkpoint), full = at every commit (a power cut loses nothing "
                                 "committed; each chunk waits for the disk)", choices=("normal", "full")),
    "recall_chunks": _P(2, "Archived chunks a question with no time window brings back for their relevance (ranked "
                           "by the index), beside the stream's first and newest chunks, answered over that short "
                           "replay whenever the archive reaches past the working memory (docs/archive.md \"Recall\")",
                        0, 64),
    "retrieval_model_path": _P("auto", "The archive's index (docs/archive.md \"The index\"): a dual encoder (CLIP or "
                                       "SigLIP weights, a folder) that gives every archived frame a vector in its "
                                       "question's space; 'auto' = the bundled world-retrieval for a bundled world "
                                       "model, none for another; '' = no index (when walks the archive)"),
}
# what build_session takes when a parameter is not given
ENGINE_DEFAULTS: dict[str, Any] = {name: info.default for name, info in ENGINE_PARAMETERS.items()}


def archive_off(value: Any) -> bool:
    """archive_path '' or 'off' (any case): no archive. 'off' because a shell's `-p archive_path:=''`
    reaches ROS's argument parser as nothing at all, and it refuses that (docs/interfaces.md)."""
    return str(value).strip().lower() in ("", "off")


def engine_parameters() -> dict[str, ParameterInfo]:
    """The general parameters ``build_session`` takes."""
    return dict(ENGINE_PARAMETERS)


def family_aliases(policy: str) -> dict[str, tuple[str, Any, type[ModelAdapter]]]:
    """Every model family's own old names of ``policy``'s settings: old name -> (setting, the old
    name's default: the family's preset, the adapter class). E.g. hermes: ``qwen_mid_omega``."""
    out = {}
    prefix = policy + "."
    for adapter_cls in ADAPTERS.values():
        preset = adapter_cls.traits.presets.get(policy, {})
        for alias, target in adapter_cls.setting_aliases.items():
            if alias.startswith(prefix) and target.startswith(prefix):
                name = target[len(prefix):]
                default = preset.get(name)
                out[alias[len(prefix):]] = (name, list(default) if isinstance(default, tuple) else default,
                                            adapter_cls)
    return out


def _setting(policy: str, info: SettingInfo, default: Any = None, description: str = "",
             alias: bool = False) -> ParameterInfo:
    """A policy setting's parameter: description, choices and range from the settings dataclass. An
    ``inherited`` setting (``reindex``, ``reindex_margin``) defaults to the general parameter's
    value, so ``reindex: eager`` applies to every policy and ``hermes.reindex: eager`` to hermes alone."""
    text = f"{policy}: {description or info.description}"
    if info.choices:
        text += f" (one of: {' | '.join(info.choices)})"
    inherits = info.name if info.scope == INHERITED else None
    if inherits:
        text += f" (default: the value of '{info.name}')"
    return ParameterInfo(info.default if default is None else default, text, info.low, info.high, inherits=inherits,
                         alias_of=f"{policy}.{info.name}" if alias else None)


def setting_parameters() -> dict[str, ParameterInfo]:
    """"<policy>.<setting>" for every registered policy's own settings, and their old names (the
    settings' own, and each model family's, whose default is that family's preset)."""
    out = {}
    for policy in POLICY_NAMES:
        infos = {info.name: info for info in policy_settings(policy)}
        for info in infos.values():
            out[f"{policy}.{info.name}"] = _setting(policy, info)
            for alias in info.aliases:
                out[f"{policy}.{alias}"] = _setting(policy, info, description=f"old name of '{policy}.{info.name}'",
                                                    alias=True)
        for alias, (target, default, adapter) in family_aliases(policy).items():
            out[f"{policy}.{alias}"] = _setting(
                policy, infos[target], default=default, alias=True,
                description=f"'{policy}.{target}' for {adapter.family} models (old name; its default is that "
                            f"family's preset)")
    return out


# -- what a token budget means on one model: read by the factory at build time and by the Session
# for a runtime change
def resolved_budget_tokens(budget: int, adapter: ModelAdapter) -> int:
    """The budget ``budget_tokens`` stands for: itself, or for 0 the model folder's own (the bundled
    world models carry one that binds within the demo's stream), else the declaration's fallback."""
    return (budget or int(getattr(adapter, "model_settings", {}).get("budget_tokens", 0))
            or ENGINE_PARAMETERS["budget_tokens"].fallback)


# A budget this many times the model folder's own is all but a full cache on that model: said, in
# case a YAML meant for another model set it (docs/interfaces.md "Parameters").
FAR_ABOVE_MODEL_BUDGET = 8


def far_above_model_budget(budget: int, adapter: ModelAdapter) -> str:
    """'' unless ``budget_tokens`` (as given, 0 = the model's own) is more than FAR_ABOVE_MODEL_BUDGET
    times the model folder's own budget; then a line naming both."""
    own = int(getattr(adapter, "model_settings", {}).get("budget_tokens", 0))
    if not budget or not own or budget <= FAR_ABOVE_MODEL_BUDGET * own:
        return ""
    return (f"budget_tokens {budget} is {budget / own:.0f} times the budget of {adapter.model_id} ({own}, from its "
            f"folder's streamcache.json): on this model that is all but a full cache; budget_tokens 0 takes the "
            f"model's own")


def reference_unit(adapter: ModelAdapter) -> VisionInputs:
    """One stream unit of REFERENCE_FRAME-sized frames, preprocessed: what budgets are checked against."""
    return adapter.preprocess([np.zeros((*REFERENCE_FRAME, 3), np.uint8)] * adapter.frames_per_unit)


def check_budget(adapter: ModelAdapter, budget: int, per_unit: int) -> None:
    if budget < per_unit:
        raise ConfigError("budget_tokens", f"{budget} cannot hold one frame: a {REFERENCE_FRAME[1]}x"
                                           f"{REFERENCE_FRAME[0]} frame is {per_unit} tokens on {adapter.model_id}")


# -- what a running stream may take (Session.tune and the node's parameter callback)
def check_tunable(policy, name: str, value) -> None:
    """ConfigError when ``Session.tune`` cannot take ``value`` for ``name`` under ``policy``."""
    if name == "max_new_tokens" and int(value) < 1:
        raise ConfigError("max_new_tokens", f"must be >= 1, got {value}")
    if name == "sample_fps" and not float(value) > 0:
        raise ConfigError("sample_fps", f"must be > 0, got {value}")
    if name == "budget_tokens" and not policy.settings_class.takes("budget_tokens"):
        raise ConfigError("budget_tokens", f"is not used by policy {policy.name}: it keeps no token budget")


def check_runtime(adapter: ModelAdapter, policy, name: str, value) -> None:
    """ConfigError when the running stream cannot take ``value`` for the runtime parameter ``name``:
    what ``check_tunable`` refuses, and a budget that cannot hold one reference frame."""
    check_tunable(policy, name, value)
    if name == "budget_tokens":
        check_budget(adapter, int(value), reference_unit(adapter).tokens_per_unit)


def budget_warning(adapter: ModelAdapter, policy, budget_tokens: int) -> str:
    """'' unless ``budget_tokens`` (as given) is far above the model folder's own budget, for a
    policy that keeps one; then a line naming both (``far_above_model_budget``)."""
    if not policy.settings_class.takes("budget_tokens"):
        return ""
    return far_above_model_budget(int(budget_tokens), adapter)
