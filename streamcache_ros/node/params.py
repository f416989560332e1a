"""The node's ROS parameters: declared with descriptors (type, range, description), read, validated.

Names are those of docs/interfaces.md, whose parameter tables are made from these declarations
(scripts/check_docs.py --write; the check fails where they differ). The node's own parameters are
here; the engine's, and every registered policy's settings as "<policy>.<setting>"
(``hermes.reindex``, ``h2svc.w_s``) with their old names, come from ``engine.parameters``, so a YAML
for any policy works as soon as the policy is registered. A bad value becomes a ConfigError naming
the parameter (the node then exits with code 2 and that one line).
"""
from __future__ import annotations

import re
from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, SetParametersResult
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException, ParameterException
from rclpy.parameter import Parameter
from rclpy.validate_topic_name import validate_topic_name

from ..engine.errors import ConfigError, StreamCacheError
from ..engine.parameters import ParameterInfo, engine_parameters, setting_parameters
from .image_conversion import DEFAULT_MAX_PIXELS
from .snapshots import DEFAULT_ARCHIVE, default_snapshot_dir

DEFAULT_CAMERA = "/camera/image_raw"
# runtime=True: may change while the node runs (tuning.py); False: read at configure, so a change while
# configured is refused with the reason and the way (a lifecycle reconfigure or a restart); choices:
# every value a string parameter may take, checked at configure
Spec = ParameterInfo
BIG, BIG_FLOAT = 2**31 - 1, 1e9  # the top of a range open above, as the descriptor gives it
NODE_SPECS: dict[str, Spec] = {
    "camera_topics": Spec([DEFAULT_CAMERA], "Image topics remembered (sensor_msgs/Image; an entry ending in "
                                            "'/compressed' is sensor_msgs/CompressedImage)"),
    "autostart": Spec(True, "Configure and activate at start (a lifecycle node otherwise waits for "
                            "change_state)"),
    "max_image_pixels": Spec(DEFAULT_MAX_PIXELS, "Larger images are rejected before decoding", 1),
    "camera_min_rate": Spec(0.0, "Diagnostics: a camera slower than this (Hz) is WARN; 0 = sample_fps",
                            0.0, 1000.0, runtime=True),
    "max_frame_delay": Spec(5.0, "Diagnostics: frames stamped more than this many seconds before the "
                                 "node's clock are ERROR (for a replay faster than real time: behind the "
                                 "stream's own clock, docs/interfaces.md \"Diagnostics\")", 0.0, runtime=True),
    "memory_snapshot_path": Spec("", "Memory kept across restarts: restored from this file at configure when "
                                     "it exists, written there at shutdown (empty = off)"),
    "snapshot_dir": Spec(default_snapshot_dir(), "The only folder save_memory and load_memory may touch: their paths "
                                                 "are names relative to it (default <ROS home>/streamcache/snapshots, "
                                                 "the ROS home being $ROS_HOME or ~/.ros)"),
    "frame_queue_size": Spec(16, "Sampled frames per camera that may wait for the encoder (a chunk being encoded, a "
                                 "question answered); beyond that the oldest is dropped and counted", 1, 4096),
    "memory_snapshot_period_s": Spec(0.0, "Also write the memory snapshot every this many seconds of ingest "
                                          "(0 = only at shutdown and on save_memory)", 0.0),
    "reset_on_time_jump": Spec(False, "Forget the memory when a camera's stamps jump back by more than one "
                                      "sampling period (a bag loop); false keeps it and restarts sampling",
                               runtime=True),
    # the engine's archive_path, with the node's own default: one folder per node
    "archive_path": Spec(DEFAULT_ARCHIVE, "The archive (docs/archive.md): every chunk also kept on disk, recalled by "
                                          "questions that reach past the working memory, kept across restarts; a "
                                          "folder, '' or 'off' = off, 'default' = <ROS home>/streamcache/archive/"
                                          "<the node's full name>, one per node"),
    "pose_topic": Spec("", "Where the robot is (docs/places.md): an odometry (nav_msgs/Odometry), PoseStamped or "
                           "PoseWithCovarianceStamped topic, told apart by its type; every frame gets the pose at "
                           "its stamp (empty = none, or TF with pose_source)"),
    "pose_source": Spec("auto", "topic | tf | off | auto: auto reads pose_topic when set, else TF "
                                "(pose_map_frame -> pose_base_frame) where tf2_ros is importable, else nothing"),
    "pose_map_frame": Spec("map", "TF: the fixed frame poses are given in"),
    "pose_base_frame": Spec("base_link", "TF: the robot's frame"),
    "pose_tolerance_s": Spec(0.5, "A frame's pose is interpolated between the poses around its stamp, each at "
                                  "most this many seconds away (else the nearest within it); a frame with none is "
                                  "kept without a pose, and says so", 0.001, 60.0),
    "places_file": Spec("", "Named places a question can be limited to (docs/places.md): YAML with frame_id and "
                            "places: {name: {x, y, radius}} (empty = none; a point and radius still work)"),
    "watch_questions": Spec([], "Standing yes/no questions, each asked over the window of every chunk just encoded; "
                                "every answer is published on watch_events (WatchEvent)", runtime=True),
}
# defaults that depend on the machine, as the docs show them
SHOWN_DEFAULTS = {"snapshot_dir": "<ROS home>/streamcache/snapshots"}
RUNTIME_CONSTRAINT = "may change while the node runs"  # a runtime parameter's descriptor says so


def all_specs() -> dict[str, Spec]:
    """Every parameter the node declares: its own, the engine's, the policies' settings."""
    engine = {name: spec for name, spec in engine_parameters().items() if name not in NODE_SPECS}
    return {**NODE_SPECS, **engine, **setting_parameters()}


def plain(value: Any) -> Any:
    """A default as rclpy declares it: tuples become lists, a list of mixed numbers all floats."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in value) and any(isinstance(v, float) for v in value):
        value = [float(v) for v in value]
    return value


# The element type of each array parameter whose default is empty (nothing to infer it from)
EMPTY_ARRAY_TYPES = {"watch_questions": Parameter.Type.STRING_ARRAY, "evidence_layers": Parameter.Type.INTEGER_ARRAY,
                     "hermes.mid_omega": Parameter.Type.DOUBLE_ARRAY, "hermes.mid_k": Parameter.Type.DOUBLE_ARRAY,
                     "h2svc.ratios": Parameter.Type.DOUBLE_ARRAY}


def declared_type(name: str, spec: Spec) -> Parameter.Type:
    """The type a parameter holds: its default's, or for an empty array EMPTY_ARRAY_TYPES's."""
    value = plain(spec.default)
    if isinstance(value, list) and not value:
        if name not in EMPTY_ARRAY_TYPES:
            raise TypeError(f"parameter '{name}' has an empty default: give its type in EMPTY_ARRAY_TYPES")
        return EMPTY_ARRAY_TYPES[name]
    return Parameter.Type.from_parameter_value(value)


# Words a string parameter takes that ROS reads as YAML 1.1 booleans: `-p archive_path:=off` reaches
# the node as bool false, meaning no archive; `-p retrieval_model_path:=off` no index
# (docs/interfaces.md "Parameters")
BOOL_WORDS = {("archive_path", False): "off", ("retrieval_model_path", False): "off"}


def as_declared(param: Parameter, kind: Parameter.Type) -> Parameter:
    """``param`` in its declared type where that loses nothing: an integer for a double (``ros2 param
    set … sample_fps 1``, ``sample_fps: 1`` in a YAML), integers for doubles, and an empty array of any
    type or none (the ros2 CLI makes ``[]`` a bool array, a YAML no value) as the declared array."""
    value, got = param.value, param.type_
    if got == kind:
        return param
    if kind == Parameter.Type.STRING and got == Parameter.Type.BOOL and (param.name, value) in BOOL_WORDS:
        return Parameter(param.name, kind, BOOL_WORDS[(param.name, value)])
    if kind == Parameter.Type.DOUBLE and got == Parameter.Type.INTEGER:
        return Parameter(param.name, kind, float(value))
    if kind.name.endswith("_ARRAY") and (got == Parameter.Type.NOT_SET or got.name.endswith("_ARRAY") and len(value) == 0):
        return Parameter(param.name, kind, [])  # a YAML's [] reaches rclpy as no value at all
    if kind == Parameter.Type.DOUBLE_ARRAY and got == Parameter.Type.INTEGER_ARRAY:
        return Parameter(param.name, kind, [float(v) for v in value])
    return param


def type_error(param: Parameter, kind: Parameter.Type) -> str:
    """'' when ``param`` holds its declared type, else the node's reason."""
    if param.type_ == kind:
        return ""
    if param.type_ == Parameter.Type.NOT_SET:
        return f"expected {kind.name.lower()}, got no value: a parameter of streamcache_node cannot be unset"
    value = list(param.value) if param.type_.name.endswith("_ARRAY") else param.value
    return f"expected {kind.name.lower()}, got {param.type_.name.lower()} '{value}'"


def typing_callbacks(node) -> tuple:
    """(pre-set, on-set) callbacks that give ``node``'s parameters their declared types at runtime:
    a value that converts losslessly is converted (``as_declared``), any other type is refused with
    the node's reason naming the parameter. Every parameter is declared with dynamic typing so that a
    wrong type reaches this check instead of rclpy's ("Wrong parameter type, expected ..."); ``ros2
    param describe/get`` then show the type of the value held, always the declared one."""
    kinds = {name: declared_type(name, spec) for name, spec in all_specs().items()}

    def convert(changed: list) -> list:
        return [as_declared(p, kinds[p.name]) if p.name in kinds else p for p in changed]

    def check(changed: list) -> SetParametersResult:
        for param in changed:
            reason = type_error(param, kinds[param.name]) if param.name in kinds else ""
            if reason:
                # rclpy has already written the refused value's type into the stored descriptor
                # (dynamic typing): put the declared one back, or `ros2 param describe` shows it
                for name in (p.name for p in changed if p.name in kinds):
                    node.describe_parameter(name).type = kinds[name].value
                return SetParametersResult(successful=False, reason=f"parameter '{param.name}': {reason}")
        return SetParametersResult(successful=True)

    return convert, check


def descriptor(name: str, spec: Spec) -> ParameterDescriptor:
    # never read_only: rclpy would refuse a change with no reason, and a lifecycle reconfigure could not
    # change it either; tuning.py refuses what cannot change while configured, saying why and how.
    # dynamic_typing: the node checks types itself (typing_callbacks), with its own message
    d = ParameterDescriptor(name=name, description=spec.description, additional_constraints=(
        RUNTIME_CONSTRAINT if spec.runtime else
        "fixed while the node is configured: change it with a lifecycle reconfigure or a restart"),
        type=declared_type(name, spec).value, dynamic_typing=True)
    value = plain(spec.default)
    low, high = value_range(spec)
    if low is not None:
        if isinstance(value, float):
            d.floating_point_range = [FloatingPointRange(from_value=float(low), to_value=float(high))]
        elif isinstance(value, int) and not isinstance(value, bool):
            d.integer_range = [IntegerRange(from_value=int(low), to_value=int(high), step=1)]
    return d


def value_range(spec: Spec) -> tuple[Any, Any]:
    """The inclusive range a descriptor gives: open above is BIG (BIG_FLOAT for a float)."""
    if spec.low is None or spec.high is not None:
        return spec.low, spec.high
    return spec.low, BIG_FLOAT if isinstance(spec.default, float) else BIG


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
            return f"{value} is out of range [{', '.join(str(v) for v in value_range(spec))}]"
    return text.rsplit(": " + name, 1)[0]


def declare_all(node) -> dict[str, Any]:
    """Declare every parameter on ``node``; returns their values. Raises ConfigError."""
    values = {}
    for name, spec in all_specs().items():  # general parameters first: policy ones may inherit them
        default = values[spec.inherits] if spec.inherits else plain(spec.default)
        kind = declared_type(name, spec)
        try:
            param = node.declare_parameter(name, default, descriptor(name, spec))
        except (ParameterException, TypeError, ValueError) as err:
            raise ConfigError(name, _reason(err, name, spec)) from None
        typed = as_declared(param, kind)
        reason = type_error(typed, kind)
        if reason:
            raise ConfigError(name, reason)
        if typed is not param:  # held in its declared type from the start (ros2 param get shows it)
            result = node.set_parameters([typed])[0]
            if not result.successful:  # a converted value out of range
                raise ConfigError(name, f"{typed.value} is out of range [{', '.join(str(v) for v in value_range(spec))}]")
            param = typed
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


def validate_node_params(values: dict[str, Any]) -> None:
    """What rclpy's descriptors cannot say: a value outside a declaration's choices, the cameras, the
    standing questions; the engine checks the rest of its own parameters in build_session."""
    for name, spec in all_specs().items():
        if spec.choices and name in values and values[name] not in spec.choices:
            raise ConfigError(name, f"'{values[name]}' is not one of {'|'.join(spec.choices)}")
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
    check_watch_questions(values.get("watch_questions", []))


# Standing questions asked at once, at most: each is a row of every chunk's pass and a key of every
# archived chunk's noted answers, so the list is bounded as a chunk's cost is (docs/interfaces.md
# "Standing questions")
MAX_WATCH_QUESTIONS = 16


def check_watch_questions(questions, session=None) -> list[str]:
    """watch_questions: at most MAX_WATCH_QUESTIONS non-empty strings (checked at configure and on a
    runtime change); with ``session``, each one a question `when` takes (Session.check_yes_no_question:
    yes/no, in the model's words, no longer than Ask's limit)."""
    if not isinstance(questions, (list, tuple)) or any(not isinstance(q, str) for q in questions):
        raise ConfigError("watch_questions", "must be a list of strings (questions)")
    if any(not q.strip() for q in questions):
        raise ConfigError("watch_questions", "has an empty question")
    if len(questions) > MAX_WATCH_QUESTIONS:
        raise ConfigError("watch_questions", f"has {len(questions)} questions: at most {MAX_WATCH_QUESTIONS} stand "
                                             "at once; remove one first")
    for question in questions if session is not None else ():
        try:
            session.check_yes_no_question(question)
        except StreamCacheError as err:
            raise ConfigError("watch_questions", f"not a standing question: {err}") from None
    return [str(q) for q in questions]


def unknown_overrides(node) -> list[str]:
    """Parameters given (YAML, -p) that the node does not declare: most likely typos."""
    declared = set(all_specs()) | {"use_sim_time", "diagnostic_updater.period", "diagnostic_updater.use_fqn",
                                   "start_type_description_service"}
    overrides = getattr(node, "_parameter_overrides", {})  # rclpy keeps them until declared
    return sorted(name for name in overrides if name not in declared and not name.startswith("qos_overrides."))


def engine_params(values: dict[str, Any]) -> dict[str, Any]:
    """The flat dict ``engine.factory.build_session`` takes."""
    engine = set(engine_parameters()) | set(setting_parameters())
    return {name: value for name, value in values.items() if name in engine}
