"""What the archive cannot answer is refused, saying why (docs/reliability.md "Bad questions"): a
window that lies wholly in a hole names the hole; one partly in a hole is answered and says so; a
window past the newest frame says what the archive holds (never "wait for the camera stream"), on a
running node and on one restarted on its archive. The bundled world model, a bound small enough that
the archive drops most of a stream."""
from __future__ import annotations

import pytest

from streamcache_ros import world
from streamcache_ros.engine import build_session
from streamcache_ros.engine.errors import QuestionError

SEED = 800_000_347  # the tests' seed range (docs/world-models.md): no training run draws it
FRAMES = 240
QUESTION = "How many objects are in view now?"
OPTIONS = ["0", "1", "2"]


@pytest.fixture(scope="module")
def stream():
    return world.make_stream(SEED, FRAMES, question_points=[FRAMES])


def session_on(folder, max_bytes: int):
    return build_session({"model_path": "world-qwen2_5_vl", "policy": "fifo", "budget_tokens": 48,
                          "archive_path": str(folder), "archive_max_bytes": max_bytes})


@pytest.fixture(scope="module")
def bounded(stream, tmp_path_factory):
    """A stream of 30 chunks into an archive bounded to about ten: the bound has dropped the oldest
    (all but the pinned first), a hole from frame 8 on."""
    folder = tmp_path_factory.mktemp("bounded")
    probe = session_on(folder / "probe", 1 << 30)
    for i in range(8):
        probe.add_frame(stream.frame(i), stream.stamp(i))
    chunk_bytes = probe.status().archive.bytes
    probe.close_archive()
    session = session_on(folder / "archive", 10 * chunk_bytes)
    for i in range(FRAMES):
        session.add_frame(stream.frame(i), stream.stamp(i))
    yield session, folder / "archive"
    session.close_archive()


def test_a_window_wholly_in_a_hole_is_refused_naming_it(bounded, stream):
    session, _ = bounded
    holes = session.memory.holes_in("", None)
    assert holes and holes[0].reason == "bound" and holes[0].since <= stream.stamp(50)
    before = session.status()
    for asking in (lambda: session.ask(QUESTION, OPTIONS, since=stream.stamp(50), until=stream.stamp(100)),
                   lambda: session.ask("Did you see a red circle?", ["yes", "no"], since=stream.stamp(50),
                                       until=stream.stamp(100)),
                   lambda: session.when("Did you see a red circle?", "last", since=stream.stamp(50),
                                        until=stream.stamp(100))):
        with pytest.raises(QuestionError, match="lies in a hole from .* dropped by archive_max_bytes"):
            asking()
    assert session.status().archive.chunks == before.archive.chunks  # nothing changed


def test_a_window_partly_in_a_hole_is_answered_and_says_so(bounded, stream):
    session, _ = bounded
    oldest = session.status().archive.oldest_stamp
    archived_from = min(r.first_stamp for r in session.memory.archive.rows() if not r.pinned)
    answer = session.ask(QUESTION, OPTIONS, since=stream.stamp(100), until=archived_from + 20)
    assert answer.holes and answer.evicted_before and answer.frames_in_window > 0
    assert oldest == stream.stamp(0)  # the pinned first chunk


def test_a_window_past_the_newest_frame_says_what_the_archive_holds(bounded, stream):
    session, folder = bounded
    late = stream.stamp(FRAMES - 1) + 100
    with pytest.raises(QuestionError) as refused:
        session.ask(QUESTION, OPTIONS, since=late, until=late + 60)
    message = str(refused.value)
    assert "nothing newer than" in message and "the archive holds frames stamped" in message
    assert "wait for the camera stream" not in message


def test_after_a_restart_on_the_archive_a_late_window_is_refused_with_what_it_holds(stream, tmp_path):
    first = session_on(tmp_path, 1 << 30)
    for i in range(48):
        first.add_frame(stream.frame(i), stream.stamp(i))
    first.close_archive()
    restarted = session_on(tmp_path, 1 << 30)  # the working memory holds nothing; the archive 48 frames
    with pytest.raises(QuestionError) as refused:
        restarted.ask(QUESTION, OPTIONS, since=stream.stamp(48) + 10, until=stream.stamp(48) + 100)
    assert "the archive holds frames stamped 0.000 to 47.000" in str(refused.value)
    assert "wait for the camera stream" not in str(refused.value)
    answer = restarted.ask(QUESTION, OPTIONS, since=stream.stamp(10), until=stream.stamp(30))  # from the archive
    assert answer.recalled_chunks >= 1
    restarted.close_archive()


@pytest.mark.parametrize("question", ["Did you see a red star?", "Did you see a black square?"])
def test_an_option_question_in_unknown_words_is_refused_on_every_path(bounded, question):
    session, _ = bounded
    for asking in (lambda: session.ask(question, ["yes", "no"]), lambda: session.ask(question),
                   lambda: session.when(question, "last"), lambda: session.check_yes_no_question(question)):
        with pytest.raises(QuestionError, match="was never asked with"):
            asking()
