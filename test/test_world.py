"""The shape world generator follows the world's rules (docs/world.md) and asks every kind correctly."""
from __future__ import annotations

import numpy as np
import pytest

from streamcache_ros import world

SEEDS = range(40)


@pytest.fixture(scope="module")
def streams():
    return [world.make_stream(seed, 160, question_points=[32, 64]) for seed in SEEDS]


def test_same_seed_same_stream():
    a, b = world.make_stream(5, 40), world.make_stream(5, 40)
    assert a.truth == b.truth and a.look == b.look
    assert np.array_equal(a.frame(17), b.frame(17))
    assert world.make_stream(6, 40).truth != a.truth


def test_looks_cover_the_allowed_range():
    rng = np.random.default_rng(0)
    looks = [world.random_look(rng) for _ in range(20000)]  # Look() itself refuses anything outside
    for look in looks:
        assert 96 <= look.width <= 1280 and 96 <= look.height <= 1280
        assert 4 / 3 - 1e-3 <= look.width / look.height <= 16 / 9 + 1e-3
        assert all(20 <= c <= 90 for c in look.background) and 0 <= look.noise <= 8 and look.colour_jitter <= 20
    sizes = {(look.width, look.height) for look in looks}
    assert set(world.NAMED_SIZES) <= sizes
    assert {look.encoding for look in looks} == set(world.ENCODINGS)
    with pytest.raises(ValueError, match="aspect"):
        world.Look(400, 100, (30, 30, 30), 0, 0, False, "rgb8")


def test_objects_obey_the_rules(streams):
    for s in streams:
        short = min(s.look.width, s.look.height)
        for frame in s.truth:
            assert len(frame) <= 2
            assert len({v.identity for v in frame}) == len(frame)
            for v in frame:
                assert 0.30 * short - 1e-6 <= v.side <= 0.45 * short + 1e-6
                assert v.x0 >= 0 and v.y0 >= 0 and v.x0 + v.side <= s.look.width and v.y0 + v.side <= s.look.height
            if len(frame) == 2:
                a, b = sorted(frame, key=lambda v: v.x0)
                assert a.x0 + a.side < b.x0  # never overlapping


def _state(frame):
    return frozenset((v.obj, v.identity) for v in frame)


def test_states_last_four_frames_and_change_by_one_event(streams):
    for s in streams:
        runs, start = [], 0
        for i in range(1, len(s) + 1):
            if i == len(s) or _state(s.truth[i]) != _state(s.truth[i - 1]):
                runs.append((start, i))
                start = i
        for a, b in runs[:-1]:
            assert b - a >= world.STABLE_FRAMES
        for (a, b), (c, _) in zip(runs, runs[1:]):
            before, after = _state(s.truth[b - 1]), _state(s.truth[c])
            gone, new = before - after, after - before
            objects_before, objects_after = {o for o, _ in before}, {o for o, _ in after}
            one_appears = not gone and len(new) == 1
            one_leaves = len(gone) == 1 and not new
            recolour = len(gone) == len(new) == 1 and objects_before == objects_after
            assert one_appears or one_leaves or recolour


def test_moves_are_alone_one_way_and_sized(streams):
    count = 0
    for s in streams:
        for m in s.moves:
            count += 1
            assert 4 <= m.last_frame - m.first_frame + 1 <= 8
            xs = []
            for i in range(m.first_frame - 1, m.last_frame + 1):
                assert len(s.truth[i]) == 1
                xs.append(s.truth[i][0].x0)
            steps = np.diff(xs)
            assert (steps > 0).all() if m.direction == "right" else (steps < 0).all()
            assert ((np.abs(steps) >= 0.08 * s.look.width - 1e-6) & (np.abs(steps) <= 0.15 * s.look.width + 1e-6)).all()
    assert count > 10


def test_question_points_are_still(streams):
    for s in streams:
        for n in (32, 64, 160):
            assert s.is_still(n)
            last = s.truth[n - 4:n]
            assert all(f == last[0] for f in last)


def test_every_kind_is_asked_with_its_options(streams):
    kinds = {}
    for s in streams:
        for n in (32, 64, 160):
            for q in s.questions(n):
                kinds.setdefault(q.kind, 0)
                kinds[q.kind] += 1
                assert q.after_frames == n
                if q.kind in ("now_color", "first_color", "before_color"):
                    assert len(q.options) == 4 and set(q.options) <= set(world.COLOUR_NAMES)
                    assert len(set(q.options)) == 4
                elif q.kind == "now_count":
                    assert sorted(q.options) == ["0", "1", "2"]
                elif q.kind in ("first_shape", "now_shape"):
                    assert sorted(q.options) == sorted(world.SHAPES)
                elif q.kind == "seen":
                    assert sorted(q.options) == ["no", "yes"]
                elif q.kind == "moved":
                    assert sorted(q.options) == ["left", "right"]
                else:
                    assert q.options == [] and q.answer_index == -1
    assert set(kinds) == set(world.QUESTION_KINDS)


def test_true_answers_from_the_truth(streams):
    for s in streams:
        n = 160
        last = s.truth[n - 1]
        recent = {v.identity for f in s.truth[n - 4:n] for v in f}
        for q in s.questions(n):
            if q.kind == "now_count":
                assert q.answer == str(len(last))
            elif q.kind == "now_color":
                shape = q.text.split()[-2]
                (view,) = [v for v in last if v.shape == shape]
                assert q.answer == view.colour
            elif q.kind in ("first_color", "first_shape"):
                (first,) = s.truth[0]
                assert first.identity not in recent
                assert q.answer == (first.colour if q.kind == "first_color" else first.shape)
            elif q.kind == "seen":
                colour, shape = q.text[:-1].split()[-2:]
                ever = any(v.identity == (shape, colour) for f in s.truth[:n] for v in f)
                assert (q.answer == "yes") == ever
                assert (shape, colour) not in recent
            elif q.kind == "before_color":
                shape = q.text.split()[4]
                (view,) = [v for v in last if v.shape == shape]
                history = [v.colour for f in s.truth[:n] for v in f if v.obj == view.obj]
                changes = [a for a, b in zip(history, history[1:]) if a != b]
                assert q.answer == changes[-1]
            elif q.kind == "moved":
                colour, shape = q.text[:-1].split()[-3:-1]
                frames = [i for i in range(n) if any(v.identity == (shape, colour) for v in s.truth[i])]
                xs = {i: next(v.x0 for v in s.truth[i] if v.identity == (shape, colour)) for i in frames}
                moving = [i for i in frames[1:] if i - 1 in xs and xs[i] != xs[i - 1]]
                assert q.answer == ("right" if xs[moving[-1]] > xs[moving[-1] - 1] else "left")
            elif q.kind == "now_shape":
                colour = q.text.split()[4]
                (view,) = [v for v in last if v.colour == colour]
                assert q.answer == view.shape
            elif q.kind in ("last_seen", "first_seen"):
                colour, shape = q.text[:-1].split()[-2:]
                frames = [i for i in range(n) if any(v.identity == (shape, colour) for v in s.truth[i])]
                assert q.probe == f"Did you see a {colour} {shape}?"
                if q.kind == "last_seen":
                    assert q.answer_frame == frames[-1] and frames[-1] < n - 4
                else:
                    assert q.answer_frame == frames[0]


def test_a_windowed_question_is_answered_from_the_window_alone(streams):
    """docs/world.md "Windows": as if the stream were the window's frames; seen is yes when the
    identity is in view in some frame inside it, and its 'no' answers include identities seen
    outside the window."""
    rng = np.random.default_rng(5)
    outside_no = 0
    for s in streams:
        for first, last in ((0, 7), (40, 47), (100, 159), (120, 120)):
            for q in s.window_questions(160, first, last, rng):
                assert q.window == (first, last) and q.after_frames == 160
                inside = s.truth[first:last + 1]
                if q.kind == "seen":
                    colour, shape = q.text[:-1].split()[-2:]
                    held = [first + i for i, f in enumerate(inside) if any(v.identity == (shape, colour) for v in f)]
                    assert (q.answer == "yes") == bool(held) and q.evidence_frames == held
                    ever = any(v.identity == (shape, colour) for f in s.truth[:160] for v in f)
                    outside_no += q.answer == "no" and ever
                elif q.kind == "now_count":
                    assert q.answer == str(len(inside[-1]))
                elif q.kind == "now_color":
                    (view,) = [v for v in inside[-1] if v.shape == q.text.split()[-2]]
                    assert q.answer == view.colour and q.evidence_frames == [last]
                elif q.kind == "now_shape":
                    (view,) = [v for v in inside[-1] if v.colour == q.text.split()[4]]
                    assert q.answer == view.shape
                elif q.kind in ("first_color", "first_shape"):
                    (view,) = inside[0]
                    assert q.answer == (view.colour if q.kind == "first_color" else view.shape)
    assert outside_no > 0
    with pytest.raises(ValueError, match="cannot be asked over a window"):
        streams[0].window_questions(160, 0, 7, rng, kinds=("moved",))
    with pytest.raises(ValueError):
        streams[0].window_questions(100, 90, 120, rng)


def test_window_questions_when_every_identity_is_in_the_window():
    """With all 18 identities inside the window there is no 'no' to ask; it once raised
    ValueError (high <= 0) drawing from the empty pool, now a present identity is asked."""
    s = world.make_stream(3, 8)
    everyone = tuple(world.ObjectView(i, shape, colour, 0.0, 0.0, 4.0)
                     for i, (shape, colour) in enumerate((sh, c) for sh in world.SHAPES for c in world.COLOUR_NAMES))
    crowded = world.WorldStream(s.seed, s.look, [everyone] * 8, [], [], {}, 0.0)
    for seed in range(20):
        asked = crowded.window_questions(8, 2, 5, np.random.default_rng(seed), kinds=("seen",))
        assert [(q.kind, q.answer, q.evidence_frames) for q in asked] == [("seen", "yes", [2, 3, 4, 5])]


def test_seen_is_balanced_and_no_question_where_the_stream_moves():
    answers = [q.answer for seed in range(200) for q in world.make_stream(seed, 64).questions(64, kinds=("seen",))]
    assert 0.35 < answers.count("yes") / len(answers) < 0.65
    s = next(s for s in (world.make_stream(seed, 200, still_end=False) for seed in range(50)) if s.moves)
    moving = s.moves[0].first_frame + 1
    with pytest.raises(ValueError, match="not one state"):
        s.questions(moving + 1)


def test_frames_render_the_truth():
    look = world.Look(320, 240, (30, 40, 50), 0, 0, False, "rgb8")
    s = world.make_stream(3, 12, look=look)
    for i in (0, 11):
        rgb = s.frame(i)
        assert rgb.shape == (240, 320, 3) and rgb.dtype == np.uint8
        for v in s.truth[i]:
            cy, cx = int(v.y0 + 0.7 * v.side), int(v.x0 + v.side / 2)  # inside every shape
            assert tuple(rgb[cy, cx]) == world.COLOURS[v.colour]
        assert tuple(rgb[0, 0]) == (30, 40, 50) or any(v.x0 < 1 and v.y0 < 1 for v in s.truth[i])
    jpeg = world.make_stream(3, 4, look=world.Look(320, 240, (30, 40, 50), 0, 0, False, "jpeg", 80))
    assert jpeg.jpeg(0)[:2] == b"\xff\xd8"
    assert np.abs(jpeg.frame(0).astype(int) - jpeg.raw_frame(0).astype(int)).mean() < 4


def test_world_frames_are_one_fixed_stream_at_any_allowed_size():
    """world_frames (the tests', benchmarks' and make_bag's frames): the fixed seed's stream at the
    size asked for; a frame does not depend on how many are asked, and past one stream's 3600 frames
    the next seed's stream goes on."""
    frames = list(world.world_frames(6, start=3, height=96, width=128))
    assert [f.shape for f in frames] == [(96, 128, 3)] * 6 and frames[0].dtype == np.uint8
    stream = world.make_stream(world.FIXED_STREAM_SEED, world.FIXED_STREAM_SEGMENT_FRAMES,
                               look=world.fixed_look(96, 128), still_end=False)
    for i, frame in enumerate(frames, start=3):
        assert np.array_equal(frame, stream.frame(i)) and np.array_equal(frame, world.world_frame(i, 96, 128))
    assert world.world_frame(0).shape == (120, 160, 3)  # the default size: 160x120
    assert not np.array_equal(frames[0], frames[1])  # sensor noise: no two frames alike
    past = world.FIXED_STREAM_SEGMENT_FRAMES + 5
    following = world.make_stream(world.FIXED_STREAM_SEED + 1, world.FIXED_STREAM_SEGMENT_FRAMES,
                                  look=world.fixed_look(96, 128), still_end=False)
    assert np.array_equal(world.world_frame(past, 96, 128), following.frame(5))
    for height, width in ((24, 32), (120, 120), (96, 200)):  # too small, 1:1, wider than 16:9
        with pytest.raises(ValueError):
            world.world_frame(0, height, width)
    with pytest.raises(ValueError):
        world.world_frame(-1)


def test_hard_negatives_share_a_colour_or_a_shape_with_what_is_in_the_window(streams):
    """A hard negative is a 'no' about an identity absent from the window whose colour or shape is
    in view there: what a model that does not bind colour to shape gets wrong."""
    rng = np.random.default_rng(3)
    asked = 0
    for stream in streams:
        for first, last in ((0, 7), (20, 31), (40, 47)):
            q = world.ask_seen_hard_negative(stream, 64, first, last, rng)
            if q is None:
                continue
            asked += 1
            inside = {v.identity for f in stream.truth[first:last + 1] for v in f}
            colour, shape = q.text[len("Did you see a "):-1].split(" ")
            assert (shape, colour) not in inside and q.answer == "no" and q.window == (first, last)
            assert any(shape == s or colour == c for s, c in inside)
    assert asked > 60


def test_comparison_windows_hold_the_event_and_answer_from_it(streams):
    """moved and before_color asked over a short window around the event answer as the window's own
    frames say (the move's direction, the colour just before the recolour)."""
    rng = np.random.default_rng(4)
    kinds = set()
    for stream in streams:
        for q in world.comparison_questions(stream, 160, rng):
            kinds.add(q.kind)
            first, last = q.window
            assert last < 160 and last - first <= 2 * 3 + 8 + 1
            if q.kind == "moved":
                move = next(m for m in stream.moves if first <= m.first_frame and m.last_frame <= last)
                assert q.answer == move.direction
            else:
                change = [r for r in stream.recolours if first < r.frame <= last][-1]
                assert q.answer == change.before
    assert kinds == {"moved", "before_color"}


def test_a_day_is_hours_chained_with_the_truth_and_stamps_running_on():
    day = world.make_long_stream(510_000_000, 3 * 3600 + 100, question_points=[64, 3600 + 400])
    hours = day.parts
    assert [len(h) for h in hours] == [3600, 3600, 3600, 100] and len(day) == 3 * 3600 + 100
    assert len({h.seed for h in hours}) == 4 and all(h.look == hours[0].look for h in hours)
    assert day.truth[3600 + 17] == hours[1].truth[17] and day.stamp(3600 + 17) == 3617.0
    assert np.array_equal(day.frame(2 * 3600 + 5), hours[2].frame(5))
    for n in (64, 3600, 3600 + 400, 7200):  # each hour is still at its end and at the asked points
        assert day.is_still(n)
    rng = np.random.default_rng(0)
    first = [q for q in day.questions(7200, rng, ("first_seen", "last_seen"))]
    for q in first:  # answered over the chain: the frame is the chain's, the identity in view there
        identity = tuple(q.probe.removeprefix("Did you see a ").rstrip("?").split(" ")[::-1])
        assert any(v.identity == identity for v in day.truth[q.answer_frame])
    assert world.make_long_stream(5, 40).truth == world.make_stream(5, 40).truth  # an hour or less: one stream
