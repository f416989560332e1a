"""What random weights could not show: the bundled world models answer right, and keep answering
right when positions are renumbered, after a snapshot is restored, and beside another camera.

Deterministic: fixed held-out streams (seeds no training run draws), greedy answers, no timing.
The floors below were set before the models were run on these streams (docs/world-models.md, "Tests").
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from streamcache_ros import world
from streamcache_ros.engine import Session, SessionConfig, load_adapter, make_policy

MODELS = ["world-qwen2_5_vl", "world-llava_onevision"]
# Floors, raised for the v3 models from the accuracy benchmark's figures (other seeds, 32 frames, full
# cache) less about two standard errors at this test's number of questions, written down before any v3
# answer on the streams below was read (docs/world-models.md "Tests"); chance in brackets. Every option
# kind together, benchmark 0.89-0.90 (about 0.38); now_shape, 0.97-1.00 (0.33); seen over 8-frame
# windows, 0.97 (0.5); the when search's last / first stamp within 2 s, 0.84-0.97 (about 0.1 here).
# v2's floors, set before the vision-first models were trained: 0.80, 0.75, 0.80, 0.50.
FLOOR = 0.82
NOW_SHAPE_FLOOR = 0.85
WINDOWED_SEEN_FLOOR = 0.88
WHEN_FLOOR = 0.70
WHEN_TOLERANCE_S = 2.0
HELD_OUT = 800_000_000  # neither training (100M+), validation (900M+) nor the benchmark (500M+)
STREAMS, FRAMES = 12, 32
LOOK = dict(width=320, height=240, background=(40, 50, 60), noise=4, colour_jitter=10, jitter_per_frame=True)


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return load_adapter(request.param, device="cpu", dtype="float32")


def streams(encoding="rgb8", count=STREAMS, frames=FRAMES):
    return [world.make_stream(HELD_OUT + i, frames, look=world.Look(**LOOK, encoding=encoding)) for i in range(count)]


def questions(stream):
    return stream.questions(len(stream), np.random.default_rng((stream.seed, 1)), world.OPTION_KINDS)


def feed(session, stream, camera="", start=0):
    for i in range(start, len(stream)):
        session.add_frame(stream.frame(i), stamp=stream.stamp(i), camera=camera)


def replies(session, stream, camera=""):
    return [session.ask(q.text, q.options, camera=camera) for q in questions(stream)]


def answers(session, stream, camera=""):
    return [reply.option_index for reply in replies(session, stream, camera)]


def full_session(adapter, **policy):
    return Session(adapter, make_policy("full", **policy), SessionConfig(chunk_frames=8))


@pytest.fixture(scope="module")
def full_replies(model):
    """Per stream, the full cache's answers (reused by the comparisons below)."""
    out = []
    for stream in streams():
        session = full_session(model)
        feed(session, stream)
        out.append(replies(session, stream))
    return out


@pytest.fixture(scope="module")
def full_answers(full_replies):
    """Per stream, the full cache's option indices."""
    return [[reply.option_index for reply in per_stream] for per_stream in full_replies]


def accuracy_of(given, truth) -> float:
    return float(np.mean([a == t for a, t in zip(given, truth)]))


def test_full_cache_accuracy_stays_above_the_floor(model, full_answers):
    truth = [q.answer_index for stream in streams() for q in questions(stream)]
    given = [a for per_stream in full_answers for a in per_stream]
    accuracy = accuracy_of(given, truth)
    assert len(truth) >= 40
    assert accuracy >= FLOOR, f"{model.model_id}: {accuracy:.3f} on {len(truth)} questions"


def test_now_shape_is_answered_right(model, full_answers):
    """The vision-first models see shape: the shape of the object of a colour in the last frame."""
    truth = [q.answer_index for stream in streams() for q in questions(stream)]
    kinds = [q.kind for stream in streams() for q in questions(stream)]
    given = [a for per_stream in full_answers for a in per_stream]
    pairs = [(g, t) for g, t, k in zip(given, truth, kinds) if k == "now_shape"]
    assert len(pairs) >= 8
    accuracy = accuracy_of(*zip(*pairs))
    assert accuracy >= NOW_SHAPE_FLOOR, f"{model.model_id}: now_shape {accuracy:.3f} on {len(pairs)}"


def test_seen_over_8_frame_windows_stays_above_the_floor(model):
    """A window is a question the model can answer: seen over 8-frame windows at fixed places."""
    given, truth = [], []
    for k, stream in enumerate(streams()):
        session = full_session(model)
        feed(session, stream)
        rng = np.random.default_rng((stream.seed, 5))
        for first in (0, 8, 13, 24):
            for q in stream.window_questions(len(stream), first, first + 7, rng, ("seen",)):
                answer = session.ask(q.text, q.options, since=stream.stamp(first), until=stream.stamp(first + 7))
                given.append(answer.option_index)
                truth.append(q.answer_index)
    accuracy = accuracy_of(given, truth)
    assert len(truth) >= 40
    assert accuracy >= WINDOWED_SEEN_FLOOR, f"{model.model_id}: windowed seen {accuracy:.3f} on {len(truth)}"


def test_when_finds_the_last_and_first_stamps(model):
    """The when search on the trained model: last_seen and first_seen within 2 s of the truth."""
    hits = []
    for stream in streams():
        session = full_session(model)
        feed(session, stream)
        for q in stream.questions(len(stream), np.random.default_rng((stream.seed, 6)), ("last_seen", "first_seen")):
            found = session.when(q.probe, "last" if q.kind == "last_seen" else "first")
            hits.append(found.found and abs(found.stamp - stream.stamp(q.answer_frame)) <= WHEN_TOLERANCE_S)
    assert len(hits) >= 15
    assert np.mean(hits) >= WHEN_FLOOR, f"{model.model_id}: when {np.mean(hits):.3f} on {len(hits)}"


def test_same_answers_after_a_forced_reindex(model):
    """fifo evicts the oldest frames and leaves a gap in the positions; eager re-indexing closes it
    after every chunk (every kept key turned by its delta), lazy never does at this length. The
    answers must not depend on that renumbering where the model has decided. Closing the gap does
    move the kept frames nearer the system prompt (relative positions across the gap change; within
    the kept frames and to the question they do not), so a guess may flip. A guess is an answer given
    by a hair, or one whose evidence fifo has evicted: with the v2 model, 0.58 / 0.42 lazy against
    0.496 / 0.501 eager on a first_color whose first object was gone; with v3, 0.50 / 0.37 against
    0.34 / 0.56 on another such, the true colour at 0.01-0.02 in both. So: the same answer wherever
    both modes' top option leads by 0.1 and a frame showing the answer is still held, most questions
    so (the first frames, which first_* asks about, are mostly gone at 6 units), and the probabilities
    close throughout."""
    decided, shifts = [], []
    for stream in streams():
        per_mode = {}
        for mode in ("lazy", "eager"):
            session = Session(model, make_policy("fifo", budget_tokens=budget_of(model, stream, units=6),
                                                 reindex=mode), SessionConfig(chunk_frames=8))
            feed(session, stream)
            per_mode[mode] = (replies(session, stream), session.policy.stats())
            held_from = len(stream) - session.status().frames_in_memory  # fifo holds the newest frames
        lazy, eager = per_mode["lazy"], per_mode["eager"]
        assert lazy[1].reindex_events == 0 and eager[1].reindex_events >= len(stream) // 8 - 1
        assert eager[1].max_position < lazy[1].max_position  # the positions really were renumbered
        for q, a, b in zip(questions(stream), lazy[0], eager[0]):
            pa, pb = np.asarray(a.option_probabilities), np.asarray(b.option_probabilities)
            margin = min(np.diff(np.sort(pa))[-1], np.diff(np.sort(pb))[-1])
            shifts.append(float(np.abs(pa - pb).max()))
            evidence_held = not q.evidence_frames or max(q.evidence_frames) >= held_from
            if margin >= 0.1 and evidence_held:
                decided.append(a.option_index == b.option_index)
    assert len(decided) >= 0.6 * len(shifts), f"{len(shifts) - len(decided)} of {len(shifts)} guesses"  # first_* mostly evicted
    assert all(decided), f"{decided.count(False)} decided answers changed"
    assert np.mean(shifts) <= 0.05, f"mean largest probability shift {np.mean(shifts):.3f}"


def budget_of(model, stream, units: int) -> int:
    probe = np.zeros((stream.look.height, stream.look.width, 3), np.uint8)
    return units * model.preprocess([probe] * model.frames_per_unit).tokens_per_unit


def test_same_answers_after_snapshot_and_restore(model, full_answers, tmp_path):
    for k, (stream, expected) in enumerate(zip(streams()[:4], full_answers)):
        first = Session(model, make_policy("hermes", budget_tokens=len(model.prefix_ids) + 40),
                        SessionConfig(chunk_frames=8))
        feed(first, stream)
        before = answers(first, stream)
        first.save(str(tmp_path / f"s{k}.pt"))
        second = Session(model, make_policy("hermes", budget_tokens=len(model.prefix_ids) + 40),
                         SessionConfig(chunk_frames=8))
        second.load(str(tmp_path / f"s{k}.pt"))
        assert answers(second, stream) == before


@pytest.fixture(scope="module")
def beside(model):
    """Camera B's frames interleaved with camera A's, each question asked with its camera: per
    camera, the answers given and the true option indices."""
    given, truth = {"A": [], "B": []}, {"A": [], "B": []}
    for stream, other in zip(streams(), streams()[::-1]):
        session = full_session(model)
        for i in range(len(stream)):
            session.add_frame(stream.frame(i), stamp=stream.stamp(i), camera="A")
            session.add_frame(other.frame(i), stamp=other.stamp(i), camera="B")
        for camera, source in (("A", stream), ("B", other)):
            given[camera] += replies(session, source, camera=camera)
            truth[camera] += [q.answer_index for q in questions(source)]
    return given, truth


def test_answers_about_one_camera_come_from_that_camera(beside):
    """Asked with camera='A', the answers are A's (above the floor), and B's are B's: a question
    that saw the other camera's frames would score near chance on one of them."""
    given, truth = beside
    for camera in ("A", "B"):
        assert accuracy_of([reply.option_index for reply in given[camera]], truth[camera]) >= FLOOR, camera


def test_answers_about_one_camera_ignore_another(model, full_replies, beside):
    """The issue's test: the same answers about camera A with or without camera B's frames. Each
    camera's chunks are on its own position clock and see only that camera (docs/architecture.md
    "Positions"), so A's tokens are those of A alone, wherever B's frames come: the option
    probabilities agree within float error, and so the answers, one for one (an answer may differ
    only where its two best options are closer than that error)."""
    given, _ = beside
    alone = [reply for per_stream in full_replies for reply in per_stream]
    assert len(given["A"]) == len(alone) >= 40
    for with_b, without in zip(given["A"], alone):
        torch.testing.assert_close(torch.tensor(with_b.option_probabilities), torch.tensor(without.option_probabilities),
                                   atol=1e-4, rtol=0)
        top = sorted(without.option_probabilities)[-2:]
        if top[1] - top[0] > 1e-3:
            assert with_b.option_index == without.option_index
