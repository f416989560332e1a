"""Where the robot is: the pose source that gives every frame its pose (docs/places.md "The pose of
a frame").

``pose_topic`` takes an odometry (``nav_msgs/Odometry``), a ``geometry_msgs/PoseStamped`` or an
AMCL-style ``PoseWithCovarianceStamped``, told apart by the topic's type, which is looked up until a
publisher appears (it may start after the node, as a camera may). With ``pose_source`` tf (or auto
and no topic) and ``tf2_ros`` importable, as it is in a robot's ROS 2 install, ``pose_map_frame`` ->
``pose_base_frame`` is read from TF instead. The poses go into a PoseTrack, which the archive reads
at each frame's stamp."""
from __future__ import annotations

import importlib

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.qos import QoSProfile, QoSReliabilityPolicy, qos_profile_sensor_data

from ..engine.errors import ConfigError
from ..engine import Pose, PoseTrack, load_places

SOURCES = ("auto", "topic", "tf", "off")
LOOK_PERIOD_S = 1.0  # how often a pose topic with no publisher yet is looked up
TF_PERIOD_S = 0.1  # TF is sampled at 10 Hz: the track interpolates between samples


def _pose_of(message):
    """(the message's pose, its header) for the three pose types."""
    pose = message.pose.pose if hasattr(message.pose, "pose") else message.pose
    return pose, message.header


def _message_types() -> dict:
    """Each type a pose topic may have, by its ROS name: those whose module is importable here."""
    types = {}
    for name, module, cls in (("nav_msgs/msg/Odometry", "nav_msgs.msg", "Odometry"),
                              ("geometry_msgs/msg/PoseStamped", "geometry_msgs.msg", "PoseStamped"),
                              ("geometry_msgs/msg/PoseWithCovarianceStamped", "geometry_msgs.msg",
                               "PoseWithCovarianceStamped")):
        try:
            types[name] = getattr(importlib.import_module(module), cls)
        except ImportError:
            continue
    return types


def tf_available() -> bool:
    try:
        importlib.import_module("tf2_ros")
    except ImportError:
        return False
    return True


def chosen_source(source: str, topic: str) -> str:
    """What ``pose_source`` comes to here: topic, tf or off; ConfigError for one that cannot run."""
    source = (source or "auto").strip().lower()
    if source not in SOURCES:
        raise ConfigError("pose_source", f"must be one of {', '.join(SOURCES)}, got '{source}'")
    if source == "topic" and not topic:
        raise ConfigError("pose_source", "is 'topic' and pose_topic is empty: name the odometry or pose topic")
    if source == "tf" and not tf_available():
        raise ConfigError("pose_source", "is 'tf' and tf2_ros is not importable here: source a ROS 2 install "
                                         "that has it, or set pose_topic")
    if source == "auto":
        return "topic" if topic else ("tf" if tf_available() else "off")
    return source


class PoseInput:
    """Feeds ``track`` from the chosen source while active. ``describe()`` and the counters go to
    /diagnostics."""

    def __init__(self, node, track: PoseTrack, source: str, topic: str, map_frame: str = "map",
                 base_frame: str = "base_link"):
        self.node, self.track, self.source, self.topic = node, track, source, topic
        self.map_frame, self.base_frame = map_frame, base_frame
        self.message_type = ""  # the topic's type once a publisher showed it
        self.subscription = self.timer = self.tf_buffer = self.tf_listener = None
        self.unknown_type = ""  # a topic of a type that is not a pose: said in diagnostics
        self.tf_failures = 0
        self.group = MutuallyExclusiveCallbackGroup()

    def activate(self) -> None:
        if self.source == "topic":
            self._look_for_topic()
            if self.subscription is None:
                self.timer = self.node.create_timer(LOOK_PERIOD_S, self._look_for_topic)
        elif self.source == "tf":
            tf2_ros = importlib.import_module("tf2_ros")
            self.tf_buffer = tf2_ros.Buffer()
            self.tf_listener = tf2_ros.TransformListener(self.tf_buffer, self.node)
            self.timer = self.node.create_timer(TF_PERIOD_S, self._sample_tf, callback_group=self.group)

    def deactivate(self) -> None:
        if self.timer is not None:
            self.node.destroy_timer(self.timer)
            self.timer = None
        if self.subscription is not None:
            self.node.destroy_subscription(self.subscription)
            self.subscription = None
        self.tf_listener = self.tf_buffer = None

    def _look_for_topic(self) -> None:
        if self.subscription is not None:
            return
        topic = self.node.resolve_topic_name(self.topic)
        names = dict(self.node.get_topic_names_and_types()).get(topic, [])
        types = _message_types()
        usable = [name for name in names if name in types]
        if not usable:
            self.unknown_type = ", ".join(names)
            return
        self.message_type, self.unknown_type = usable[0], ""
        # best effort takes reliable and best-effort publishers alike (odometry is often either)
        # reliable where every publisher offers it (a pose lost leaves the frames it brackets without
        # one), else best effort, which takes both; a deep queue and a callback group of its own:
        # odometry comes in bursts (50 Hz, or a replay's) (docs/places.md)
        offered = [info.qos_profile.reliability for info in self.node.get_publishers_info_by_topic(topic)]
        reliable = bool(offered) and all(r == QoSReliabilityPolicy.RELIABLE for r in offered)
        qos = QoSProfile(history=qos_profile_sensor_data.history, depth=1000,
                         reliability=QoSReliabilityPolicy.RELIABLE if reliable else QoSReliabilityPolicy.BEST_EFFORT,
                         durability=qos_profile_sensor_data.durability)
        self.subscription = self.node.create_subscription(types[usable[0]], topic, self._on_pose, qos,
                                                          callback_group=self.group)
        if self.timer is not None:
            self.node.destroy_timer(self.timer)
            self.timer = None
        self.node.get_logger().info(f"poses from {topic} ({usable[0]})")

    def _on_pose(self, message) -> None:
        pose, header = _pose_of(message)
        stamp = header.stamp.sec + header.stamp.nanosec * 1e-9
        self.track.add(stamp, Pose(pose.position.x, pose.position.y, pose.position.z, pose.orientation.x,
                                   pose.orientation.y, pose.orientation.z, pose.orientation.w, header.frame_id))

    def _sample_tf(self) -> None:
        from rclpy.time import Time
        try:
            transform = self.tf_buffer.lookup_transform(self.map_frame, self.base_frame, Time())
        except Exception:  # noqa: BLE001 - no transform yet (localisation starting): counted, tried again
            self.tf_failures += 1
            return
        t, q = transform.transform.translation, transform.transform.rotation
        stamp = transform.header.stamp.sec + transform.header.stamp.nanosec * 1e-9
        if self.track.newest_stamp is None or stamp > self.track.newest_stamp:
            self.track.add(stamp, Pose(t.x, t.y, t.z, q.x, q.y, q.z, q.w, self.map_frame))

    def describe(self) -> str:
        if self.source == "tf":
            return f"TF {self.map_frame} -> {self.base_frame}"
        if self.subscription is None:
            what = f" (its type {self.unknown_type} is not a pose)" if self.unknown_type else " (no publisher yet)"
            return f"{self.topic}{what}"
        return f"{self.topic} ({self.message_type})"


def named_places(path: str) -> dict:
    """The places_file's places (none without one); ConfigError naming what is wrong in it."""
    if not path:
        return {}
    try:
        return load_places(path)
    except ValueError as err:
        raise ConfigError("places_file", str(err)) from None


def pose_input_for(node, session, values: dict) -> PoseInput | None:
    """The pose source the parameters choose, feeding a track the session's archive reads; None for none."""
    topic = str(values["pose_topic"]).strip()
    source = chosen_source(str(values["pose_source"]), topic)
    if source == "off":
        return None
    track = PoseTrack(float(values["pose_tolerance_s"]))
    session.memory.poses = track
    return PoseInput(node, track, source, topic, str(values["pose_map_frame"]), str(values["pose_base_frame"]))
