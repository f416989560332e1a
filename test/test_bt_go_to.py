"""examples/bt_go_to_last_seen.py (docs/places.md "Go to where you last saw X") against streamcache_node
fed a patrol bag with its odometry: the leaf, ticked in this process, asks `when` (last) and sends the
pose of the frame found on goal_pose (nav2_msgs is not installable here: the topic path), within 1 m of
where the robot truly stood when it last saw X, in "map"; for an identity never seen it fails with the
reason, sending nothing. The example as a process says the same with exit code 1. Timeouts only guard
against hangs."""
import math
import subprocess
import sys

import py_trees  # in requirements.txt: when missing, the set-up is broken (a failure, not a skip)
import pytest
from py_trees.common import Status

from node_procs import (HANG_GUARD_S, RELIABLE, ROOT, Probe, Proc, child_env, client_of, load_example,
                        replay_lock_step, tiny_node)
from streamcache_ros import world
from streamcache_ros.tools import bagfile

NS = "/sc_go_to"
CAM = "/go_to/cam"
ODOM = "/go_to/odom"
SEED = 800_000_433  # held out (docs/world-models.md)
FRAMES = 120
S = 1_000_000_000
EXAMPLE = ROOT / "examples" / "bt_go_to_last_seen.py"


bt = load_example("bt_go_to_last_seen")


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    return bagfile.make_patrol_bag(tmp_path_factory.mktemp("go_to") / "bag", SEED, FRAMES, topic=CAM, odom_topic=ODOM,
                                   ask_at=[FRAMES])


def tick(leaf) -> Status:
    tree = py_trees.trees.BehaviourTree(leaf)
    tree.setup()
    return bt.tick_until_done(tree, period=0.02)


def test_the_leaf_sends_where_x_was_last_seen(domain, bag, tmp_path):
    from geometry_msgs.msg import PoseStamped  # noqa: PLC0415

    assert bt.NavigateToPose is None  # nav2_msgs is not installable here: the goal_pose branch runs
    record = bagfile.read_world_questions(bag)
    patrol, start_ns = record["patrol"], record["world"]["start_ns"]
    stream = world.make_long_patrol_stream(SEED, FRAMES, [FRAMES], places=world.patrol_map(SEED, 6))
    seen = {v.identity for t in stream.truth for v in t}
    # the identity seen last of all but not in the final chunk's frames, and one never seen
    identity = max((i for i in seen if stream.last_seen(i, FRAMES) < FRAMES - 8), key=lambda i: stream.last_seen(i, FRAMES))
    unseen = next((s, c) for s in world.SHAPES for c in world.COLOUR_NAMES if (s, c) not in seen)
    frame = stream.last_seen(identity, FRAMES)
    node = tiny_node(NS, [CAM], model_path="world-qwen2_5_vl", chunk_frames=8, archive_path=str(tmp_path / "archive"),
                     pose_topic=ODOM)
    with Proc(node, child_env(domain)) as proc, client_of(proc, domain, NS) as client:
        replay_lock_step(domain, bag, NS, "--fast")
        probe = Probe(domain)
        sender = bt.GoalSender("topic", domain_id=domain)
        try:
            goals = probe.collect(PoseStamped, "/goal_pose", RELIABLE)
            probe.wait_for(lambda: sender.publisher.get_subscription_count() >= 1, what="goal_pose matched")
            leaf = bt.GoToLastSeen(client, bt.SEEN.format(what=f"{identity[1]} {identity[0]}"), sender, timeout=120)
            assert tick(leaf) == Status.SUCCESS, leaf.feedback_message
            probe.wait_for(lambda: len(goals) == 1, what="the goal on goal_pose")
            goal = goals[0]
            x, y, _ = patrol["poses"][frame]
            assert goal.header.frame_id == "map"
            assert math.hypot(goal.pose.position.x - x, goal.pose.position.y - y) <= 1.0, (goal.pose, x, y, frame)
            assert abs(leaf.reply.stamp.sec * S + leaf.reply.stamp.nanosec - (start_ns + frame * S)) <= 2 * S

            never = bt.GoToLastSeen(client, bt.SEEN.format(what=f"{unseen[1]} {unseen[0]}"), sender, timeout=120)
            assert tick(never) == Status.FAILURE
            assert never.feedback_message.startswith("not found in the "), never.feedback_message
            assert len(goals) == 1  # nothing sent for it
        finally:
            sender.close()
            probe.close()

        # the example as a process: the same refusal, on stderr, exit 1
        done = subprocess.run([sys.executable, str(EXAMPLE), "--namespace", NS, "--domain-id", str(domain),
                               "--what", f"{unseen[1]} {unseen[0]}"], cwd=ROOT, env=child_env(domain),
                              capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert done.returncode == 1 and "not found in the " in done.stderr, done.stdout + done.stderr
