"""Build a Session from flat parameters (the node's ROS parameters, a YAML file, the CLI).

Names are the node's parameter names (docs/interfaces.md); a policy's own settings are prefixed with
its name (``hermes.reindex``, ``h2svc.w_s``). Here, and only here, parameters meet what they need
from outside the policy: the model family's own old names, a model folder's H2SVC head map, a
budget checked against the model's tokens per frame. A bad value raises ConfigError naming the
parameter.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from .adapters import ModelAdapter, VisionInputs, load_adapter
from .adapters.models import resolve_retrieval_path
from .recall.index import RetrievalEncoder
from .parameters import archive_off, check_budget, reference_unit, resolved_budget_tokens
from .cache import CachePolicy, ChunkShape, SettingError, policy_class
from .cache.h2svc import check_head_map
from .cache.sap import HEAD_MAP_FILE, HeadMap
from .cache.settings import GENERAL, GENERAL_NAMES, INHERITED
from .errors import ArchiveError, ConfigError
from .config import SessionConfig
from .parameters import ENGINE_DEFAULTS, REFERENCE_FRAME, family_aliases
from .session import Session

HEAD_MAP_PARAMETER = "h2svc.head_map_path"
# The evidence layers chosen for a model (bench/evidence_layers.py writes it; docs/interfaces.md "Which layers")
EVIDENCE_LAYERS_FILE = "evidence_layers.json"


def registered_policy(name: str) -> type[CachePolicy]:
    """The policy class registered as ``name``; ConfigError naming ``policy`` when there is none."""
    try:
        return policy_class(name)
    except ValueError as err:
        raise ConfigError("policy", str(err)) from None


def build_policy(adapter: ModelAdapter, name: str, params: dict[str, Any],
                 config: SessionConfig | None = None) -> CachePolicy:
    """The policy ``name`` for ``adapter``'s model from flat parameters (the general ones and
    "<name>.<setting>"). Raises ConfigError naming the parameter. ``config``: the session it will
    serve (its chunk and question sizes; default: from ``params`` and the defaults), checked with
    the policy's bound against the model's position range."""
    return policy_of_class(adapter, registered_policy(name), params, config)


def policy_of_class(adapter: ModelAdapter, cls: type[CachePolicy], params: dict[str, Any],
                    config: SessionConfig | None = None) -> CachePolicy:
    """``build_policy`` for a class already looked up in the registry."""
    name = cls.name
    prefix = name + "."
    values = {key: params[key] for key in GENERAL_NAMES if key in params}
    values.update({key[len(prefix):]: value for key, value in params.items() if key.startswith(prefix)})
    aliases = family_aliases(name)
    ours = {alias: (target, default) for alias, (target, default, owner) in aliases.items()
            if isinstance(adapter, owner)}
    others = tuple(alias for alias in aliases if alias not in ours)  # another family's: not for this model
    try:
        settings = cls.settings_class.from_params(values, ours, ignore=others)
    except SettingError as err:
        scopes = {info.name: info.scope for info in cls.settings_class.infos()}
        if scopes.get(err.name) == GENERAL or (scopes.get(err.name) == INHERITED and prefix + err.name not in params):
            raise ConfigError(err.name, str(err)[len(err.name) + 1:]) from None  # the general parameter
        raise ConfigError(name, str(err)) from None
    unit = reference_unit(adapter)
    if cls.settings_class.takes("budget_tokens"):
        check_budget(adapter, settings.budget_tokens, unit.tokens_per_unit)
    inputs = {}
    if "head_map" in cls.inputs:
        inputs["head_map"], path = resolve_head_map(settings.head_map_path, adapter)
        settings = dataclasses.replace(settings, head_map_path=path)
    policy = cls(settings, **inputs)
    check_position_range(adapter, policy, config or session_config({**ENGINE_DEFAULTS, **params}), unit)
    return policy


def chunk_shape(adapter: ModelAdapter, chunk_frames: int, unit: VisionInputs) -> ChunkShape:
    """How ``adapter``'s family lays out a chunk of ``chunk_frames`` reference frames in positions
    (``unit``: one reference frame's unit, preprocessed): the tokens, and the positions by the
    family's rule, read from the adapter's own chunk positions."""
    units = -(-chunk_frames // adapter.frames_per_unit)
    chunk = dataclasses.replace(unit, num_units=units, grid=(units, *unit.grid[1:]))
    return ChunkShape(unit_tokens=unit.tokens_per_unit,
                      unit_positions=int(adapter.chunk_rel_positions(unit).max().item()) + 1,
                      chunk_tokens=units * unit.tokens_per_unit,
                      chunk_positions=int(adapter.chunk_rel_positions(chunk).max().item()) + 1)


def check_position_range(adapter: ModelAdapter, policy: CachePolicy, config: SessionConfig,
                         unit: VisionInputs) -> None:
    """A bounded policy must fit the model's position range: the system prompt, the most positions
    what it keeps can take once re-indexed, one chunk and the largest question, all inside
    ``max_position_embeddings`` (docs/architecture.md#the-position-range). Positions grow by the
    family's rule: one per token with 1D RoPE; with M-RoPE a chunk takes its largest t/h/w extent
    (the chunk-start rule). Raises ConfigError naming the setting that bounds the policy."""
    setting = policy.bounding_setting
    if not setting:  # full: stops taking frames in when the range is full (Session)
        return
    shape = chunk_shape(adapter, config.chunk_frames, unit)
    limit = adapter.geometry().max_position_embeddings
    prefix, question = len(adapter.prefix_ids), config.largest_question(limit)
    room = limit - prefix - shape.chunk_positions - question
    value = getattr(policy.settings, setting)
    kept = policy.kept_positions(value, shape)
    if kept <= room:
        return
    scope = {info.name: info.scope for info in policy.settings_class.infos()}[setting]
    parameter = setting if scope == GENERAL else f"{policy.name}.{setting}"
    low, high = 0, value  # the largest value that fits: kept_positions grows with it
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if policy.kept_positions(middle, shape) <= room else (low, middle - 1)
    mrope = adapter.traits.rope_layout == "mrope"
    instant = policy.instant_frames
    window = f" and the instant window of {instant} frames" if instant else ""
    kept_text = (f"{value} units{window} ({kept}: {shape.unit_positions} a unit)" if setting != "budget_tokens" else
                 f"the budget{window} ({kept}: in whole chunks by the chunk-start rule)" if mrope else
                 f"the budget{window} ({kept}: one a token)")
    chunk_text = f"{shape.chunk_positions}: " + ("its largest t/h/w extent" if mrope else "one a token")
    advice = (f"use {parameter} <= {low}" if low >= 1 else
              f"lower {'instant_frames, ' if instant else ''}chunk_frames, max_question_tokens or max_new_tokens")
    raise ConfigError(parameter, f"{value} does not fit {adapter.model_id}'s position range: the system prompt "
                                 f"({prefix}) + {kept_text} + one chunk of {config.chunk_frames} frames of "
                                 f"{REFERENCE_FRAME[1]}x{REFERENCE_FRAME[0]} ({chunk_text}) + the largest question "
                                 f"({question}: max_question_tokens + max_new_tokens) = "
                                 f"{prefix + kept + shape.chunk_positions + question} positions, over "
                                 f"max_position_embeddings {limit}; {advice}")


def resolve_head_map(path: str, adapter: ModelAdapter) -> tuple[HeadMap, str]:
    """The H2SVC head map for ``adapter``'s model: ``path``, or the ``h2svc_head_map.json`` in the
    model's folder. Raises ConfigError naming the parameter and the profiling command when there is
    none or it was profiled on another model."""
    model = adapter.model_id or "this model"
    if not path:
        candidate = os.path.join(adapter.model_dir, HEAD_MAP_FILE) if adapter.model_dir else ""
        if not candidate or not os.path.isfile(candidate):
            raise ConfigError(HEAD_MAP_PARAMETER, f"policy h2svc needs a head map for model '{model}' and its folder "
                                                  f"has none: run `streamcache-profile --model {model} --output "
                                                  f"head_map.json` once and set {HEAD_MAP_PARAMETER} to that file")
        path = candidate
    path = os.path.expanduser(path)
    try:
        head_map = HeadMap.load(path)
    except ValueError as err:
        raise ConfigError(HEAD_MAP_PARAMETER, f"{err}; make one with `streamcache-profile --model {model}`") from None
    same_model = head_map.model_id == adapter.model_id or head_map.config_hash == adapter.config_hash
    try:
        check_head_map(head_map, adapter.geometry())
    except ValueError:
        same_model = False
    if not same_model:
        geometry = adapter.geometry()
        raise ConfigError(HEAD_MAP_PARAMETER, f"head map '{path}' was profiled on model '{head_map.model_id}' "
                                              f"({head_map.num_layers} layers x {head_map.num_kv_heads} KV heads); "
                                              f"this node runs '{model}' ({geometry.num_layers} x "
                                              f"{geometry.num_kv_heads}): run `streamcache-profile --model {model}` "
                                              "for it")
    return head_map, path


def session_config(p: dict[str, Any]) -> SessionConfig:
    return SessionConfig(chunk_frames=int(p["chunk_frames"]), max_question_tokens=int(p["max_question_tokens"]),
                         max_new_tokens=int(p["max_new_tokens"]), repetition_penalty=float(p["repetition_penalty"]),
                         cameras=tuple(p.get("camera_topics") or ()), evidence_k=int(p["evidence_k"]),
                         evidence_layers=tuple(int(layer) for layer in p["evidence_layers"] or ()),
                         options_mode=str(p["options_mode"]), rows_per_pass=int(p["rows_per_pass"]),
                         prefill_block_tokens=p["prefill_block_tokens"],
                         when_verify_chunks=int(p["when_verify_chunks"]), when_walk_chunks=int(p["when_walk_chunks"]))


def model_evidence_layers(adapter: ModelAdapter) -> tuple[int, ...]:
    """The evidence layers chosen for ``adapter``'s model (its folder's evidence_layers.json), or ()."""
    path = os.path.join(adapter.model_dir, EVIDENCE_LAYERS_FILE) if adapter.model_dir else ""
    if not path or not os.path.isfile(path):
        return ()
    try:
        with open(path) as f:
            return tuple(int(layer) for layer in json.load(f)["layers"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError("evidence_layers", f"{path} is not an evidence-layer choice ({err}): set "
                                             "evidence_layers or run bench/evidence_layers.py again") from None


def build_session(params: dict[str, Any]) -> Session:
    """Load the model and make the session, its archive opened when ``archive_path`` names a folder;
    raises ConfigError / ModelLoadError with clear text. ``camera_topics`` (optional) names the
    cameras a question may ask about; ``archive_owner`` (optional) who holds the archive's lock
    (a node's full name), named to another that finds it held; ``archive_set_aside`` (optional): an
    archive of another model or other cameras is set aside rather than refused (the node's default
    archive_path)."""
    p = {**ENGINE_DEFAULTS, **params}
    cls = registered_policy(str(p["policy"]))  # the one look-up: refused before the model loads
    if float(p["sample_fps"]) <= 0:
        raise ConfigError("sample_fps", f"must be > 0, got {p['sample_fps']}")
    config = session_config(p)  # checks its own values before the model loads
    if int(p["recall_chunks"]) < 0:
        raise ConfigError("recall_chunks", f"must be >= 0, got {p['recall_chunks']}")
    if int(p["archive_max_bytes"]) < 1:
        raise ConfigError("archive_max_bytes", f"must be >= 1, got {p['archive_max_bytes']}")
    adapter = load_adapter(str(p["model_path"]), device=str(p["device"]), dtype=str(p["dtype"]),
                           attention=str(p["attention"]), sample_fps=float(p["sample_fps"]),
                           vision_backend=str(p["vision_backend"]), vision_onnx_path=str(p["vision_onnx_path"]),
                           vision_onnx_providers=p["vision_onnx_providers"])
    if not config.evidence_layers:
        config = dataclasses.replace(config, evidence_layers=model_evidence_layers(adapter))
    p["budget_tokens"] = resolved_budget_tokens(int(p["budget_tokens"]), adapter)
    session = Session(adapter, policy_of_class(adapter, cls, p, config), config)
    if not archive_off(p["archive_path"]):
        encoder = _retrieval_encoder(str(p["retrieval_model_path"]), adapter.model_id, str(adapter.device))
        try:
            session.open_archive(str(p["archive_path"]), owner=str(p.get("archive_owner", "")), encoder=encoder,
                                 set_aside=bool(p.get("archive_set_aside", False)),
                                 max_bytes=int(p["archive_max_bytes"]), recall_chunks=int(p["recall_chunks"]),
                                 thumbnail_px=int(p["archive_thumbnail_px"]), sync=str(p["archive_sync"]),
                                 content=str(p["archive_content"]))
        except ArchiveError as err:  # held by another node, another model's, other cameras: nothing opened
            raise ConfigError("archive_path", str(err)) from None
    return session


def _retrieval_encoder(retrieval_model_path: str, model_id: str, device: str):
    """The archive's dual encoder (None: no index); ConfigError naming retrieval_model_path when it
    cannot be loaded."""
    path = resolve_retrieval_path(retrieval_model_path, model_id)
    if not path:
        return None
    return RetrievalEncoder.load(path, device=device)
