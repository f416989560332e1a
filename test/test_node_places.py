"""Where, through streamcache_node over DDS (docs/places.md): a patrol bag replayed with its
odometry; every frame archived with its pose; `when` gives the pose of the frame found, within 1 m
of where the robot truly was; a question limited to a named place or to a point and radius reads
only the frames taken there; a place never visited, or a name the places file lacks, is refused
with the memory unchanged; memory_timeline and Ask's evidence carry poses."""
import math

import pytest

from node_procs import Proc, child_env, client_of, replay_lock_step, stamp_ns, tiny_node
from streamcache_ros import world
from streamcache_ros.client.client import evidence_poses, frame_pose
from streamcache_ros.tools import bagfile

NS = "/sc_places"
CAM = "/places/cam"
ODOM = "/places/odom"
SEED = 800_000_421  # held out (docs/world-models.md)
FRAMES = 300
S = 1_000_000_000


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    return bagfile.make_patrol_bag(tmp_path_factory.mktemp("patrol") / "bag", SEED, FRAMES, topic=CAM,
                                   odom_topic=ODOM, ask_at=[FRAMES])


def test_poses_places_and_refusals_over_dds(domain, bag, tmp_path):
    record = bagfile.read_world_questions(bag)
    patrol, start_ns = record["patrol"], record["world"]["start_ns"]
    stream = world.make_long_patrol_stream(SEED, FRAMES, [FRAMES], places=world.patrol_map(SEED, 6))
    node = tiny_node(NS, [record["world"]["topic"]], model_path="world-qwen2_5_vl", policy="fifo", chunk_frames=8,
                     archive_path=str(tmp_path / "archive"), pose_topic=ODOM, places_file=str(bag / "places.yaml"))
    with Proc(node, child_env(domain)) as proc, client_of(proc, domain, NS) as client:
        replay_lock_step(domain, bag, NS, "--fast")
        timeline = client.memory_timeline()
        assert timeline.frames and all(f.has_pose and f.pose_frame == "map" for f in timeline.frames)
        for f in timeline.frames:  # each frame's pose interpolated from 4 Hz odometry at its stamp
            x, y, _ = patrol["poses"][round((stamp_ns(f.stamp) - start_ns) / S)]
            assert math.hypot(f.pose.position.x - x, f.pose.position.y - y) < 0.05

        # an identity seen at one place and never at another
        seen = {}
        for i in range(FRAMES):
            for view in stream.truth[i]:
                seen.setdefault(view.identity, set()).add(stream.place_at(i))
        identity, places = next((x, p) for x, p in seen.items() if len(p - {None}) == 1)
        (there,) = places - {None}
        elsewhere = next(p["name"] for p in patrol["places"] if p["name"] != there
                         and any(patrol["place_at"][i] == p["name"] for i in range(FRAMES)))
        probe = world.SEEN_PROBE.format(colour=identity[1], shape=identity[0])

        found = client.when(probe, "last")
        assert found.success and found.found and found.has_pose, found.error_message
        truth = stream.last_seen(identity, FRAMES)
        x, y, _ = patrol["poses"][truth]
        pose = frame_pose(found.pose)
        assert pose is not None and pose.frame_id == "map" and stamp_ns(found.pose.header.stamp) == stamp_ns(found.stamp)
        assert math.hypot(pose.x - x, pose.y - y) <= 1.0, (pose, x, y)

        in_place = client.when(probe, "last", place=there)
        assert in_place.success and in_place.found and in_place.frames_in_place > 0
        assert abs(stamp_ns(in_place.stamp) - stamp_ns(found.stamp)) <= 2 * S
        not_there = client.when(probe, "last", place=elsewhere)
        assert not_there.success and not not_there.found and 0 < not_there.frames_in_place < not_there.frames_in_window

        place = next(p for p in patrol["places"] if p["name"] == there)
        as_disc = client.ask(probe, ["yes", "no"], place=(place["x"], place["y"], place["radius"]))
        assert as_disc.success and as_disc.answer == "yes" and as_disc.frames_in_place == in_place.frames_in_place
        poses = evidence_poses(as_disc)
        assert len(poses) == len(as_disc.evidence_stamps) >= 1
        assert all(math.hypot(p.x - place["x"], p.y - place["y"]) <= place["radius"] for p in poses)

        before = client.memory_status()
        for asked, why in ((lambda: client.when(probe, "last", place=(500.0, 500.0, 2.0)), "never within 2 m"),
                           (lambda: client.ask(probe, ["yes", "no"], place="attic"), "unknown place 'attic'"),
                           (lambda: client.when(probe, "last", place=(0.0, 0.0, -1.0)), "place_radius")):
            reply = asked()
            assert not reply.success and why in reply.error_message, reply.error_message
        after = client.memory_status()
        assert after.frames_in_memory == before.frames_in_memory
