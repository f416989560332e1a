"""The when search: plain logic against an oracle that knows the truth, then through a Session
(refusals, the cache left as it was, windows asked as rows, standing questions)."""
from __future__ import annotations

import math

import pytest

from streamcache_ros.engine import QuestionError, Session, SessionConfig, make_policy
from streamcache_ros.engine.memory.ledger import UnitInfo, Window
from streamcache_ros.engine.questions.when import MODES, Found, SearchSettings, answer, search

from conftest import states_equal


def oracle_of(present: list[bool]):
    """P(yes) of a window: 0.9 when some unit in it holds the thing, else 0.1."""
    return lambda windows: [0.9 if any(present[i] for i in w) else 0.1 for w in windows]


@pytest.mark.parametrize("present", [
    [False] * 10 + [True] * 3 + [False] * 50,      # once, early
    [True] * 5 + [False] * 90 + [True] * 2,        # twice, the last at the very end
    [False] * 40 + [True],                          # only the newest unit
    [True] + [False] * 200,                         # only the oldest
    [True],                                         # one unit in memory
])
@pytest.mark.parametrize("tile", [1, 3, 4])
def test_last_and_first_find_the_boundaries(present, tile):
    settings = SearchSettings(rows_per_pass=16, tile_units=tile)
    last = search("last", len(present), oracle_of(present), settings)
    first = search("first", len(present), oracle_of(present), settings)
    assert last.index == max(i for i, p in enumerate(present) if p)
    assert first.index == min(i for i, p in enumerate(present) if p)
    assert last.yes_probability == first.yes_probability == 0.9
    # every tile once, then the units of the tile that holds the answer (a one-unit tile: none)
    tiles = math.ceil(len(present) / tile)
    holding = len(range(last.index // tile * tile, min(last.index // tile * tile + tile, len(present))))
    assert last.windows_asked == tiles + (holding if holding > 1 else 0)


def test_nothing_found_asks_each_tile_once():
    found = search("last", 100, oracle_of([False] * 100), SearchSettings(rows_per_pass=8, tile_units=4))
    assert (found.index, found.windows_asked) == (-1, 25)


def test_a_tile_that_says_yes_alone_is_passed_over_for_the_next():
    """A false alarm: tile 20..23 says yes as a whole, none of its units does; the unit at 9 says
    yes alone and is the answer."""
    present = [False] * 30
    present[9] = True

    def oracle(windows):
        return [0.9 if w == [20, 21, 22, 23] or any(present[u] for u in w) else 0.1 for w in windows]
    found = search("last", 30, oracle, SearchSettings(tile_units=4))
    assert found.index == 9
    assert found.windows_asked == 8 + 4 + 4  # the tiles, the false alarm's units, the right tile's


def test_windows_never_exceed_rows_per_pass_in_one_call():
    calls = []

    def oracle(windows):
        calls.append(len(windows))
        return [0.1] * len(windows)
    search("first", 50, oracle, SearchSettings(rows_per_pass=7, tile_units=2))
    assert max(calls) == 7 and sum(calls) == 25


def test_the_timeline_refines_only_where_a_yes_may_be():
    present = [False] * 100
    present[37] = present[38] = True
    found = search("timeline", 100, oracle_of(present), SearchSettings(coarse_windows=10, refine_above=0.5))
    assert [i for i, p in enumerate(found.timeline) if p >= 0.5] == [37, 38]
    assert found.index == 38 and found.windows_asked == 10 + 10  # 10 coarse windows, one refined
    every = search("timeline", 8, oracle_of(present[30:38]))  # fewer units than coarse windows: unit by unit
    assert every.windows_asked == 8 and every.timeline == [0.1] * 7 + [0.9]


def test_unknown_mode_and_empty_memory_are_refused():
    with pytest.raises(ValueError, match="unknown mode 'latest'"):
        search("latest", 3, oracle_of([True] * 3))
    with pytest.raises(ValueError, match="no units"):
        search("last", 0, oracle_of([]))
    assert set(MODES) == {"last", "first", "timeline"}


def test_answer_in_stamps_keeps_to_the_window():
    units = [UnitInfo((0.0, 1.0), "/a", 0), UnitInfo((2.0, 3.0), "/a", 0), UnitInfo((4.0, 5.0), "/b", 1)]
    last = answer(Found(1, 0.8, [0.1, 0.8, 0.2], 5), "last", units, Window(1.0, 4.0), 12.0)
    assert (last.found, last.stamp, last.camera, last.questions_asked) == (True, 3.0, "/a", 5)
    assert last.timeline_stamps == [1.0, 2.0, 3.0, 4.0] and last.timeline_yes_probability == [0.1, 0.8, 0.8, 0.2]
    assert last.frames_searched == 4
    first = answer(Found(1, 0.8), "first", units, Window(), 1.0)
    assert first.stamp == 2.0 and first.timeline_stamps == []
    assert not answer(Found(), "last", units, Window(), 1.0).found


# -- through a Session ----------------------------------------------------------------------------
@pytest.fixture
def session(qwen_adapter, frames):
    s = Session(qwen_adapter, make_policy("fifo", budget_tokens=60), SessionConfig(chunk_frames=4, rows_per_pass=5))
    for i, frame in enumerate(frames(24)):
        s.add_frame(frame, stamp=100.0 + i, camera="/front")
    return s


def test_when_through_the_session_leaves_the_memory_as_it_was(session):
    before = session.policy.state_dict()
    for mode in MODES:
        result = session.when("Did you see a red circle?", mode)
        assert states_equal(session.policy.state_dict(), before)
        assert result.questions_asked > 0 and result.frames_searched == session.status().frames_in_memory
        if mode == "timeline":
            assert result.timeline_stamps == sorted(s for u in session.ledger.units.values() for s in u.stamps)
            assert all(0.0 <= p <= 1.0 for p in result.timeline_yes_probability)
    assert min(session.ledger.stamps(list(session.ledger.units))) < 119.0  # fifo keeps the newest frames
    windowed = session.when("Did you see a red circle?", "timeline", since=119.0, until=122.0)
    assert windowed.timeline_stamps == [119.0, 120.0, 121.0, 122.0]


def test_when_refusals_say_what_is_wrong(session, qwen_adapter):
    with pytest.raises(QuestionError, match="unknown mode 'sometimes'"):
        session.when("Did you see a red circle?", "sometimes")
    with pytest.raises(QuestionError, match="unknown camera '/rear'"):
        session.when("Did you see a red circle?", "last", camera="/rear")
    with pytest.raises(QuestionError, match="no frames in memory between 500.000 and now"):
        session.when("Did you see a red circle?", "last", since=500.0)
    with pytest.raises(QuestionError, match="the question is empty"):
        session.when("  ", "last")
    empty = Session(qwen_adapter, make_policy("full"), SessionConfig(chunk_frames=4))
    with pytest.raises(QuestionError, match="no frames in memory yet"):
        empty.when("Did you see a red circle?")


def test_a_standing_question_is_asked_over_the_chunk_just_encoded(session, frames):
    before = session.policy.state_dict()
    report = session.chunks.last
    answers = session.watch(["Did you see a red circle?", "Did you see a blue square?"], report)
    assert [a.question for a in answers] == ["Did you see a red circle?", "Did you see a blue square?"]
    assert all(a.camera == "/front" and a.stamp == 123.0 and a.answer in ("yes", "no") for a in answers)
    assert states_equal(session.policy.state_dict(), before)
    # the same as asking over that chunk's window with options yes / no, one question alone
    for a in answers:
        alone = session.ask(a.question, ["yes", "no"], since=120.0, until=123.0)
        assert alone.option_probabilities[0] == pytest.approx(a.yes_probability, abs=1e-5)
    assert session.watch([], report) == []


# -- the stamps found, with the yes known ----------------------------------------------------------
def known_yes(session, yes_stamps: set[float]):
    """The model's P(yes) replaced by the truth: 0.9 for a window holding a frame stamped in
    ``yes_stamps``, else 0.1 (the search, the windows and the stamps are the session's own)."""
    ledger = session.ledger

    def yes(prompts, windows, clock):
        return [0.9 if any(s in yes_stamps for u in w for s in ledger.units[u].stamps) else 0.1 for w in windows]
    session.answering.yes = yes


@pytest.mark.parametrize("mode, expected", [("last", 121.0), ("first", 116.0), ("LAST", 121.0), (" First ", 116.0)])
def test_when_finds_the_stamps_where_the_yes_is(session, mode, expected):
    """Frames 116-117 and 120-121 (of 114-123 in memory) hold the thing; last names the newest
    frame of the newest yes unit, first the oldest of the oldest; modes in any case."""
    known_yes(session, {116.0, 117.0, 120.0, 121.0})
    found = session.when("Did you see a red circle?", mode)
    assert found.found and found.stamp == expected and found.camera == "/front"
    assert found.yes_probability == pytest.approx(0.9)


def test_the_timeline_says_yes_exactly_at_the_frames_that_hold_it(session):
    known_yes(session, {116.0, 117.0})
    timeline = session.when("Did you see a red circle?", "timeline")
    assert timeline.found and timeline.stamp in timeline.timeline_stamps and timeline.stamp == 117.0
    yes = [s for s, p in zip(timeline.timeline_stamps, timeline.timeline_yes_probability) if p >= 0.5]
    assert yes == [116.0, 117.0]


def test_when_takes_only_yes_no_questions(session):
    for question in ["What color is the square now?", "When did you last see a red circle?", "how many circles?"]:
        with pytest.raises(QuestionError, match="is not a yes/no question: `when` takes a yes/no question about "
                                                "what was seen, starting with a verb such as Did"):
            session.when(question)
    for question in ["Is the square yellow?", "did you see a red circle", "Was there a blue square?"]:
        assert session.when(question).questions_asked > 0


def test_frames_searched_is_frames_in_memory_for_the_same_memory(qwen_adapter, frames):
    """HERMES keeps parts of frames: a frame counts once some layer holds half its tokens, for
    frames_in_memory and for what `when` searched alike."""
    from conftest import policy_for
    hermes = Session(qwen_adapter, policy_for(qwen_adapter, "hermes", budget_tokens=40), SessionConfig(chunk_frames=4))
    for i, frame in enumerate(frames(24)):
        hermes.add_frame(frame, stamp=100.0 + i, camera="/front")
    held = hermes.status().frames_in_memory
    assert held < sum(len(u.stamps) for u in hermes.ledger.units.values())  # some frames only partly kept
    for mode in MODES:
        assert hermes.when("Did you see a red circle?", mode).frames_searched == held
    assert hermes.ask("what moved?", max_new_tokens=1).frames_in_memory == held


# -- how far back an answer reaches ----------------------------------------------------------------
def test_a_memory_that_evicted_says_how_far_back_it_reaches(session):
    """fifo keeps the newest frames: the answers read from the oldest kept on, and say older ones
    were seen and evicted."""
    oldest_kept = session.status().oldest_stamp
    assert oldest_kept > 100.0
    for reply in (session.ask("what moved?", max_new_tokens=1), session.when("Did you see a red circle?")):
        assert reply.searched_since == oldest_kept and reply.evicted_before
    inside = session.when("Did you see a red circle?", since=oldest_kept + 2, until=122.0)
    assert inside.searched_since == oldest_kept + 2 and not inside.evicted_before  # nothing of the window evicted


def test_a_memory_that_holds_everything_says_nothing_was_evicted(qwen_adapter, frames):
    full = Session(qwen_adapter, make_policy("full"), SessionConfig(chunk_frames=4))
    for i, frame in enumerate(frames(8)):
        full.add_frame(frame, stamp=100.0 + i, camera="/front")
    for reply in (full.ask("what moved?", max_new_tokens=1), full.when("Did you see a red circle?", "first")):
        assert reply.searched_since == 100.0 and not reply.evicted_before
    known_yes(full, {100.0, 101.0})
    first = full.when("Did you see a red circle?", "first")
    assert first.stamp == 100.0 and not first.may_be_older  # the oldest seen: nothing older could be


def test_a_first_at_the_edge_of_an_evicted_memory_may_be_older(session):
    oldest_kept = session.status().oldest_stamp
    known_yes(session, {s for u in session.ledger.units.values() for s in u.stamps})  # yes everywhere
    first = session.when("Did you see a red circle?", "first")
    assert first.stamp == oldest_kept and first.evicted_before and first.may_be_older
    last = session.when("Did you see a red circle?", "last")
    assert last.stamp == 123.0 and not last.may_be_older
    known_yes(session, {120.0})  # inside the memory, away from its edge
    assert not session.when("Did you see a red circle?", "first").may_be_older


def test_with_the_archive_the_reach_is_the_archives(qwen_adapter, frames, tmp_path):
    """The archive keeps every chunk: a `when` and a question that recalls reach back to the first
    frame, and nothing seen is out of reach."""
    s = Session(qwen_adapter, make_policy("fifo", budget_tokens=60), SessionConfig(chunk_frames=4, rows_per_pass=5))
    s.open_archive(str(tmp_path / "archive"), max_bytes=1 << 30, recall_chunks=2)
    try:
        for i, frame in enumerate(frames(24)):
            s.add_frame(frame, stamp=100.0 + i, camera="/front")
        assert s.status().oldest_stamp > 100.0  # the working memory evicted
        for reply in (s.when("Did you see a red circle?", "first"), s.ask("what moved?", max_new_tokens=1),
                      s.ask("what moved?", max_new_tokens=1, since=101.0, until=104.0)):
            assert not reply.evicted_before
        assert s.when("Did you see a red circle?", "first").searched_since == 100.0
        assert s.ask("what moved?", max_new_tokens=1, since=101.0, until=104.0).searched_since == 101.0
    finally:
        s.close_archive()


def test_every_chunk_goes_to_on_chunk_partial_ones_included(qwen_adapter, frames, tmp_path):
    """Standing questions run on every chunk (the node asks them in ``Session.on_chunk``): a partial
    chunk that a question, a `when`, a save or a rate change encoded gets them as a full one does,
    in order, over its own frames."""
    s = Session(qwen_adapter, make_policy("fifo", budget_tokens=60), SessionConfig(chunk_frames=4))
    asked = []
    s.on_chunk = lambda report: asked.append(
        (report.frames, [a.stamp for a in s.watch(["Did you see a red circle?"], report)]))
    video = iter(frames(12))

    def feed(*stamps):
        for stamp in stamps:
            s.add_frame(next(video), stamp=stamp, camera="/front")
    feed(100.0, 101.0)
    s.ask("what moved?", max_new_tokens=1)  # the 2 frames waiting: a partial chunk
    feed(102.0, 103.0, 104.0, 105.0, 106.0)  # a full chunk, one frame waiting
    s.when("Did you see a red circle?")
    feed(107.0, 108.0)
    s.save(str(tmp_path / "memory.pt"))
    feed(109.0)
    s.tune(sample_fps=2.0)
    s.ask("what moved?", max_new_tokens=1)  # nothing waiting: no chunk
    assert asked == [(2, [101.0]), (4, [105.0]), (1, [106.0]), (2, [108.0]), (1, [109.0])]
    assert s.chunks.encoded == len(asked)
