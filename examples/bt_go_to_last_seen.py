#!/usr/bin/env python3
"""A behaviour-tree leaf (py_trees): "go to where you last saw X".

    python examples/bt_go_to_last_seen.py --namespace /streamcache --what "red circle"
    python examples/bt_go_to_last_seen.py --question "Is the door open?" --place kitchen --via topic

The leaf asks streamcache_node's ``when`` service (mode last) for X without blocking the tree (the
call runs on a thread of its own and the leaf is RUNNING meanwhile), then sends the pose of the
frame found, where the robot stood when it saw X (docs/places.md "Go to where you last saw X"):

- to Nav2's ``navigate_to_pose`` action (``nav2_msgs/action/NavigateToPose``) where ``nav2_msgs`` is
  importable: the leaf is RUNNING until Nav2 ends the goal, SUCCESS when it succeeded. nav2_msgs is
  not on PyPI, so this branch was written against its interface but **not run here**;
- otherwise as a ``geometry_msgs/PoseStamped`` on ``goal_pose``, the topic RViz's "2D Goal Pose"
  publishes on and Nav2's bt_navigator listens to: SUCCESS once published.

The leaf fails (FAILURE, the reason in ``feedback_message``) when the node refused the question,
did not answer within --timeout, did not find X, or the frame found has no pose.

Exit codes: 0 the goal was sent (topic) or reached (Nav2), 1 the leaf failed (the reason on stderr),
4 no streamcache node found, 130 interrupted (Ctrl-C).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import py_trees
from py_trees.common import Status

from streamcache_ros.client.client import NodeNotFound, StreamCacheClient, frame_pose
from streamcache_ros.client.participant import OwnParticipant

try:
    from nav2_msgs.action import NavigateToPose
except ImportError:  # no Nav2 here: the goal goes out on goal_pose
    NavigateToPose = None

EXIT = {"sent": 0, "failed": 1, "no node": 4, "interrupted": 130}
SEEN = "Did you see a {what}?"


def say(text: str) -> None:
    print(text, flush=True)


class GoalSender:
    """Where the goal goes: Nav2's NavigateToPose action (``via`` "nav2") or a PoseStamped on
    ``topic`` (``via`` "topic"); "auto" takes Nav2 where nav2_msgs is importable. Entities are made
    on a participant of their own before it spins (OwnParticipant.start says why)."""

    def __init__(self, via: str = "auto", topic: str = "goal_pose", action: str = "navigate_to_pose",
                 domain_id: int | None = None):
        from geometry_msgs.msg import PoseStamped  # noqa: PLC0415

        if via == "auto":
            via = "nav2" if NavigateToPose is not None else "topic"
        if via == "nav2" and NavigateToPose is None:
            raise RuntimeError("--via nav2: nav2_msgs is not importable (source a ROS 2 install with Nav2)")
        self.via = via
        self.participant = OwnParticipant(f"bt_go_to_{os.getpid()}", domain_id, start=False)
        node = self.participant.node
        if via == "nav2":
            from rclpy.action import ActionClient  # noqa: PLC0415

            self.action = ActionClient(node, NavigateToPose, action)
        else:
            self.publisher = node.create_publisher(PoseStamped, topic, 10)
        self.participant.start()

    def send(self, pose_stamped):
        """Sends the goal: None for a topic (done once published), else the Nav2 goal's future."""
        if self.via == "topic":
            self.publisher.publish(pose_stamped)
            return None
        return self.action.send_goal_async(NavigateToPose.Goal(pose=pose_stamped))

    def close(self) -> None:
        self.participant.close()


class GoToLastSeen(py_trees.behaviour.Behaviour):
    """``when(question, "last")``, then the pose of the frame found sent as a goal. RUNNING while it
    asks (and, for Nav2, while it drives); FAILURE with the reason in ``feedback_message``."""

    def __init__(self, client: StreamCacheClient, question: str, sender: GoalSender, place=None,
                 timeout: float = 120.0, match_wait: float = 2.0, name: str = "go to where X was last seen"):
        super().__init__(name)
        self.client, self.question, self.sender, self.place = client, question, sender, place
        self.timeout, self.match_wait = timeout, match_wait
        self.goal = None  # the PoseStamped sent

    def initialise(self) -> None:
        self.reply, self.error, self.goal, self.nav, self.nav_result = None, None, None, None, None
        self.asked = threading.Event()
        self.started = time.monotonic()
        self.feedback_message = f"asking: {self.question}"

        def ask() -> None:
            try:
                self.reply = self.client.when(self.question, "last", place=self.place, timeout=self.timeout)
            except Exception as err:  # noqa: BLE001 - a timeout or a vanished node: the leaf's reason
                self.error = f"{type(err).__name__}: {err}"
            self.asked.set()

        threading.Thread(target=ask, name="when", daemon=True).start()

    def _fail(self, why: str) -> Status:
        self.feedback_message = why
        say(f"[go to] {why}")
        return Status.FAILURE

    def update(self) -> Status:
        if self.nav is not None:
            return self._navigating()
        if self.goal is not None:
            return self._publish()
        if not self.asked.is_set():
            return Status.RUNNING
        r = self.reply
        if self.error is not None:
            return self._fail(f"no answer: {self.error}")
        if not r.success:
            return self._fail(f"the node refused: {r.error_message}")
        if not r.found:
            return self._fail(f"not found in the {r.frames_searched} frames searched: {self.question}")
        pose = frame_pose(r.pose) if r.has_pose else None
        if pose is None:
            return self._fail(f"seen at {r.stamp.sec + r.stamp.nanosec * 1e-9:.3f}, but that frame has no pose "
                              "(no pose source, or none near its stamp)")
        self.goal = r.pose
        # the pose is stamped with the frame's stamp, maybe long gone from the TF buffer: stamp zero
        # asks the navigator to use its latest transform of the goal's frame
        self.goal.header.stamp.sec, self.goal.header.stamp.nanosec = 0, 0
        say(f"[go to] last seen at {pose.stamp:.3f}: x={pose.x:.2f} y={pose.y:.2f} yaw={pose.yaw:.2f} "
            f"({pose.frame_id}), via {self.sender.via}")
        self.ready_since = time.monotonic()
        return self._publish()

    def _publish(self) -> Status:
        if self.sender.via == "topic":
            # a volatile message reaches only subscribers already matched: wait a little for one
            waited = time.monotonic() - self.ready_since
            if self.sender.publisher.get_subscription_count() == 0 and waited < self.match_wait:
                return Status.RUNNING
            self.sender.send(self.goal)
            self.feedback_message = "goal sent on goal_pose"
            return Status.SUCCESS
        self.nav = self.sender.send(self.goal)
        return Status.RUNNING

    def _navigating(self) -> Status:
        if not self.nav.done():
            return Status.RUNNING
        handle = self.nav.result()
        if not handle.accepted:
            return self._fail("Nav2 rejected the goal")
        if self.nav_result is None:
            self.nav_result = handle.get_result_async()
        if not self.nav_result.done():
            return Status.RUNNING
        from action_msgs.msg import GoalStatus  # noqa: PLC0415

        if self.nav_result.result().status != GoalStatus.STATUS_SUCCEEDED:
            return self._fail(f"Nav2 ended the goal with status {self.nav_result.result().status}")
        self.feedback_message = "arrived"
        return Status.SUCCESS

    def terminate(self, new_status: Status) -> None:
        if new_status == Status.INVALID and self.nav is not None and self.nav.done() and self.nav.result().accepted:
            self.nav.result().cancel_goal_async()  # interrupted while driving: Nav2 stops too


def tick_until_done(tree: py_trees.trees.BehaviourTree, period: float = 0.05) -> Status:
    while tree.root.status not in (Status.SUCCESS, Status.FAILURE):
        tree.tick()
        time.sleep(period)
    return tree.root.status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", default=None, help="the node's namespace (default: find the one node)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--what", help=f"X, asked as {SEEN.format(what='<X>')!r}")
    what.add_argument("--question", help="a yes/no question of your own")
    parser.add_argument("--place", default=None, help="only frames taken within this place (docs/places.md)")
    parser.add_argument("--via", choices=("auto", "nav2", "topic"), default="auto",
                        help="auto: Nav2's navigate_to_pose where nav2_msgs is importable, else goal_pose")
    parser.add_argument("--goal-topic", default="goal_pose", help="the PoseStamped topic (--via topic)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for the when answer")
    parser.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the node to appear")
    parser.add_argument("--domain-id", type=int, default=None, help="default: ROS_DOMAIN_ID")
    args = parser.parse_args(argv)
    question = args.question or SEEN.format(what=args.what)

    client = sender = None
    try:
        try:
            client = StreamCacheClient(args.namespace, timeout=args.wait, domain_id=args.domain_id)
        except (NodeNotFound, LookupError) as err:
            print(f"bt_go_to_last_seen: {err}", file=sys.stderr)
            return EXIT["no node"]
        sender = GoalSender(args.via, args.goal_topic, domain_id=args.domain_id)
        leaf = GoToLastSeen(client, question, sender, args.place, args.timeout)
        tree = py_trees.trees.BehaviourTree(leaf)
        tree.setup()
        if tick_until_done(tree) == Status.FAILURE:
            print(f"bt_go_to_last_seen: {leaf.feedback_message}", file=sys.stderr)
            return EXIT["failed"]
        say(f"outcome: {leaf.feedback_message}")
        return EXIT["sent"]
    except KeyboardInterrupt:
        return EXIT["interrupted"]
    finally:
        for part in (sender, client):
            if part is not None:
                part.close()


if __name__ == "__main__":
    sys.exit(main())
