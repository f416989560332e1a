"""The node's ROS parameters: declared with descriptors (type, range, description), read, validated.

Names are those of docs/interfaces.md. Every engine parameter (``engine.factory.ENGINE_DEFAULTS``) is
declared, and every registered policy's settings as "<policy>.<setting>" (``hermes.reindex``,
``h2svc.w_s``), with the description and range its settings dataclass gives, so a YAML for any
policy works as soon as the policy is registered. Old names still work: each is declared too, with
its own default, and the factory resolves it. A bad value becomes a ConfigError naming the
parameter (the node then exits with code 2 and that one line).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException, ParameterException
from rclpy.validate_topic_name import validate_topic_name

from ..engine.cache import POLICIES, SettingInfo, policy_settings
from ..engine.cache.settings import INHERITED
from ..engine.errors import ConfigError
from ..engine.factory import ENGINE_DEFAULTS, family_aliases
from .image_conversion import DEFAULT_MAX_PIXELS

DEFAULT_CAMERA = "/camera/image_raw"


@dataclass(frozen=True)
class Spec:
    default: Any
    description: str
    low: float | int | None = None  # inclusive range, shown in rqt and enforced by rclpy
    high: float | int | None = None
    read_only: bool = True  # the session is built at configure: a change takes a reconfigure
    inherits: str | None = None  # default taken from this general parameter's value


BIG = 2**31 - 1
DESCRIPTIONS = {
    "model_path": "Model: a bundled tiny model's name, a local directory or a Hugging Face hub id "
                  "(Qwen2.5-VL or LLaVA-OneVision)",
    "policy": "KV cache policy: one of " + "|".join(sorted(POLICIES)),
    "budget_tokens": "Video tokens kept per layer by the policies that keep a budget ("
                     + ", ".join(sorted(p for p in POLICIES if POLICIES[p].settings_class.takes("budget_tokens")))
                     + "); must hold at least one frame",
    "sample_fps": "Frames per second taken into memory, by message stamp",
    "chunk_frames": "Frames per camera encoded and prefilled together",
    "device": "cpu | cuda | cuda:N | auto",
    "dtype": "auto | float32 | float16 | bfloat16 (auto: float32 on CPU, bf16/fp16 on CUDA)",
    "attention": "auto | sdpa | flash (flash-attn when importable)",
    "max_question_tokens": "Longest question accepted, in tokens with its prompt",
    "max_new_tokens": "Default answer length in tokens (a request's max_new_tokens = 0)",
    "repetition_penalty": "Greedy decoding's repetition penalty (1.0 = none)",
    "reindex": "Position re-index: lazy (near max_position_embeddings) | eager (after every chunk)",
    "reindex_margin": "Lazy re-index starts this many positions before max_position_embeddings",
    "vision_backend": "Vision encoder: torch | onnxruntime",
    "vision_onnx_path": "The .onnx file (or its directory) from streamcache-export-encoder (vision_backend onnxruntime)",
    "vision_onnx_providers": "onnxruntime execution providers: auto (TensorRT, CUDA, CPU as available) or e.g. 'cuda,cpu'",
    "evidence_k": "Evidence frames an answer names (a request's evidence_k = 0); 0 = none, and no attention "
                  "mass is computed",
    "evidence_layers": "Layers whose attention defines evidence; [] = the model folder's evidence_layers.json, "
                       "else the middle half of the layers",
}
RANGES = {
    "budget_tokens": (1, BIG), "sample_fps": (0.001, 1000.0), "chunk_frames": (1, 4096),
    "max_question_tokens": (1, BIG), "max_new_tokens": (1, BIG), "repetition_penalty": (0.0, 100.0),
    "reindex_margin": (0, BIG), "evidence_k": (0, 4096),
}
NODE_SPECS: dict[str, Spec] = {
    "camera_topics": Spec([DEFAULT_CAMERA], "Image topics remembered (sensor_msgs/Image; an entry ending in "
                                            "'/compressed' is sensor_msgs/CompressedImage)"),
    "autostart": Spec(True, "Configure and activate at start (a lifecycle node otherwise waits for "
                            "change_state)"),
    "max_image_pixels": Spec(DEFAULT_MAX_PIXELS, "Larger images are rejected before decoding", 1, BIG),
    "camera_min_rate": Spec(0.0, "Diagnostics: a camera slower than this (Hz) is WARN; 0 = sample_fps",
                            0.0, 1000.0, read_only=False),
    "max_frame_delay": Spec(5.0, "Diagnostics: frames stamped more than this many seconds before the "
                                 "node's clock are ERROR", 0.0, 1e9, read_only=False),
    "memory_snapshot_path": Spec("", "Memory kept across restarts: restored from this file at configure when "
                                     "it exists, written there at shutdown (empty = off)"),
    "memory_snapshot_period_s": Spec(0.0, "Also write the memory snapshot every this many seconds of ingest "
                                          "(0 = only at shutdown and on save_memory)", 0.0, 1e9),
    "reset_on_time_jump": Spec(False, "Forget the memory when a camera's stamps jump back by more than one "
                                      "sampling period (a bag loop); false keeps it and restarts sampling",
                               read_only=False),
}


def engine_specs() -> dict[str, Spec]:
    specs = {}
    for name, default in ENGINE_DEFAULTS.items():
        low, high = RANGES.get(name, (None, None))
        specs[name] = Spec(default, DESCRIPTIONS.get(name, "Engine parameter (docs/interfaces.md)"), low, high)
    return specs


def setting_spec(policy: str, info: SettingInfo, default=None, description: str = "") -> Spec:
    """A policy setting's parameter: its description, choices and range from the settings dataclass.
    An ``inherited`` setting (``reindex``, ``reindex_margin``) defaults to the general parameter's
    value, so ``reindex: eager`` applies to every policy and ``hermes.reindex: eager`` to hermes alone."""
    text = f"{policy}: {description or info.description}"
    if info.choices:
        text += f" (one of: {' | '.join(info.choices)})"
    inherits = info.name if info.scope == INHERITED else None
    if inherits:
        text += f" (default: the value of '{info.name}')"
    low, high = info.low, info.high
    if low is not None and high is None:
        high = BIG if isinstance(info.default, int) else 1e9
    return Spec(info.default if default is None else default, text, low, high, inherits=inherits)


def policy_specs() -> dict[str, Spec]:
    """"<policy>.<setting>" for every registered policy's settings, and their old names."""
    specs = {}
    for policy in sorted(POLICIES):
        infos = {info.name: info for info in policy_settings(policy)}
        for info in infos.values():
            specs[f"{policy}.{info.name}"] = setting_spec(policy, info)
            for alias in info.aliases:
                specs[f"{policy}.{alias}"] = setting_spec(policy, info,
                                                          description=f"old name of '{policy}.{info.name}'")
        for alias, (target, default, adapter) in family_aliases(policy).items():
            specs[f"{policy}.{alias}"] = setting_spec(
                policy, infos[target], default=default,
                description=f"'{policy}.{target}' for {adapter.family} models (old name; its default is that "
                            f"family's preset)")
    return specs


def all_specs() -> dict[str, Spec]:
    return {**NODE_SPECS, **engine_specs(), **policy_specs()}


def _plain(value: Any) -> Any:
    """A default as rclpy declares it: tuples become lists, a list of mixed numbers all floats."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in value) and any(isinstance(v, float) for v in value):
        value = [float(v) for v in value]
    return value


def descriptor(name: str, spec: Spec) -> ParameterDescriptor:
    d = ParameterDescriptor(name=name, description=spec.description, read_only=spec.read_only)
    value = _plain(spec.default)
    if value is None or value == []:
        d.dynamic_typing = True  # no type to infer from
    if spec.low is not None:
        if isinstance(value, float):
            d.floating_point_range = [FloatingPointRange(from_value=float(spec.low), to_value=float(spec.high))]
        elif isinstance(value, int) and not isinstance(value, bool):
            d.integer_range = [IntegerRange(from_value=int(spec.low), to_value=int(spec.high), step=1)]
    return d


def _reason(err: Exception, name: str, spec: Spec) -> str:
    text = str(err)
    if isinstance(err, InvalidParameterTypeException):
        found = re.search(r"to '(.*)' of type '(\w+)', expecting type '(\w+)'", text)
        if found:
            return f"expected {found.group(3).lower()}, got {found.group(2).lower()} '{found.group(1)}'"
    if isinstance(err, InvalidParameterValueException):
        found = re.search(r"Invalid parameter value \((.*)\) for parameter", text)
        value = found.group(1) if found else "the value"
        if spec.low is not None:
            return f"{value} is out of range [{spec.low}, {spec.high}]"
    return text.rsplit(": " + name, 1)[0]


def declare_all(node) -> dict[str, Any]:
    """Declare every parameter on ``node``; returns their values. Raises ConfigError."""
    values = {}
    for name, spec in all_specs().items():  # general parameters first: policy ones may inherit them
        default = values[spec.inherits] if spec.inherits else _plain(spec.default)
        try:
            param = node.declare_parameter(name, default, descriptor(name, spec))
        except (ParameterException, TypeError, ValueError) as err:
            raise ConfigError(name, _reason(err, name, spec)) from None
        value = param.value
        values[name] = list(value) if hasattr(value, "tolist") or isinstance(value, (list, tuple)) else value
    return values


def read_all(node) -> dict[str, Any]:
    """The current values of every declared parameter (after a reconfigure they may have changed)."""
    out = {}
    for name in all_specs():
        value = node.get_parameter(name).value
        out[name] = list(value) if hasattr(value, "tolist") or isinstance(value, (list, tuple)) else value
    return out


# string parameters whose every value is known here (the engine checks the rest in build_session)
CHOICES = {"attention": ("auto", "sdpa", "flash")}


def validate_node_params(values: dict[str, Any]) -> None:
    """What rclpy's descriptors cannot say; the engine checks its own parameters in build_session."""
    for name, allowed in CHOICES.items():
        if name in values and values[name] not in allowed:
            raise ConfigError(name, f"'{values[name]}' is not one of {'|'.join(allowed)}")
    topics = values["camera_topics"]
    if not topics:
        raise ConfigError("camera_topics", "is empty: name at least one image topic")
    seen = set()
    for topic in topics:
        if not isinstance(topic, str) or not topic.strip():
            raise ConfigError("camera_topics", "has an empty entry")
        try:
            validate_topic_name(topic)
        except Exception as err:  # noqa: BLE001 - InvalidTopicNameException with rcl's reason
            reason = str(err).splitlines()[0]
            raise ConfigError("camera_topics", f"'{topic}' is not a valid topic name ({reason})") from None
        if topic in seen:
            raise ConfigError("camera_topics", f"'{topic}' is listed twice")
        seen.add(topic)


def unknown_overrides(node) -> list[str]:
    """Parameters given (YAML, -p) that the node does not declare: most likely typos."""
    declared = set(all_specs()) | {"use_sim_time", "diagnostic_updater.period", "diagnostic_updater.use_fqn",
                                   "start_type_description_service"}
    overrides = getattr(node, "_parameter_overrides", {})  # rclpy keeps them until declared
    return sorted(name for name in overrides if name not in declared and not name.startswith("qos_overrides."))


def engine_params(values: dict[str, Any]) -> dict[str, Any]:
    """The flat dict ``engine.factory.build_session`` takes."""
    engine = set(ENGINE_DEFAULTS) | set(policy_specs())
    return {name: value for name, value in values.items() if name in engine}
