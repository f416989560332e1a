"""The node's pose source chosen from its parameters, and the TF path around what cannot run here
(docs/places.md "The pose of a frame"): tf2_ros is not on PyPI, so the transform comes from a
stand-in buffer holding a real geometry_msgs TransformStamped; the topic paths run over DDS in
test/test_node_places.py and test/test_node_pose_types.py."""
import math

import pytest
from geometry_msgs.msg import TransformStamped

from streamcache_ros.engine import ConfigError, PoseTrack
from streamcache_ros.node.poses import PoseInput, chosen_source, tf_available


def test_the_source_the_parameters_choose():
    assert chosen_source("auto", "/odom") == "topic"
    assert chosen_source("auto", "") == ("tf" if tf_available() else "off")
    assert chosen_source("off", "/odom") == "off"
    with pytest.raises(ConfigError, match="pose_source.*'topic' and pose_topic is empty"):
        chosen_source("topic", "")
    with pytest.raises(ConfigError, match="pose_source.*one of auto, topic, tf, off"):
        chosen_source("gps", "")
    if not tf_available():
        with pytest.raises(ConfigError, match="tf2_ros is not importable here"):
            chosen_source("tf", "")


class StandInBuffer:
    """tf2_ros.Buffer's lookup_transform, over a list of transforms (the newest at each call)."""

    def __init__(self, transforms):
        self.transforms = list(transforms)
        self.asked = []

    def lookup_transform(self, target, source, time):
        self.asked.append((target, source))
        if not self.transforms:
            raise LookupError(f"{target} -> {source} does not exist yet")
        return self.transforms.pop(0)


def transform(stamp: float, x: float, yaw: float) -> TransformStamped:
    msg = TransformStamped()
    msg.header.stamp.sec, msg.header.stamp.nanosec = int(stamp), int(round((stamp % 1) * 1e9))
    msg.header.frame_id, msg.child_frame_id = "map", "base_link"
    msg.transform.translation.x = x
    msg.transform.rotation.z, msg.transform.rotation.w = math.sin(yaw / 2), math.cos(yaw / 2)
    return msg


def test_tf_samples_feed_the_track_newest_only_and_a_missing_transform_is_counted():
    track = PoseTrack(tolerance=0.5)
    source = PoseInput(None, track, "tf", "", "map", "base_link")
    source.tf_buffer = StandInBuffer([transform(10.0, 1.0, 0.0), transform(10.0, 1.0, 0.0), transform(10.2, 1.2, 0.4)])
    for _ in range(4):  # the same transform twice is taken once; the fourth lookup finds none
        source._sample_tf()
    assert track.received == 2 and source.tf_failures == 1
    assert source.tf_buffer.asked[0] == ("map", "base_link")
    pose = track.at(10.1)
    assert pose.x == pytest.approx(1.1) and pose.yaw == pytest.approx(0.2) and pose.frame_id == "map"
    assert source.describe() == "TF map -> base_link"
