"""Which robot saw it (docs/places.md "Which robot saw it"): three streamcache nodes in /robot1..3,
each fed its own patrol bag (its own camera and odometry topics), and a fourth in /robot4 frozen with
SIGSTOP. ``ask_fleet`` asks all four at once: the best answer is the robot whose patrol last saw the
identity, its stamp and pose near the truth, while /robot4 is named in ``no_answer`` and costs the
others nothing. ``streamcache-ask --all`` prints a line per robot. Timeouts only guard against hangs,
except the fleet's own, which is what names /robot4."""
import math
import os
import signal
import subprocess
import threading
import time

import pytest

from node_procs import (HANG_GUARD_S, ROOT, Proc, child_env, client_of, python_module, replay_lock_step, stamp_ns,
                        tiny_node)
from streamcache_ros import world
from streamcache_ros.client import ask_fleet, find_nodes
from streamcache_ros.client.participant import OwnParticipant
from streamcache_ros.tools import bagfile

ROBOTS = ("/robot1", "/robot2", "/robot3")
FROZEN = "/robot4"
SEEDS = (800_000_430, 800_000_431, 800_000_432)  # held out (docs/world-models.md)
FRAMES = 120
S = 1_000_000_000
FLEET_TIMEOUT_S = 20.0  # how long the fleet waits for /robot4, which never answers


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fleet")
    return [bagfile.make_patrol_bag(folder / ns.strip("/"), seed, FRAMES, topic=f"{ns}/cam", odom_topic=f"{ns}/odom",
                                    ask_at=[FRAMES]) for ns, seed in zip(ROBOTS, SEEDS)]


def pick_identity():
    """An identity two robots or more saw, the newest sighting well ahead of the next: (identity,
    robot index, frame)."""
    streams = [world.make_long_patrol_stream(seed, FRAMES, [FRAMES], places=world.patrol_map(seed, 6))
               for seed in SEEDS]
    ids = {v.identity for s in streams for t in s.truth for v in t}
    best = None
    for identity in sorted(ids):
        seen = sorted(((s.last_seen(identity, FRAMES), k) for k, s in enumerate(streams)
                       if s.last_seen(identity, FRAMES) is not None), reverse=True)
        if len(seen) >= 2 and seen[0][0] - seen[1][0] >= 8 and (best is None or seen[0][0] - seen[1][0] > best[0]):
            best = (seen[0][0] - seen[1][0], identity, seen[0][1], seen[0][0])
    assert best is not None, "no identity two robots saw apart in time"
    return best[1:]


def test_the_fleet_names_the_robot_that_saw_it_last(domain, bags, tmp_path):
    records = [bagfile.read_world_questions(bag) for bag in bags]
    procs = [Proc(tiny_node(ns, [f"{ns}/cam"], model_path="world-qwen2_5_vl", chunk_frames=8,
                            archive_path=str(tmp_path / ns.strip("/")), pose_topic=f"{ns}/odom"), child_env(domain))
             for ns in ROBOTS]
    procs.append(Proc(tiny_node(FROZEN, [f"{FROZEN}/cam"]), child_env(domain)))
    try:
        for proc, ns in zip(procs, (*ROBOTS, FROZEN)):
            with client_of(proc, domain, ns):
                pass  # serving
        replays = [threading.Thread(target=replay_lock_step, args=(domain, bag, ns, "--fast"))
                   for bag, ns in zip(bags, ROBOTS)]
        for t in replays:
            t.start()
        for t in replays:
            t.join(HANG_GUARD_S)
        identity, robot, frame = pick_identity()
        question = world.SEEN_PROBE.format(colour=identity[1], shape=identity[0])

        # the CLI first, with every node awake: one line per robot
        started = time.monotonic()
        done = subprocess.run(python_module("streamcache_ros.client.ask_cli", "--all", "--timeout", "60", "--wait",
                                            "10", question), cwd=ROOT, env=child_env(domain), capture_output=True,
                              text=True, timeout=HANG_GUARD_S)
        print(f"streamcache-ask --all took {time.monotonic() - started:.1f} s:\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        for ns in (*ROBOTS, FROZEN):
            assert sum(line.startswith(f"{ns}: ") for line in lines) == 1, done.stdout
        assert lines[0].startswith(f"{ROBOTS[robot]}: found "), done.stdout  # newest first
        assert "x=" in lines[0] and "(map)" in lines[0]

        # /robot4 hangs once the fleet knows it (a participant made after the hang would never
        # discover it: a stopped process sends no announcements)
        participant = OwnParticipant("fleet_test", domain)
        try:
            # a loaded machine may announce a participant late: looked at again until all four are seen
            deadline = time.monotonic() + HANG_GUARD_S
            while find_nodes(participant, timeout=10.0) != sorted((*ROBOTS, FROZEN)):
                assert time.monotonic() < deadline, "the four nodes were never all discovered"
            os.killpg(procs[-1].popen.pid, signal.SIGSTOP)
            started = time.monotonic()
            answer = ask_fleet(question, "last", timeout_s=FLEET_TIMEOUT_S, participant=participant)
            took = time.monotonic() - started
        finally:
            participant.close()
        assert answer.no_answer == [FROZEN] and not answer.refused, answer
        assert took < FLEET_TIMEOUT_S + 5  # one wait for the frozen node, not one per robot
        assert {e.node for e in answer.entries} == set(ROBOTS)
        best = answer.best
        assert best is not None and best.node == ROBOTS[robot], answer
        assert best.name == f"{ROBOTS[robot]}/streamcache_node"
        truth_ns = records[robot]["world"]["start_ns"] + frame * S
        assert abs(best.stamp * S - truth_ns) <= 2 * S, (best.stamp, truth_ns)
        x, y, _ = records[robot]["patrol"]["poses"][frame]
        assert best.pose is not None and best.pose.frame_id == "map"
        assert math.hypot(best.pose.x - x, best.pose.y - y) <= 1.0, (best.pose, x, y)
        found = [e for e in answer.entries if e.found]
        assert [e.stamp for e in found] == sorted((e.stamp for e in found), reverse=True)
        assert abs(stamp_ns(best.reply.stamp) - best.stamp * S) < 1e3
    finally:
        os.killpg(procs[-1].popen.pid, signal.SIGCONT)  # a stopped process cannot take its SIGINT
        for proc in procs:
            proc.__exit__(None, None, None)


def test_merging_and_what_the_cli_prints():
    """The merge's order and ``best``, the CLI's lines, and its pose lines for one node (no DDS)."""
    from geometry_msgs.msg import PoseStamped  # noqa: PLC0415
    from streamcache_ros_interfaces.srv import Ask, When  # noqa: PLC0415

    from streamcache_ros.client import ask_cli  # noqa: PLC0415
    from streamcache_ros.client.fleet import FleetEntry, fleet_lines, merge  # noqa: PLC0415
    from streamcache_ros.client.replies import FramePose  # noqa: PLC0415

    entries = [FleetEntry("/r1", "/r1/streamcache_node", True, 5.0, FramePose(5.0, 1.0, 2.0, 0.5, "map"), "/c", 0.9,
                          "index"),
               FleetEntry("/r2", "/r2/streamcache_node", True, 7.0, None, "/c", 0.8, "walk"),
               FleetEntry("/r3", "/r3/streamcache_node", False, None, None, "", 0.1, "index")]
    last = merge("q", "last", entries, ["/r5"], {"/r4": "no frames"})
    assert [e.node for e in last.entries] == ["/r2", "/r1", "/r3"] and last.best.node == "/r2"
    first = merge("q", "first", entries, [], {})
    assert [e.node for e in first.entries] == ["/r1", "/r2", "/r3"] and first.best.node == "/r1"
    assert merge("q", "last", entries[2:], [], {}).best is None
    assert fleet_lines(last, 30) == [
        "/r2: found 7.000 /c (no pose) (P(yes) 0.800; found by walk)",
        "/r1: found 5.000 /c at x=1.00 y=2.00 yaw=0.50 (map) (P(yes) 0.900; found by index)",
        "/r3: not found", "/r4: refused: no frames", "no answer within 30 s: /r5"]
    with pytest.raises(ValueError):
        ask_fleet("q", "timeline", namespaces=["/r1"])

    def posed(x: float) -> PoseStamped:
        pose = PoseStamped()
        pose.header.frame_id, pose.pose.position.x, pose.pose.orientation.w = "map", x, 1.0
        return pose

    found = When.Response(success=True, found=True, has_pose=True, pose=posed(3.0))
    assert ask_cli._when_text(found, "last").splitlines()[1] == "at x=3.00 y=0.00 yaw=0.00 (map)"
    assert len(ask_cli._when_text(When.Response(success=True, found=True), "last").splitlines()) == 1
    reply = Ask.Response(success=True, evidence_cameras=["/a", "/b"], evidence_weights=[0.6, 0.3],
                         evidence_poses=[posed(1.0), PoseStamped()])
    reply.evidence_stamps = [reply.oldest_stamp, reply.newest_stamp]
    assert ask_cli._evidence_lines(reply).strip().splitlines() == [
        "evidence: 0.000 /a 0.600 at x=1.00 y=0.00 yaw=0.00 (map)", "evidence: 0.000 /b 0.300"]
    args = ask_cli.parse_args(["--all", "--place-at", "1", "2", "3", "q"])
    assert (args.mode, ask_cli._place(args)) == ("last", (1.0, 2.0, 3.0))
    assert ask_cli.parse_args(["--all", "--when", "first", "q"]).mode == "first"
    assert ask_cli._place(ask_cli.parse_args(["--place", "kitchen", "q"])) == "kitchen"
    for bad in (["--all", "--namespace", "/r1", "q"], ["--all", "--when", "timeline", "q"], ["--mode", "last", "q"],
                ["--place", "a", "--place-at", "1", "2", "3", "q"], ["--place-at", "1", "2", "0", "q"]):
        with pytest.raises(SystemExit):
            ask_cli.parse_args(bad)
