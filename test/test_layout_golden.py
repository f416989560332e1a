"""The training layout of a stream is what the Session builds for it (docs/world-models.md, "One layout").

A stream of 21 world frames with questions after 5, 11 and 21 frames: chunks of 8 frames, partial
chunks flushed by the questions (one of 5 frames: an odd frame repeated on Qwen), several questions
per stream, two of them over a time window (masked to the window's units, as a windowed ask is). The Session (full cache) ingests it chunk by chunk and answers each question with its
answer fed back token by token; training lays the whole stream out at once. The chunk boundaries,
every position and the logits of every answer token must agree.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from streamcache_ros import world
from streamcache_ros.engine import Session, SessionConfig, make_policy
from streamcache_ros.engine.stream.layout import lay_out_stream, stream_chunks, text_positions
from streamcache_ros.engine.training.examples import AskedQuestion, example_logits, lay_out_example, question_tokens

POINTS = [5, 11, 21]


class RecordingFull:
    """Records the positions layer 0 gives each forward pass's tokens (the full policy underneath)."""

    def __init__(self, policy):
        self.policy = policy
        self.positions: list[torch.Tensor] = []

    def attend(self, layer, q, k, v, new, key_filter=None):
        out = self.policy.attend(layer, q, k, v, new, key_filter)
        if layer == 0:
            self.positions.append(self.policy.layers[0].positions[:, -len(new):].clone())
        return out


@pytest.fixture(scope="module")
def stream():
    s = world.make_stream(seed=11, num_frames=21, question_points=POINTS,
                          look=world.Look(320, 240, (40, 50, 60), 4, 10, True, "rgb8"))
    questions = []
    for n in POINTS:
        q = s.questions(n, kinds=("now_count", "seen"))[0]
        questions.append(AskedQuestion(n, q.text, q.options, q.answer))
    rng = np.random.default_rng(3)
    for n, window in ((11, (2, 6)), (21, (13, 20))):  # a window inside the past, one up to now
        q = s.window_questions(n, *window, rng, kinds=("seen",))[0]
        questions.append(AskedQuestion(n, q.text, q.options, q.answer, q.window))
    questions.sort(key=lambda q: q.after_frames)
    return [s.frame(i) for i in range(len(s))], questions


def test_chunks_follow_the_session_queue():
    assert stream_chunks(21, POINTS, 8) == [range(0, 5), range(5, 11), range(11, 19), range(19, 21)]
    assert stream_chunks(16, [], 8) == [range(0, 8), range(8, 16)]
    assert stream_chunks(3, [], 8) == []  # nothing encoded until a chunk fills or a question flushes


def test_questions_see_the_stream_as_it_was_and_never_each_other():
    rel = [torch.arange(4.0)[None], torch.arange(4.0)[None]]
    layout = lay_out_stream(2, rel, [(1, 3), (2, 2)], axes=1)
    first, second = layout.questions()
    assert (first.sees, second.sees) == (6, 10)
    # positions: prefix 0-1, chunks 2-5 and 6-9; each question at the stream's max + 1 when asked
    assert layout.positions[0, first.start:first.start + 3].tolist() == [6, 7, 8]
    assert layout.positions[0, second.start:second.start + 2].tolist() == [10, 11]
    mask = layout.mask
    assert not mask[:10, 10:].any()  # the stream never sees a question
    assert mask[first.start, :6].all() and not mask[first.start, 6:10].any()
    assert not mask[second.start:, first.start:first.start + 3].any()  # nor one question another
    assert mask[first.start + 2, first.start:first.start + 3].all() and not mask[first.start, first.start + 1]


@pytest.mark.parametrize("name", ["tiny-qwen2_5_vl", "tiny-llava_onevision"])
def test_training_layout_equals_the_session(name, stream, request):
    adapter = request.getfixturevalue("qwen_adapter" if "qwen" in name else "llava_adapter")
    frames, questions = stream
    example = lay_out_example(adapter, frames, questions, chunk_frames=8)
    with torch.no_grad():
        trained = example_logits(adapter, example)

    session = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=8))
    recorder = RecordingFull(session.policy)
    chunks, answered = [], []
    fed = 0
    for q in questions:
        for i in range(fed, q.after_frames):
            report = session.add_frame(frames[i], stamp=float(i))
            if report is not None:
                chunks.append(report.frames)
        fed = max(fed, q.after_frames)
        chunks += [r.frames for r in session.flush()]  # what ask() does first
        ids, answer = question_tokens(adapter, q)
        # a windowed ask's keys: the units with a frame stamped inside the window (stamp = index)
        key_filter = None if q.window is None else torch.tensor(session.window_units(*map(float, q.window)))
        mark = session.policy.mark()
        recorder.positions.clear()
        hidden = adapter.forward(adapter.embed_text(ids), adapter.text_tokens(len(ids)), recorder, key_filter)
        answered.append((adapter.logits(hidden[0, len(ids) - len(answer):]), recorder.positions[0]))
        session.policy.truncate(mark)

    assert chunks == [len(c) for c in example.chunks]
    stream_len = sum(s.length for s in example.layout.segments if s.kind != "question")
    assert torch.equal(session.policy.layers[0].positions, example.layout.positions[:, :stream_len])
    for (logits, positions), seg, (start, count) in zip(answered, example.layout.questions(), example.question_spans):
        assert torch.equal(positions, example.layout.positions[:, seg.start:seg.start + seg.length])
        assert positions[0, 0] == session.policy.layers[0].positions[:, :seg.sees].max() + 1
        torch.testing.assert_close(logits, trained[start:start + count], rtol=1e-4, atol=1e-4)


def test_text_positions_are_equal_on_every_axis():
    assert text_positions(3, 3, start=7.0).tolist() == [[7, 8, 9]] * 3
