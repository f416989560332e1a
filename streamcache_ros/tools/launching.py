"""What launch/live.launch.py and launch/replay.launch.py share: the node's launch arguments and the
streamcache_node action built from them, and the check that a bag's topics are the node's cameras
(imports launch / launch_ros: only launch files use this)."""
from __future__ import annotations

import os
import signal
import threading

import yaml
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration

PACKAGE = "streamcache_ros"
# launch argument -> (parameter, type); '' leaves the parameter to the YAML files
OVERRIDES = {"camera_topics": list, "model_path": str, "policy": str, "budget_tokens": int, "device": str,
             "sample_fps": float, "memory_snapshot_path": str, "watch_questions": list, "pose_topic": str,
             "places_file": str}
KIND_WORDS = {int: "an integer", float: "a number", bool: "true or false", list: "a YAML list, e.g. \"['a', 'b']\"",
              "numbers": "a YAML list of numbers, e.g. \"[1, 2]\""}
DEFAULT_CAMERA_TOPICS = ["/camera/image_raw"]  # the node's own default (node/params.py)
FASTDDS_PROFILE = "fastdds_large_images.xml"  # in config/: docs/setup.md, "Large images and Fast DDS"


def answer_sigint() -> None:
    """Let a launch started in a script's background stop on SIGINT (docs/setup.md "From a script").
    A shell starts a background job with SIGINT ignored, and the ignoring survives exec, so Python
    installs no handler for it; launch hears a signal only through Python's handler (signal's wakeup
    fd), so the SIGINT never reached it and the node kept running. With a handler back, launch stops
    its nodes as after Ctrl-C. Called while the launch file is loaded, on launch's main thread."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def share_dir() -> str:
    try:
        from ament_index_python.packages import get_package_share_directory  # noqa: PLC0415

        return get_package_share_directory(PACKAGE)
    except Exception:  # noqa: BLE001 - not installed the ROS way: this checkout's own files
        return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def node_arguments() -> list[DeclareLaunchArgument]:
    config = os.path.join(share_dir(), "config")
    return [
        DeclareLaunchArgument("namespace", default_value="streamcache", description="the node's namespace"),
        DeclareLaunchArgument("node_name", default_value="streamcache_node"),
        DeclareLaunchArgument("params_file", default_value=os.path.join(config, "streamcache.yaml"),
                              description="general parameters (config/streamcache.yaml)"),
        DeclareLaunchArgument("policy_params_file", default_value="",
                              description="a policy's parameters, e.g. config/hermes.yaml, layered on top of "
                                          "params_file (its values win) ('' = none)"),
        DeclareLaunchArgument("camera_topics", default_value="",
                              description="YAML list, e.g. \"['/front/image_raw', '/rear/image_raw/compressed']\""),
        DeclareLaunchArgument("model_path", default_value="", description="'' = from params_file"),
        DeclareLaunchArgument("policy", default_value="", description="full | fifo | hermes | h2svc | uniform ('' = from the YAML)"),
        DeclareLaunchArgument("budget_tokens", default_value="", description="'' = from the YAML"),
        DeclareLaunchArgument("sample_fps", default_value="", description="'' = from the YAML"),
        DeclareLaunchArgument("device", default_value="", description="cpu | cuda | auto ('' = from the YAML)"),
        DeclareLaunchArgument("memory_snapshot_path", default_value="",
                              description="memory kept across restarts in this file ('' = from the YAML)"),
        DeclareLaunchArgument("watch_questions", default_value="",
                              description="standing yes/no questions, a YAML list: \"['Did you see a red circle?']\" "
                                          "('' = from the YAML; \"[]\" = none)"),
        DeclareLaunchArgument("pose_topic", default_value="",
                              description="odometry / pose topic giving every frame its pose ('' = from the YAML)"),
        DeclareLaunchArgument("places_file", default_value="",
                              description="named places a question can be limited to ('' = from the YAML)"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="the node's clock from /clock (a player that publishes one); "
                                          "replay.launch.py: always true"),
        DeclareLaunchArgument("log_level", default_value="info"),
        DeclareLaunchArgument("aggregator", default_value="false",
                              description="also start diagnostic_aggregator with config/diagnostic_aggregator.yaml"),
        DeclareLaunchArgument("respawn", default_value="false",
                              description="start the node again whenever it ends (a crash, a bad parameter too), "
                                          "after respawn_delay seconds; a launch stopped with SIGINT does not"),
        DeclareLaunchArgument("respawn_delay", default_value="2.0", description="seconds before a respawn"),
        DeclareLaunchArgument("fastdds_profile", default_value="",
                              description=f"a Fast DDS XML profile for the node (and the replay), e.g. "
                                          f"{os.path.join(config, FASTDDS_PROFILE)} for large raw images; '' = none"),
    ]


def overrides(context) -> dict:
    """The non-empty override arguments as parameters (typed)."""
    values = {}
    for name, kind in OVERRIDES.items():
        text = LaunchConfiguration(name).perform(context).strip()
        if text:
            values[name] = typed_argument(name, text, kind)
    return values


def typed_argument(name: str, text: str, kind):
    """A launch argument's text as its parameter's type (str, int, float, bool, list: of strings,
    "numbers": a list of numbers); a RuntimeError naming the argument otherwise, which ends the launch
    with that line before anything starts."""
    if kind is str:
        return text
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        parsed = None
    number = isinstance(parsed, (int, float)) and not isinstance(parsed, bool)
    if kind is list and isinstance(parsed, (list, str)):
        return [parsed] if isinstance(parsed, str) else [str(item) for item in parsed]
    if kind == "numbers" and isinstance(parsed, list) and all(isinstance(v, (int, float)) for v in parsed):
        return parsed
    if kind is float and not number:
        try:
            return float(text)  # YAML reads 1e-3 as a string
        except ValueError:
            pass
    if (kind is float and number) or (kind is int and isinstance(parsed, int) and number) or \
            (kind is bool and isinstance(parsed, bool)):
        return kind(parsed)
    raise RuntimeError(f"launch argument {name}:={text!r} is not {KIND_WORDS[kind]}")


def parameter_arguments(context, own_arguments) -> tuple[dict, list[str]]:
    """Launch arguments given that this launch file does not declare: each one that names a
    streamcache_node parameter (``max_new_tokens:=32``, ``hermes.reindex:=eager``) is passed to the node,
    typed as the node declares it; the names of the rest are returned (nothing uses them). The node's
    parameters are read only when such an argument is given (it imports the engine)."""
    others = sorted(set(context.launch_configurations) - set(own_arguments))
    if not others:
        return {}, []
    from rclpy.parameter import Parameter  # noqa: PLC0415

    from ..node.params import all_specs, declared_type  # noqa: PLC0415

    kinds = {Parameter.Type.STRING: str, Parameter.Type.INTEGER: int, Parameter.Type.DOUBLE: float,
             Parameter.Type.BOOL: bool, Parameter.Type.STRING_ARRAY: list,
             Parameter.Type.INTEGER_ARRAY: "numbers", Parameter.Type.DOUBLE_ARRAY: "numbers"}
    specs = all_specs()
    values, unused = {}, []
    for name in others:
        text = LaunchConfiguration(name).perform(context).strip()
        if name in specs:
            values[name] = typed_argument(name, text, kinds[declared_type(name, specs[name])])
        else:
            unused.append(name)
    return values, unused


def node_actions(context, use_sim_time: bool = False, own_arguments: tuple = ()) -> list:
    """streamcache_node with the YAML files and overrides (and the aggregator when asked);
    ``own_arguments``: the launch file's arguments besides node_arguments' (they are not parameters)."""
    from launch.actions import LogInfo  # noqa: PLC0415
    from launch_ros.actions import Node  # noqa: PLC0415

    parameters = [LaunchConfiguration("params_file").perform(context)]
    policy_file = LaunchConfiguration("policy_params_file").perform(context).strip()
    if policy_file:
        parameters.append(policy_file)
    given, unused = parameter_arguments(context, [a.name for a in node_arguments()] + list(own_arguments))
    use_sim_time = use_sim_time or is_true(context, "use_sim_time")
    parameters.append({**given, **overrides(context), "use_sim_time": use_sim_time})
    node = Node(package=PACKAGE, executable="streamcache_node",
                    name=LaunchConfiguration("node_name").perform(context),
                    namespace=LaunchConfiguration("namespace").perform(context),
                    parameters=parameters, output="screen", emulate_tty=True,
                    respawn=is_true(context, "respawn"),
                    respawn_delay=float(LaunchConfiguration("respawn_delay").perform(context)),
                    additional_env=dds_environment(context),
                    arguments=["--ros-args", "--log-level", LaunchConfiguration("log_level").perform(context)])
    actions = [LogInfo(msg=f"launch argument {name}: neither an argument of this launch file nor a streamcache_node "
                           f"parameter: unused") for name in unused] + [node]
    if not is_true(context, "respawn"):  # respawn: launch starts it again instead
        actions.append(end_with(node))
    if is_true(context, "aggregator"):
        actions.append(Node(package="diagnostic_aggregator", executable="aggregator_node", output="screen",
                            parameters=[os.path.join(share_dir(), "config", "diagnostic_aggregator.yaml")]))
    return actions


class NodeFailed(RuntimeError):
    """streamcache_node ended with a nonzero exit code (or a signal) while the launch ran."""


def end_with(node):
    """The launch ends when the node does, with its outcome (docs/setup.md "Exit codes"): a clean
    exit (0: a lifecycle shutdown, or SIGINT to the launch) shuts the launch down with code 0; a
    crash, a kill or a bad parameter (exit code 2) raises NodeFailed, which launch logs and turns
    into its own return code 1, so `ros2 launch` exits 1 and systemd's Restart=on-failure restarts it.
    (launch's return code is 0 or 1: the node's own code is in the logged line.)"""
    from launch.actions import EmitEvent, RegisterEventHandler  # noqa: PLC0415
    from launch.event_handlers import OnProcessExit  # noqa: PLC0415
    from launch.events import Shutdown  # noqa: PLC0415

    def on_exit(event, context):
        code = event.returncode
        if code != 0:
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            raise NodeFailed(f"{event.action.name} ended with {how}: the launch ends with return code 1")
        return [EmitEvent(event=Shutdown(reason=f"{event.action.name} ended (exit code 0)"))]

    return RegisterEventHandler(OnProcessExit(target_action=node, on_exit=on_exit))


def is_true(context, name: str) -> bool:
    return LaunchConfiguration(name).perform(context).strip().lower() in ("true", "1", "yes")


def dds_environment(context) -> dict:
    """The Fast DDS profile file for a process (both variable names: Fast DDS 3 and 2)."""
    profile = LaunchConfiguration("fastdds_profile").perform(context).strip()
    if not profile:
        return {}
    if not os.path.isfile(profile):
        raise RuntimeError(f"fastdds_profile '{profile}' does not exist")
    profile = os.path.abspath(profile)
    return {"FASTDDS_DEFAULT_PROFILES_FILE": profile, "FASTRTPS_DEFAULT_PROFILES_FILE": profile}


def camera_topics(context) -> list[str]:
    """The node's camera_topics as the launch gives them: the argument, else the last YAML file that
    sets them (policy_params_file over params_file), else the node's default."""
    given = overrides(context).get("camera_topics")
    if given:
        return given
    node = LaunchConfiguration("node_name").perform(context)
    namespace = LaunchConfiguration("namespace").perform(context).strip("/")
    found = DEFAULT_CAMERA_TOPICS
    for name in ("params_file", "policy_params_file"):
        path = LaunchConfiguration(name).perform(context).strip()
        if not path or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            content = yaml.safe_load(f) or {}
        for section, body in content.items():  # /**, the node's name, or its full name
            if section.strip("/") in ("**", node, f"{namespace}/{node}".strip("/")) and isinstance(body, dict):
                topics = (body.get("ros__parameters") or {}).get("camera_topics")
                if topics:
                    found = [topics] if isinstance(topics, str) else [str(t) for t in topics]
    return found


def resolve(topic: str, namespace: str, node: str) -> str:
    """A topic name as the node in ``namespace`` resolves it (remaps aside)."""
    prefix = "/" + namespace.strip("/") if namespace.strip("/") else ""
    if topic.startswith("~"):
        return f"{prefix}/{node}{topic[1:]}"
    return topic if topic.startswith("/") else f"{prefix}/{topic}"


def check_bag_topics(context) -> list[str]:
    """At launch, before anything starts: the bag's image topics against the node's cameras. None in
    common is an error naming both (else the replay would wait for a subscriber in silence); a
    partial match gives warnings (returned)."""
    from . import bagfile  # noqa: PLC0415

    bag = LaunchConfiguration("bag").perform(context)
    if not os.path.isfile(os.path.join(bag, "metadata.yaml")):
        raise RuntimeError(f"bag '{bag}' is not a rosbag2 directory (no metadata.yaml)")
    in_bag = sorted(bagfile.image_topics(bag))
    namespace, node = LaunchConfiguration("namespace").perform(context), LaunchConfiguration("node_name").perform(context)
    cameras = {resolve(t, namespace, node): t for t in camera_topics(context)}
    if not set(in_bag) & set(cameras):
        raise RuntimeError(
            f"the bag's image topics ({', '.join(in_bag) or 'none'}) are none of the node's camera_topics "
            f"({', '.join(cameras)}, resolved in namespace '/{namespace.strip('/')}'): set "
            f"camera_topics:=\"['{in_bag[0] if in_bag else '/camera/image_raw'}']\" or record the cameras the node listens to")
    warnings = [f"the bag has no {topic}: that camera stays silent" for topic in cameras if topic not in in_bag]
    warnings += [f"{topic} is in the bag and in no camera_topics entry: nobody takes it" for topic in in_bag
                 if topic not in cameras]
    return warnings
