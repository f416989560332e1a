"""The patrol world (docs/world.md "The patrol world"): every rule of the shape world holds in every
frame, what is in view depends on where the robot is, and a patrol bag carries odometry that a node
can interpolate to the frames' stamps."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from rosbags.highlevel import AnyReader

from streamcache_ros import world
from streamcache_ros.tools import bagfile

SEEDS = (3, 11)
ABSENT = (("circle", "red"), ("square", "blue"), ("triangle", "white"))


@pytest.fixture(scope="module")
def hours():
    return [world.make_patrol_stream(seed, 3600, question_points=[100, 1800], absent=ABSENT) for seed in SEEDS]


def _state(frame):
    return frozenset((v.obj, v.identity) for v in frame)


def _runs(stream):
    runs, start = [], 0
    for i in range(1, len(stream) + 1):
        if i == len(stream) or _state(stream.truth[i]) != _state(stream.truth[i - 1]):
            runs.append((start, i))
            start = i
    return runs


def test_every_world_rule_holds_in_every_frame_of_a_patrol_hour(hours):
    for s in hours:
        assert isinstance(s, world.WorldStream) and len(s) == 3600
        short, width = min(s.look.width, s.look.height), s.look.width
        for frame in s.truth:
            assert len(frame) <= 2 and len({v.identity for v in frame}) == len(frame)
            assert not {v.identity for v in frame} & set(ABSENT)
            for v in frame:
                assert 0.30 * short - 1e-6 <= v.side <= 0.45 * short + 1e-6
                assert v.x0 >= 0 and v.y0 >= 0 and v.x0 + v.side <= width and v.y0 + v.side <= s.look.height
            if len(frame) == 2:
                a, b = sorted(frame, key=lambda v: v.x0)
                assert a.x0 + a.side < b.x0
        runs = _runs(s)
        assert len(runs) > 100
        assert all(b - a >= world.STABLE_FRAMES for a, b in runs)  # the first and the last state too
        for (_, b), (c, _) in zip(runs, runs[1:]):
            before, after = _state(s.truth[b - 1]), _state(s.truth[c])
            gone, new = before - after, after - before
            recolour = len(gone) == len(new) == 1 and {o for o, _ in before} == {o for o, _ in after}
            assert (not gone and len(new) == 1) or (len(gone) == 1 and not new) or recolour
            if not gone and len(new) == 1 and len(after) == 2:  # appears in the half the other is not in
                (fresh,) = [v for v in s.truth[c] if (v.obj, v.identity) in new]
                (other,) = [v for v in s.truth[c] if v is not fresh]
                left = other.centre_x >= width / 2
                assert fresh.x0 + fresh.side <= width / 2 + 1e-6 if left else fresh.x0 >= width / 2 - 1e-6
        for m in s.moves:
            assert 4 <= m.last_frame - m.first_frame + 1 <= 8
            xs = [s.truth[i][0].x0 for i in range(m.first_frame - 1, m.last_frame + 1)]
            assert all(len(s.truth[i]) == 1 for i in range(m.first_frame - 1, m.last_frame + 1))
            steps = np.diff(xs)
            assert (steps > 0).all() if m.direction == "right" else (steps < 0).all()
            assert ((np.abs(steps) >= 0.08 * width - 1e-6) & (np.abs(steps) <= 0.15 * width + 1e-6)).all()
        for n in (100, 1800, 3600):
            assert s.is_still(n) and s.questions(n)
        assert s.stamp(10) - s.stamp(9) == world.FRAME_PERIOD_S
    assert sum(len(s.moves) for s in hours) > 10 and sum(len(s.recolours) for s in hours) > 0


def test_the_robot_drives_between_places_and_sees_only_where_it_stops(hours):
    for s in hours:
        names = {p.name: p for p in s.places}
        assert set(s.route) == set(names) and len(s.route) == len(names)
        poses = np.asarray([s.pose(i) for i in range(len(s))])
        steps = np.hypot(*np.diff(poses[:, :2], axis=0).T)
        assert steps.max() <= 1.3 and steps.max() >= 0.8
        fine = np.asarray([s.pose_at(t)[:2] for t in np.arange(0, 600, 0.25)])
        assert np.hypot(*np.diff(fine, axis=0).T).max() <= 1.3 * 0.25
        moving = np.zeros(len(s), dtype=bool)
        moving[1:-1] = (steps[:-1] > 0) & (steps[1:] > 0)  # between two frames of travel
        for i in range(len(s)):
            if moving[i]:
                assert s.truth[i] == ()  # in transit nothing is in view
                dx, dy = poses[i + 1, :2] - poses[i, :2]
                assert math.isclose(poses[i, 2], math.atan2(dy, dx), abs_tol=1e-9)  # yaw: heading of travel
            elif s.truth[i]:
                place = names[s.place_at(i)]
                assert math.hypot(poses[i, 0] - place.x, poses[i, 1] - place.y) <= 0.3 + 1e-9
                where = s.identity_places(i)
                assert all(where[v.identity] == place.name for v in s.truth[i])
        stops = [(a, b) for a, b in _stretches(steps == 0)]
        assert all(b - a + 1 >= 8 for a, b in stops[:-1])  # dwelling at least 8 frames
        assert len(stops) > 60
        for a, b in stops[1:]:  # dwelling: the heading it arrived with
            assert math.isclose(poses[a, 2], poses[a - 1, 2], abs_tol=1e-9)
        assert {s.place_at(a) for a, _ in stops} == set(names)


def _stretches(still):
    """Runs of frames i..j where the robot stood from frame i to frame j."""
    out, start = [], None
    for i, flag in enumerate(list(still) + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            out.append((start, i))
            start = None
    return out


def test_a_relocated_identity_is_last_seen_at_its_new_place(hours):
    checked = never = 0
    for s in hours:
        for n in range(1, len(s)):
            before, after = s.identity_places(n - 1), s.identity_places(n)
            for identity, place in after.items():
                old = before.get(identity)
                if old is None or old == place or s.truth[n]:
                    continue
                seen_old = s.last_seen(identity, n)
                later = next((i for i in range(n, len(s)) if any(v.identity == identity for v in s.truth[i])), None)
                if seen_old is None or later is None:
                    continue
                assert s.place_at(seen_old) == old and s.place_at(later) == place
                assert s.last_seen(identity, later + 1) == later
                assert s.last_seen(identity, later + 1, place=old) == seen_old
                history = [s.identity_places(i).get(identity) for i in range(n + 1)]
                for other in s.places:  # at a place in some frame before n, seen there or not
                    assert s.ever_in_place(identity, n, other.name) == (other.name in history[:n])
                assert s.ever_in_place(identity, n + 1, place) and s.ever_in_place(identity, n, old)
                never += sum(p.name not in history for p in s.places)
                checked += 1
    assert checked >= 2 and never > 0
    s = hours[0]
    assert s.last_seen(ABSENT[0], len(s)) is None
    assert not any(s.ever_in_place(ABSENT[0], len(s), p.name) for p in s.places)


def test_a_patrol_is_its_seed():
    a, b = world.make_patrol_stream(5, 400), world.make_patrol_stream(5, 400)
    assert a.truth == b.truth and a.places == b.places and a.look == b.look
    assert [a.pose(i) for i in range(400)] == [b.pose(i) for i in range(400)]
    assert np.array_equal(a.frame(37), b.frame(37))
    c = world.make_patrol_stream(6, 400)
    assert c.places != a.places and [c.pose(i) for i in range(400)] != [a.pose(i) for i in range(400)]
    assert world.make_patrol_stream(5, 200).truth == a.truth[:200]  # a shorter stream is the longer one's start


def test_a_day_of_patrol_is_hours_chained_with_the_route_running_on():
    day = world.make_long_patrol_stream(21, 2 * 3600 + 300, question_points=[3600 + 50])
    hour = world.make_patrol_stream(21, 3600)
    assert isinstance(day, world.PatrolStream) and [len(p) for p in day.parts] == [3600, 3600, 300]
    assert day.truth[:3600] == hour.truth and day.pose(3599) == hour.pose(3599)
    for n in (3600, 3650, 7200, len(day)):
        assert day.is_still(n)
    steps = [math.hypot(*np.subtract(day.pose(i + 1)[:2], day.pose(i)[:2])) for i in range(len(day) - 1)]
    assert max(steps) <= 1.3
    assert day.parts[1].pose(5) == day.pose(3605) and day.parts[1].place_at(5) == day.place_at(3605)
    assert np.array_equal(day.frame(3600 + 9), day.parts[1].frame(9)) and day.stamp(3609) == 3609.0
    with pytest.raises(ValueError):
        world.make_patrol_stream(1, 3601)


def test_the_map_keeps_its_places_apart_and_writes_the_places_file():
    for seed in range(20):
        places = world.patrol_map(seed, count=8)
        assert len({p.name for p in places}) == 8 and all(p.radius == 2.0 for p in places)
        assert min(math.hypot(a.x - b.x, a.y - b.y) for i, a in enumerate(places) for b in places[i + 1:]) >= 6.0
    places = world.patrol_map(4)
    assert len(places) == 6 and places == world.patrol_map(4)
    parsed = yaml.safe_load(world.places_yaml(places))
    assert parsed["frame_id"] == "map"
    assert [world.MapPlace(name, **v) for name, v in parsed["places"].items()] == list(places)
    with pytest.raises(ValueError, match="overlap"):
        world.make_patrol_stream(0, 50, places=(world.MapPlace("a", 0, 0, 2.0), world.MapPlace("b", 3, 0, 2.0)))
    with pytest.raises(ValueError):
        world.patrol_map(0, count=1)


def test_a_patrol_bag_holds_odometry_that_interpolates_to_the_frames(tmp_path):
    look = world.Look(160, 120, (40, 40, 50), 4, 10, False, "rgb8")
    path = bagfile.make_patrol_bag(tmp_path / "bag", seed=9, frames=150, ask_at=[60], look=look)
    stream = world.make_patrol_stream(9, 150, question_points=[60, 150], look=look, places=world.patrol_map(9))
    frames = list(bagfile.read_images(path))
    assert len(frames) == 150
    odom = bagfile.read_odometry(path)
    stamps = np.asarray([o[0] for o in odom])
    assert np.allclose(np.diff(stamps), 0.25e9) and abs(len(odom) - 4 * 150) <= 4
    frame_stamps = np.asarray([m.stamp_ns for m in frames])
    assert stamps[0] < frame_stamps[0] and stamps[-1] >= frame_stamps[-1]
    assert not set(stamps.tolist()) & set(frame_stamps.tolist())  # a node must interpolate
    xs, ys = np.interp(frame_stamps, stamps, [o[1] for o in odom]), np.interp(frame_stamps, stamps, [o[2] for o in odom])
    truth = np.asarray([stream.pose(i)[:2] for i in range(150)])
    assert np.hypot(xs - truth[:, 0], ys - truth[:, 1]).max() <= 0.05
    assert np.ptp(truth[:, 0]) + np.ptp(truth[:, 1]) > 10  # the robot did drive
    with AnyReader([path]) as reader:
        conn = next(c for c in reader.connections if c.topic == "/odom")
        assert conn.msgtype == "nav_msgs/msg/Odometry"
        msg = reader.deserialize(next(d for c, _, d in reader.messages([conn])), conn.msgtype)
        assert (msg.header.frame_id, msg.child_frame_id) == ("map", "base_link")
    record = json.loads((path / bagfile.WORLD_QUESTIONS_FILE).read_text())
    patrol = record["patrol"]
    assert patrol["route"] == list(stream.route) and len(patrol["poses"]) == 150
    assert np.allclose(patrol["poses"], [stream.pose(i) for i in range(150)], atol=1e-3)
    assert [p["name"] for p in patrol["places"]] == [p.name for p in stream.places]
    assert record["truth"][40] == [{"object": v.obj, "shape": v.shape, "colour": v.colour,
                                    "box": [round(v.x0, 1), round(v.y0, 1), round(v.side, 1)]} for v in stream.truth[40]]
    parsed = yaml.safe_load((path / bagfile.PLACES_FILE).read_text())
    assert {k: (v["x"], v["y"], v["radius"]) for k, v in parsed["places"].items()} == \
        {p.name: (p.x, p.y, p.radius) for p in stream.places}


def test_make_bag_patrol_option(tmp_path, capsys):
    assert bagfile.main([str(tmp_path / "p"), "--world", "--patrol", "--patrol-places", "4", "--frames", "40",
                         "--width", "160", "--height", "120", "--seed", "2"]) == 0
    assert "Odometry on /odom" in capsys.readouterr().out
    assert len(bagfile.read_world_questions(tmp_path / "p")["patrol"]["places"]) == 4
    assert bagfile.main([str(tmp_path / "q"), "--patrol"]) == 2
    assert bagfile.main([str(tmp_path / "w"), "--world", "--frames", "20", "--width", "160", "--height", "120"]) == 0
    assert "patrol" not in bagfile.read_world_questions(tmp_path / "w")
