"""Questions limited to a place, on the bundled world model with its index (docs/places.md): only
frames taken inside the place are read, through the index and the replays; a place never visited
is refused and nothing changes; every answer names the pose of its frames. The robot's poses are
a plain schedule here (the patrol world is test_patrol_world.py): 80 frames in the kitchen, 80 in
the hall, 80 in the kitchen again."""
from __future__ import annotations

import math

import pytest

from streamcache_ros import world
from streamcache_ros.engine import build_session
from streamcache_ros.engine.places import Place, PlaceError, Pose, PoseTrack

SEED = 800_000_351  # the tests' seed range (docs/world-models.md)
FRAMES = 240
KITCHEN, HALL = Place(0.0, 0.0, 2.0, "kitchen", "map"), Place(10.0, 0.0, 2.0, "hall", "map")


def room_of(index: int) -> Place:
    return HALL if 80 <= index < 160 else KITCHEN


def pose_of(index: int) -> Pose:
    room = room_of(index)
    return Pose.planar(room.x + 0.01 * (index % 7), room.y, 0.1 * index, "map")


@pytest.fixture(scope="module")
def stream():
    return world.make_stream(SEED, FRAMES, question_points=[FRAMES])


def fed_session(stream, folder, **params):
    session = build_session({"model_path": "world-qwen2_5_vl", "policy": "fifo", "budget_tokens": 48,
                             "archive_path": str(folder / "archive"), **params})
    session.memory.poses = track = PoseTrack(tolerance=0.6)
    for i in range(FRAMES):  # odometry a little off the camera's stamps: each frame's pose is interpolated
        track.add(stream.stamp(i) - 0.25, pose_of(i))
        track.add(stream.stamp(i) + 0.25, pose_of(i))
        session.add_frame(stream.frame(i), stream.stamp(i))
    return session


@pytest.fixture(scope="module")
def session(stream, tmp_path_factory):
    session = fed_session(stream, tmp_path_factory.mktemp("places"))
    yield session
    session.close_archive()


def sightings(stream, identity, rooms=None) -> list[int]:
    return [i for i in range(FRAMES) if identity in {v.identity for v in stream.truth[i]}
            and (rooms is None or room_of(i) in rooms)]


def an_identity(stream, test) -> tuple[str, str]:
    everything = [(s, c) for s in world.SHAPES for c in world.COLOUR_NAMES]
    found = [identity for identity in everything if test(identity)]
    if not found:
        pytest.fail(f"stream {SEED} has no identity for this test: draw another seed")
    return found[0]


def test_where_last_is_found_inside_the_place_only(session, stream):
    # seen in both rooms, last in the hall: in the kitchen its last sighting is an earlier one
    identity = an_identity(stream, lambda x: sightings(stream, x, [KITCHEN]) and sightings(stream, x)[-1] < 160
                           and room_of(sightings(stream, x)[-1]) is HALL)
    question = world.SEEN_PROBE.format(colour=identity[1], shape=identity[0])
    anywhere = session.when(question, "last")
    kitchen = session.when(question, "last", where=KITCHEN)
    assert anywhere.found and abs(anywhere.stamp - stream.stamp(sightings(stream, identity)[-1])) <= 2.0
    truth = stream.stamp(sightings(stream, identity, [KITCHEN])[-1])
    assert kitchen.found and abs(kitchen.stamp - truth) <= 2.0
    assert kitchen.pose is not None and kitchen.pose.distance_to(KITCHEN.x, KITCHEN.y) < 0.1
    assert kitchen.pose.frame_id == "map" and anywhere.pose.distance_to(HALL.x, HALL.y) < 0.1
    assert kitchen.frames_in_place == 160 and kitchen.frames_in_window == FRAMES and anywhere.frames_in_place == 0


def test_a_place_where_it_never_was_says_not_found(session, stream):
    identity = an_identity(stream, lambda x: sightings(stream, x, [HALL]) and not sightings(stream, x, [KITCHEN]))
    question = world.SEEN_PROBE.format(colour=identity[1], shape=identity[0])
    assert session.when(question, "last", where=HALL).found
    assert not session.when(question, "last", where=KITCHEN).found
    answer = session.ask(question, ["yes", "no"], where=KITCHEN)
    assert answer.text == "no" and answer.frames_in_place == 160
    yes = session.ask(question, ["yes", "no"], where=HALL)
    assert yes.text == "yes" and yes.evidence and all(e.pose.distance_to(HALL.x, HALL.y) < 0.1 for e in yes.evidence)


def test_a_window_and_a_place_together(session, stream):
    identity = an_identity(stream, lambda x: sightings(stream, x, [KITCHEN]) and sightings(stream, x, [KITCHEN])[0] < 80)
    question = world.SEEN_PROBE.format(colour=identity[1], shape=identity[0])
    early = [i for i in sightings(stream, identity, [KITCHEN]) if i < 80]
    found = session.when(question, "last", since=stream.stamp(0), until=stream.stamp(120), where=KITCHEN)
    assert found.found and abs(found.stamp - stream.stamp(early[-1])) <= 2.0
    assert found.frames_in_place == 80 and found.frames_in_window == 121


def test_a_place_never_visited_is_refused_and_nothing_changes(session, stream):
    before = session.status()
    with pytest.raises(PlaceError, match=r"never within 1 m of \(5, 5\).*nearest it came was 7\.0\d m"):
        session.when("Did you see a red circle?", "last", where=Place(5.0, 5.0, 1.0))
    with pytest.raises(PlaceError, match="never within"):
        session.ask("How many objects are in view now?", ["0", "1", "2"], where=Place(5.0, 5.0, 1.0))
    with pytest.raises(PlaceError, match="never .*'hall'.*between 0.000 and 40.000"):
        session.when("Did you see a red circle?", "last", since=0.0, until=40.0, where=HALL)
    after = session.status()
    assert after.archive.chunks == before.archive.chunks and after.questions_answered == before.questions_answered


def test_every_evidence_frame_carries_its_pose(session, stream):
    answer = session.ask("How many objects are in view now?", ["0", "1", "2"])
    assert answer.evidence
    for frame in answer.evidence:
        index = int(round(frame.stamp - stream.stamp(0)))
        assert frame.pose is not None
        assert math.hypot(frame.pose.x - pose_of(index).x, frame.pose.y - pose_of(index).y) < 0.02


def test_without_an_index_a_place_is_walked_over_its_own_chunks(stream, tmp_path):
    session = fed_session(stream, tmp_path, retrieval_model_path="")
    try:
        identity = an_identity(stream, lambda x: sightings(stream, x, [KITCHEN]) and sightings(stream, x)[-1] < 160
                               and room_of(sightings(stream, x)[-1]) is HALL)
        question = world.SEEN_PROBE.format(colour=identity[1], shape=identity[0])
        kitchen = session.when(question, "last", where=KITCHEN)
        assert kitchen.found_by == "walk"
        truth = stream.stamp(sightings(stream, identity, [KITCHEN])[-1])
        assert kitchen.found and abs(kitchen.stamp - truth) <= 2.0 and room_of(round(kitchen.stamp)) is KITCHEN
        never = an_identity(stream, lambda x: sightings(stream, x, [HALL]) and not sightings(stream, x, [KITCHEN]))
        assert not session.when(world.SEEN_PROBE.format(colour=never[1], shape=never[0]), "last", where=KITCHEN).found
    finally:
        session.close_archive()


def test_poses_survive_a_restart_and_a_snapshot(stream, tmp_path):
    session = fed_session(stream, tmp_path)
    saved = tmp_path / "memory.pt"
    session.save(str(saved))
    held = session.memory_timeline("").frames
    assert held and all(f.pose is not None for f in held)
    session.close_archive()
    # a restart on the same archive, no pose source: the poses come back from the archive
    again = build_session({"model_path": "world-qwen2_5_vl", "policy": "fifo", "budget_tokens": 48,
                           "archive_path": str(tmp_path / "archive")})
    try:
        identity = an_identity(stream, lambda x: sightings(stream, x, [KITCHEN]))
        found = again.when(world.SEEN_PROBE.format(colour=identity[1], shape=identity[0]), "last", where=KITCHEN)
        assert found.frames_in_place == 160 and found.found and found.pose.distance_to(KITCHEN.x, KITCHEN.y) < 0.1
    finally:
        again.close_archive()
    # the snapshot loaded where there is neither archive nor pose source: its frames keep their poses
    bare = build_session({"model_path": "world-qwen2_5_vl", "policy": "fifo", "budget_tokens": 48, "archive_path": ""})
    bare.load(str(saved))
    loaded = bare.memory_timeline("").frames
    assert [f.stamp for f in loaded] == [f.stamp for f in held]
    assert all(f.pose is not None and abs(f.pose.x - pose_of(round(f.stamp)).x) < 0.02 for f in loaded)
    evidence = bare.ask("How many objects are in view now?", ["0", "1", "2"]).evidence
    assert evidence and all(e.pose is not None and abs(e.pose.x - pose_of(round(e.stamp)).x) < 0.02 for e in evidence)
