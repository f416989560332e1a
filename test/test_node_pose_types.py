"""The pose of every frame from each kind of pose topic the node takes, over DDS (docs/places.md "The
pose of a frame"): a patrol bag whose poses are a geometry_msgs/PoseStamped or an AMCL-style
PoseWithCovarianceStamped (Odometry: test/test_node_places.py) at 4 Hz, 0.13 s off the frames, is
replayed into a node whose pose_topic names it; every frame in memory has the pose the truth gives
at its stamp, interpolated."""
import math

import pytest

from node_procs import Proc, child_env, client_of, replay_lock_step, stamp_ns, tiny_node
from streamcache_ros.tools import bagfile

S = 1_000_000_000


@pytest.mark.parametrize("pose_type", ["geometry_msgs/msg/PoseStamped", "geometry_msgs/msg/PoseWithCovarianceStamped"])
def test_each_pose_type_gives_every_frame_its_pose(domain, tmp_path, pose_type):
    ns = "/sc_pose_" + pose_type.rsplit("/", 1)[1].lower()
    bag = bagfile.make_patrol_bag(tmp_path / "bag", 800_000_440, 48, topic=f"{ns}/cam", odom_topic=f"{ns}/pose",
                                  pose_type=pose_type)
    record = bagfile.read_world_questions(bag)
    node = tiny_node(ns, [record["world"]["topic"]], model_path="world-qwen2_5_vl", chunk_frames=8,
                     archive_path=str(tmp_path / "archive"), pose_topic=f"{ns}/pose")
    with Proc(node, child_env(domain)) as proc, client_of(proc, domain, ns) as client:
        replay_lock_step(domain, bag, ns, "--fast")
        frames = client.memory_timeline().frames
        assert frames and all(f.has_pose and f.pose_frame == "map" for f in frames)
        for f in frames:
            x, y, yaw = record["patrol"]["poses"][round((stamp_ns(f.stamp) - record["world"]["start_ns"]) / S)]
            assert math.hypot(f.pose.position.x - x, f.pose.position.y - y) < 0.05
