"""streamcache_node on live cameras.

    ros2 launch streamcache_ros live.launch.py
    ros2 launch streamcache_ros live.launch.py camera_topics:="['/front/image_raw']" \
        model_path:=Qwen/Qwen2.5-VL-3B-Instruct device:=cuda policy_params_file:=/path/to/config/hermes.yaml
    ros2 launch streamcache_ros live.launch.py respawn:=true fastdds_profile:=/path/to/config/fastdds_large_images.xml

Parameters come from ``params_file`` (config/streamcache.yaml), then ``policy_params_file`` on top of
it, then the non-empty override arguments. The node lives in ``namespace`` (default
``streamcache``); ``respawn:=true`` starts it again whenever it ends (docs/setup.md, "Running on a
robot"). Otherwise the launch ends with the node: exit code 0 after SIGINT (from a script too), 1
when the node crashes, is killed or refuses a parameter (docs/setup.md "Exit codes").
"""
from launch import LaunchDescription
from launch.actions import OpaqueFunction

from streamcache_ros.tools.launching import answer_sigint, node_actions, node_arguments


def generate_launch_description():
    answer_sigint()  # a launch in a script's background stops on SIGINT too
    return LaunchDescription([*node_arguments(), OpaqueFunction(function=lambda context: node_actions(context))])
