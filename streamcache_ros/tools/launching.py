"""What launch/live.launch.py and launch/replay.launch.py share: the node's launch arguments and the
streamcache_node action built from them (imports launch / launch_ros: only launch files use this)."""
from __future__ import annotations

import os

import yaml
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration

PACKAGE = "streamcache_ros"
# launch argument -> (parameter, type); '' leaves the parameter to the YAML files
OVERRIDES = {"camera_topics": list, "model_path": str, "policy": str, "budget_tokens": int, "device": str,
             "sample_fps": float}


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
                              description="a policy's parameters, e.g. config/hermes.yaml ('' = none)"),
        DeclareLaunchArgument("camera_topics", default_value="",
                              description="YAML list, e.g. \"['/front/image_raw', '/rear/image_raw/compressed']\""),
        DeclareLaunchArgument("model_path", default_value="", description="'' = from params_file"),
        DeclareLaunchArgument("policy", default_value="", description="full | fifo | hermes | h2svc ('' = from the YAML)"),
        DeclareLaunchArgument("budget_tokens", default_value="", description="'' = from the YAML"),
        DeclareLaunchArgument("sample_fps", default_value="", description="'' = from the YAML"),
        DeclareLaunchArgument("device", default_value="", description="cpu | cuda | auto ('' = from the YAML)"),
        DeclareLaunchArgument("log_level", default_value="info"),
        DeclareLaunchArgument("aggregator", default_value="false",
                              description="also start diagnostic_aggregator with config/diagnostic_aggregator.yaml"),
    ]


def overrides(context) -> dict:
    """The non-empty override arguments as parameters (typed)."""
    values = {}
    for name, kind in OVERRIDES.items():
        text = LaunchConfiguration(name).perform(context).strip()
        if not text:
            continue
        if kind is list:
            parsed = yaml.safe_load(text)
            values[name] = [parsed] if isinstance(parsed, str) else [str(t) for t in parsed]
        else:
            values[name] = kind(text)
    return values


def node_actions(context, use_sim_time: bool = False) -> list:
    """streamcache_node with the YAML files and overrides (and the aggregator when asked)."""
    from launch_ros.actions import Node  # noqa: PLC0415

    parameters = [LaunchConfiguration("params_file").perform(context)]
    policy_file = LaunchConfiguration("policy_params_file").perform(context).strip()
    if policy_file:
        parameters.append(policy_file)
    parameters.append({**overrides(context), "use_sim_time": use_sim_time})
    actions = [Node(package=PACKAGE, executable="streamcache_node",
                    name=LaunchConfiguration("node_name").perform(context),
                    namespace=LaunchConfiguration("namespace").perform(context),
                    parameters=parameters, output="screen", emulate_tty=True,
                    arguments=["--ros-args", "--log-level", LaunchConfiguration("log_level").perform(context)])]
    if LaunchConfiguration("aggregator").perform(context).lower() in ("true", "1", "yes"):
        actions.append(Node(package="diagnostic_aggregator", executable="aggregator_node", output="screen",
                            parameters=[os.path.join(share_dir(), "config", "diagnostic_aggregator.yaml")]))
    return actions
