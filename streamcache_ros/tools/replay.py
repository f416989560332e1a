"""``streamcache-replay``: publish a rosbag2's camera images (sqlite3 or mcap) with their original stamps.

    streamcache-replay data/demo_bag                     # real rate
    streamcache-replay data/demo_bag --rate 4 --clock    # 4x, publishing /clock (nodes with use_sim_time)
    streamcache-replay data/demo_bag --lock-step --fast  # tests / benchmarks: nothing dropped

The messages are published as recorded (the CDR bytes from the bag), so stamps, encodings and
padding are exactly the camera's. Timing follows the recording times, divided by ``--rate``.

Odometry and pose topics in the bag (nav_msgs/Odometry, PoseStamped, PoseWithCovarianceStamped) are
published too, each a little ahead of the frames it brackets (``POSE_LEAD_S``), as a robot's
odometry, faster than its camera, would be: the node then interpolates every frame's pose.

``--lock-step`` waits, after each message, until streamcache_node acknowledges it on
``<namespace>/frame_acks`` (taken into memory, or skipped by sampling, or rejected), so the node
sees every frame at any replay speed and its memory ends the same every run (docs/reliability.md,
"Replaying a bag deterministically": live cameras keep "latest frame, drop when busy"; the replay
tool waits instead). ``--ros-args -r
/camera/image_raw:=/other`` remaps topics as usual.

Exit codes: 0 done, 1 the node stopped acknowledging, 2 bad arguments or bag, 3 nobody subscribed.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import threading
import time

from . import bagfile

EXIT_NO_ACK, EXIT_BAD_INPUT, EXIT_NO_SUBSCRIBER = 1, 2, 3
GRACE_S = 1.0  # once one topic is matched, how long the others get to match too
POSE_LEAD_S = 3.0  # a pose is published before the frames stamped up to this much before it


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="streamcache-replay", description="Replay a rosbag2's camera images.")
    parser.add_argument("bag", help="a rosbag2 directory (sqlite3 or mcap)")
    parser.add_argument("--topics", nargs="+", help="image topics to replay (default: every Image / CompressedImage)")
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--rate", type=float, default=1.0, help="speed factor over the recording (default 1.0)")
    speed.add_argument("--fast", action="store_true", help="no waiting between messages")
    parser.add_argument("--lock-step", action="store_true",
                        help="wait for streamcache_node to acknowledge each message (nothing is dropped)")
    parser.add_argument("--namespace", default=None,
                        help="streamcache_node's namespace for --lock-step (default: find the one node)")
    parser.add_argument("--clock", action="store_true", help="publish /clock from the recording times")
    parser.add_argument("--loop", type=int, default=1, help="play the bag this many times")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for subscribers")
    parser.add_argument("--ack-timeout", type=float, default=2.0,
                        help="--lock-step: resend a message not acknowledged after this many seconds (5 tries)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.rate <= 0:
        parser.error("--rate must be > 0 (use --fast for no waiting)")
    if args.loop < 1:
        parser.error("--loop must be >= 1")
    return args


class AckWaiter:
    """Collects streamcache_node's frame acknowledgements: (topic, stamp_ns)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._seen: set[tuple[str, int]] = set()

    def on_ack(self, msg) -> None:
        key = (msg.frame_id, msg.stamp.sec * 1_000_000_000 + msg.stamp.nanosec)
        with self._cond:
            self._seen.add(key)
            self._cond.notify_all()

    def wait(self, topic: str, stamp_ns: int, timeout: float) -> bool:
        key = (topic, stamp_ns)
        with self._cond:
            found = self._cond.wait_for(lambda: key in self._seen, timeout)
            self._seen.discard(key)
            return found


class Replayer:
    def __init__(self, node, args, topics: dict[str, str]):
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy  # noqa: PLC0415
        from rosgraph_msgs.msg import Clock  # noqa: PLC0415
        from sensor_msgs.msg import CompressedImage, Image  # noqa: PLC0415
        from std_msgs.msg import Header  # noqa: PLC0415

        self.node, self.args = node, args
        types = {bagfile.IMAGE: Image, bagfile.COMPRESSED: CompressedImage}
        qos = QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)
        self.publishers = {topic: node.create_publisher(types[msgtype], topic, qos) for topic, msgtype in topics.items()}
        self.poses: list = []  # (the bag's pose messages, in order) published ahead of the frames
        self.pose_publishers = {}
        self.clock_pub = node.create_publisher(Clock, "/clock", qos) if args.clock else None
        self._clock_type = Clock
        self.acks = AckWaiter()
        self.resent = 0  # lock-step: messages published again after no acknowledgement came in time
        self.ack_topic = None
        if args.lock_step:
            from ..client.client import discover_namespace  # noqa: PLC0415

            namespace = (discover_namespace(node, args.wait) if args.namespace is None
                         else ("/" + args.namespace.strip("/")) if args.namespace.strip("/") else "")
            self.ack_topic = f"{namespace}/frame_acks"
            ack_qos = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE)
            self.ack_sub = node.create_subscription(Header, self.ack_topic, self.acks.on_ack, ack_qos)

    def wait_for_subscribers(self) -> list[str]:
        """Waits until some topic has a subscriber (and, in lock-step, the node's acknowledgements a
        publisher), then a moment more for the others; returns the topics nobody subscribed to."""
        deadline = time.monotonic() + self.args.wait
        grace_end = None
        while time.monotonic() < deadline:
            idle = [t for t, p in self.publishers.items() if p.get_subscription_count() == 0]
            acks_ready = self.ack_topic is None or self.node.count_publishers(self.ack_topic) > 0
            if acks_ready and not idle:
                return []
            if acks_ready and len(idle) < len(self.publishers):
                grace_end = grace_end or time.monotonic() + GRACE_S
                if time.monotonic() > grace_end:
                    return idle
            time.sleep(0.05)
        return list(self.publishers)

    def add_poses(self, messages, topics: dict[str, str]) -> None:
        import importlib  # noqa: PLC0415
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy  # noqa: PLC0415

        # deep: a reliable writer overwrites what a busy reader has not acknowledged past its depth
        qos = QoSProfile(depth=10_000, reliability=QoSReliabilityPolicy.RELIABLE)
        for topic, msgtype in topics.items():
            package, _, name = msgtype.split("/")
            kind = getattr(importlib.import_module(f"{package}.msg"), name)
            self.pose_publishers[topic] = self.node.create_publisher(kind, topic, qos)
        self.poses = sorted(messages, key=lambda m: m.stamp_ns)

    def _poses_until(self, stamp_ns: int, sent: int) -> int:
        """Publishes the poses stamped up to ``stamp_ns`` + POSE_LEAD_S not yet sent; the new count."""
        while sent < len(self.poses) and self.poses[sent].stamp_ns <= stamp_ns + POSE_LEAD_S * 1e9:
            self.pose_publishers[self.poses[sent].topic].publish(self.poses[sent].rawdata)
            sent += 1
        return sent

    def wait_for_pose_subscribers(self, timeout: float = 10.0) -> list[str]:
        """Lock-step: the pose topics given a moment to be matched (a node looks a pose topic's type up
        once a second), so the first frames have their poses too; the topics still unmatched."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            idle = [t for t, p in self.pose_publishers.items() if p.get_subscription_count() == 0]
            if not idle:
                return []
            time.sleep(0.05)
        return idle

    def wait_for_poses_acked(self, timeout_s: float = 5.0) -> None:
        """The last poses delivered before the process ends (a reliable reader acknowledges them): they
        were sent ahead of the last frames, and a writer gone before that takes them with it."""
        from rclpy.duration import Duration  # noqa: PLC0415

        for publisher in self.pose_publishers.values():
            publisher.wait_for_all_acked(Duration(seconds=timeout_s))

    def publish_clock(self, stamp_ns: int) -> None:
        msg = self._clock_type()
        msg.clock.sec, msg.clock.nanosec = divmod(stamp_ns, 1_000_000_000)
        self.clock_pub.publish(msg)

    def play(self, messages) -> tuple[int, int]:
        """Publish ``messages``; returns (published, acknowledged). Raises TimeoutError in lock-step
        when the node stops acknowledging."""
        published = acknowledged = poses_sent = 0
        start_wall = first_log = None
        for msg in messages:
            if start_wall is None:
                start_wall, first_log = time.monotonic(), msg.log_time_ns
            if not self.args.fast:
                due = start_wall + (msg.log_time_ns - first_log) * 1e-9 / self.args.rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if self.clock_pub is not None:
                self.publish_clock(msg.log_time_ns)
            poses_sent = self._poses_until(msg.stamp_ns, poses_sent)
            publisher = self.publishers[msg.topic]
            publisher.publish(msg.rawdata)
            published += 1
            if self.ack_topic is not None:
                for _ in range(5):
                    if self.acks.wait(publisher.topic_name, msg.stamp_ns, self.args.ack_timeout):
                        acknowledged += 1
                        break
                    publisher.publish(msg.rawdata)  # lost on the way (best-effort subscriber): again
                    self.resent += 1
                else:
                    raise TimeoutError(f"streamcache_node did not acknowledge the frame stamped "
                                       f"{msg.stamp_ns / 1e9:.3f} on {publisher.topic_name} ({self.ack_topic})")
            if not self.args.quiet and published % 100 == 0:
                print(f"[replay] {published} messages", flush=True)
        return published, acknowledged


def main(argv: list[str] | None = None) -> int:
    import rclpy  # noqa: PLC0415
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor  # noqa: PLC0415
    from rclpy.utilities import remove_ros_args  # noqa: PLC0415

    from ..client.client import NodeNotFound  # noqa: PLC0415

    argv = list(sys.argv if argv is None else argv)
    args = parse_args(remove_ros_args(argv)[1:])
    bag = pathlib.Path(args.bag)
    if not (bag / "metadata.yaml").is_file():
        print(f"streamcache-replay: {bag} is not a rosbag2 directory (no metadata.yaml)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        topics = bagfile.image_topics(bag)
        if args.topics:
            missing = [t for t in args.topics if t not in topics]
            if missing:
                raise ValueError(f"no image topic {', '.join(missing)} in {bag} (it has: {', '.join(topics) or 'none'})")
            topics = {t: topics[t] for t in args.topics}
        if not topics:
            raise ValueError(f"{bag} has no sensor_msgs Image or CompressedImage topic")
    except Exception as err:  # noqa: BLE001 - rosbags' errors for unreadable bags
        print(f"streamcache-replay: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT

    rclpy.init(args=argv)
    node = rclpy.create_node("streamcache_replay")
    executor = SingleThreadedExecutor()
    executor.add_node(node)

    def spin():
        try:
            executor.spin()
        except ExternalShutdownException:
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    code = 0
    try:
        replayer = Replayer(node, args, topics)
        pose_topics = bagfile.pose_topics(bag)
        if pose_topics:
            replayer.add_poses(bagfile.read_poses(bag, list(pose_topics)), pose_topics)
        idle = replayer.wait_for_subscribers()
        if len(idle) == len(topics):
            print(f"streamcache-replay: nobody subscribed to {', '.join(topics)}"
                  f"{' (or ' + replayer.ack_topic + ' has no publisher)' if replayer.ack_topic else ''} "
                  f"within {args.wait:.0f} s", file=sys.stderr)
            return EXIT_NO_SUBSCRIBER
        if args.lock_step and replayer.pose_publishers and replayer.wait_for_pose_subscribers() and not args.quiet:
            print(f"[replay] nobody subscribed to {', '.join(replayer.pose_publishers)}: poses published anyway",
                  flush=True)
        if idle and args.lock_step:  # nobody would acknowledge them
            print(f"[replay] nobody subscribed to {', '.join(idle)}: not replayed", flush=True)
            topics = {t: m for t, m in topics.items() if t not in idle}
        started = time.monotonic()
        total = acked = 0
        for _ in range(args.loop):
            published, acknowledged = replayer.play(bagfile.read_images(bag, list(topics)))
            total, acked = total + published, acked + acknowledged
        replayer.wait_for_poses_acked()
        if not args.quiet:
            mode = "lock-step, " if args.lock_step else ""
            print(f"[replay] done: {total} messages on {', '.join(topics)} in {time.monotonic() - started:.1f} s "
                  f"({mode}{'fast' if args.fast else f'rate {args.rate:g}'}"
                  f"{f', {acked} acknowledged, {replayer.resent} resent' if args.lock_step else ''})", flush=True)
    except (NodeNotFound, LookupError) as err:
        print(f"streamcache-replay: {err}", file=sys.stderr)
        code = EXIT_NO_SUBSCRIBER
    except TimeoutError as err:
        print(f"streamcache-replay: {err}", file=sys.stderr)
        code = EXIT_NO_ACK
    except (KeyboardInterrupt, ExternalShutdownException):
        code = 0
    finally:
        # the spinning thread ends before the node and the context go (else rcl aborts at exit)
        executor.shutdown(timeout_sec=2.0)
        spinner.join(timeout=5.0)
        node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
