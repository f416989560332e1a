"""Replay a rosbag2 into streamcache_node (use_sim_time, /clock from the bag).

    ros2 launch streamcache_ros replay.launch.py bag:=data/demo_bag
    ros2 launch streamcache_ros replay.launch.py bag:=/data/run3 rate:=4 lock_step:=true

Takes the live launch's arguments too (params_file, policy_params_file, camera_topics, model_path ...).
Before anything starts, the bag's image topics are checked against the node's camera_topics: when
none is one of them the launch ends at once, naming both. The node stays up after the bag ends, to be
asked (streamcache-ask); ``shutdown_after_replay:=true`` ends the launch with the replay instead.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, LogInfo, OpaqueFunction, RegisterEventHandler
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from streamcache_ros.tools.launching import PACKAGE, answer_sigint, check_bag_topics, dds_environment, is_true, \
    node_actions, node_arguments


REPLAY_ARGUMENTS = ("bag", "rate", "lock_step", "shutdown_after_replay")


def _replay(context):
    warnings = check_bag_topics(context)  # raises (the launch ends, exit code 1) when nothing matches
    arguments = [LaunchConfiguration("bag").perform(context), "--clock", "--wait", "120"]
    if is_true(context, "lock_step"):
        arguments += ["--lock-step", "--namespace", LaunchConfiguration("namespace").perform(context)]
    rate = LaunchConfiguration("rate").perform(context).strip()
    arguments += ["--fast"] if rate in ("0", "fast") else ["--rate", rate]
    replay = Node(package=PACKAGE, executable="streamcache-replay", name="streamcache_replay",
                  arguments=arguments, output="screen", additional_env=dds_environment(context))
    actions = [LogInfo(msg=f"replay.launch.py: {w}") for w in warnings]
    actions += node_actions(context, use_sim_time=True, own_arguments=REPLAY_ARGUMENTS) + [replay]
    if is_true(context, "shutdown_after_replay"):
        actions.append(RegisterEventHandler(OnProcessExit(target_action=replay,
                                                          on_exit=[EmitEvent(event=Shutdown(reason="replay done"))])))
    return actions


def generate_launch_description():
    answer_sigint()  # a launch in a script's background stops on SIGINT too
    return LaunchDescription([
        *node_arguments(),
        DeclareLaunchArgument("bag", description="a rosbag2 directory (sqlite3 or mcap)"),
        DeclareLaunchArgument("rate", default_value="1.0", description="replay speed; 0 = as fast as possible"),
        DeclareLaunchArgument("lock_step", default_value="false",
                              description="wait for the node to take each frame (nothing dropped)"),
        DeclareLaunchArgument("shutdown_after_replay", default_value="false"),
        OpaqueFunction(function=_replay),
    ])
