"""``when`` over an indexed archive: retrieve, then verify (docs/archive.md "When with the index").
The bundled world model and the bundled world-retrieval, a held-out world stream, a bounded working
memory that has long let the asked frames go."""
from __future__ import annotations

import numpy as np
import pytest

from streamcache_ros import world
from streamcache_ros.engine import build_session
from streamcache_ros.engine.memory.ledger import Window
from streamcache_ros.engine.adapters.models import RETRIEVAL_DIR, WORLD_RETRIEVAL, resolve_model_path
from streamcache_ros.engine.recall.archive import Archive, ArchiveSettings
from streamcache_ros.engine.recall.index import RetrievalEncoder

SEED = 800_000_321  # the tests' seed range (docs/world-models.md): no training run draws it
FRAMES = 160


@pytest.fixture(scope="module")
def stream():
    return world.make_stream(SEED, FRAMES, question_points=[FRAMES])


@pytest.fixture(scope="module")
def encoder():
    return RetrievalEncoder.load(str(RETRIEVAL_DIR / WORLD_RETRIEVAL))


def archived(folder, encoder=None, **kw):
    session = build_session({"model_path": resolve_model_path("world-qwen2_5_vl"), "policy": "uniform",
                             "budget_tokens": 48})
    identity = {"model_id": session.adapter.model_id, "config_hash": session.adapter.config_hash}
    session.attach_archive(Archive.open(ArchiveSettings(str(folder), dtype="float32", **kw), identity, owner="/t"),
                           encoder=encoder)
    return session


@pytest.fixture(scope="module")
def indexed(stream, encoder, tmp_path_factory):
    session = archived(tmp_path_factory.mktemp("indexed"), encoder)
    reports = []
    for i in range(FRAMES):
        report = session.add_frame(stream.frame(i), stream.stamp(i))
        if report is not None:
            reports.append(report)
    session.flush()
    yield session
    session.close_archive()


def identities(stream):
    return sorted({v.identity for views in stream.truth for v in views})


def probe(identity):
    return world.SEEN_PROBE.format(shape=identity[0], colour=identity[1])


def test_when_ranks_then_verifies_a_few_short_replays_and_finds_the_moment(indexed, stream):
    hits, replays = [], []
    for identity in identities(stream):
        frames = stream.identity_frames(identity, FRAMES)
        for mode, truth in (("last", frames[-1]), ("first", frames[0])):
            found = indexed.when(probe(identity), mode)
            assert found.found_by == "index" and found.recalled_chunks <= 4 and found.questions_asked <= 4
            hits.append(found.found and abs(found.stamp - stream.stamp(truth)) <= 2.0)
            replays.append(found.recalled_chunks)
    # a floor, not the figure (bench/archive_recall.py measures it): the walk found 2 in 3
    assert np.mean(hits) >= 0.7, hits
    assert np.median(replays) <= 2


def test_an_identity_never_in_view_is_not_found_without_walking_the_day(indexed, stream):
    seen = set(identities(stream))
    never = [(s, c) for s in world.SHAPES for c in world.COLOUR_NAMES if (s, c) not in seen][:3]
    for identity in never:
        found = indexed.when(probe(identity), "first")
        assert found.found_by == "index" and found.recalled_chunks <= 4
        assert not found.found, (identity, found.stamp)


def test_a_timeline_is_the_index_over_the_whole_window_with_no_replay(indexed, stream):
    identity = identities(stream)[0]
    found = indexed.when(probe(identity), "timeline", since=stream.stamp(10), until=stream.stamp(100))
    assert found.found_by == "index" and found.recalled_chunks == 0 and found.questions_asked == 0
    assert found.timeline_stamps == [stream.stamp(i) for i in range(10, 101)]
    truth = np.array([identity in {v.identity for v in stream.truth[i]} for i in range(10, 101)])
    said = np.array(found.timeline_yes_probability) >= 0.5
    assert (said == truth).mean() >= 0.8


def test_a_standing_question_answers_its_own_when_from_what_it_noted(stream, encoder, tmp_path):
    identity = identities(stream)[0]
    question = probe(identity)
    session = archived(tmp_path, encoder)
    for i in range(64):
        report = session.add_frame(stream.frame(i), stream.stamp(i))
        if report is not None:
            session.watch([question], report)
    found = session.when(question, "last", since=stream.stamp(0), until=stream.stamp(63))
    assert found.found_by == "standing" and found.recalled_chunks == 0 and found.questions_asked == 0
    frames = stream.identity_frames(identity, 64)
    if frames:
        assert found.found and abs(found.stamp - stream.stamp(frames[-1])) <= 8.0  # within its chunk
    session.close_archive()


def test_an_archive_without_an_index_is_walked_and_says_so(stream, tmp_path):
    session = archived(tmp_path)
    for i in range(48):
        session.add_frame(stream.frame(i), stream.stamp(i))
    identity = next(iter(stream.truth[0])).identity
    found = session.when(probe(identity), "first")
    assert found.found_by == "walk" and found.recalled_chunks == 6 + 1  # and the moment's chunk, to confirm it
    session.close_archive()


def test_a_plain_question_recalls_the_chunks_the_index_ranks_best(indexed, stream):
    answer = indexed.ask("What color was the object you saw?", ["red", "green", "blue", "yellow", "white", "purple"])
    assert answer.recalled_chunks >= 3  # the first chunk, the newest two, and the relevant ones
    assert answer.found_by == ""  # not a "did you see": the model answers over the replay


@pytest.mark.parametrize("options", [["yes", "no"], ["No", "Yes"], []])
def test_did_you_see_is_retrieved_then_verified_and_its_first_evidence_shows_it(indexed, stream, options):
    seen = identities(stream)
    never = next((s, c) for s in world.SHAPES for c in world.COLOUR_NAMES if (s, c) not in seen)
    for identity in (seen[-1], never):
        answer = indexed.ask(probe(identity), options)
        frames = stream.identity_frames(identity, FRAMES)
        said = (options or ["yes", "no"])[answer.option_index if options else ["yes", "no"].index(answer.text)]
        assert said.lower() == ("yes" if frames else "no") and answer.found_by == "index" and answer.search_complete
        if options:
            assert answer.option_probabilities[answer.option_index] > 0.5
        if frames:  # the moment found, verified, is the first evidence: it shows what was asked
            assert int(round(answer.evidence[0].stamp)) in frames and answer.recalled_chunks >= 1
        else:
            assert answer.evidence == [] and answer.recalled_chunks == 0


@pytest.mark.parametrize("kind", ["when walk", "windowed ask", "when verified"])
def test_a_replay_runs_off_the_turn_lock_while_a_chunk_is_encoded(kind, stream, encoder, tmp_path):
    """The replay's prefill waits until a chunk has been encoded meanwhile: with the turn lock held
    across the replay, that chunk could never be encoded and the wait would run out (a hang guard,
    not a timing)."""
    import threading

    session = archived(tmp_path, encoder if kind == "when verified" else None)
    for i in range(64):
        session.add_frame(stream.frame(i), stream.stamp(i))
    encoded, results = threading.Event(), []
    prefill = session.memory._prefill

    def prefill_after_a_chunk(rows):
        results.append(encoded.wait(timeout=120))
        return prefill(rows)
    session.memory._prefill = prefill_after_a_chunk
    identity = next(iter(stream.truth[0])).identity
    ask = {"when walk": lambda: session.when(probe(identity), "first"),
           "when verified": lambda: session.when(probe(identity), "first"),
           "windowed ask": lambda: session.ask("How many objects are in view now?", ["0", "1", "2"], since=0.0,
                                               until=stream.stamp(15))}[kind]
    question = threading.Thread(target=lambda: results.append(ask()))
    question.start()
    before = session.status().chunks_encoded
    for i in range(64, 72):  # one chunk: encoded under the turn lock while the question replays
        session.add_frame(stream.frame(i), stream.stamp(i))
    assert session.status().chunks_encoded == before + 1
    encoded.set()
    question.join(timeout=120)
    assert results[0] is True and len(results) >= 2
    answer = results[-1]
    assert answer.recalled_chunks >= 1
    if kind != "windowed ask":
        assert answer.found_by == ("walk" if kind == "when walk" else "index")
    session.close_archive()


def test_a_standing_question_over_a_window_that_cuts_a_chunk_answers_from_inside_the_window(stream, encoder,
                                                                                            tmp_path):
    """A chunk's standing P(yes) covers all of its frames: over a window that cuts the chunk it may be
    the frames outside that said yes. Those chunks are decided by the index over the frames inside."""
    session = archived(tmp_path, encoder)
    identities_seen = identities(stream)
    for i in range(FRAMES):
        report = session.add_frame(stream.frame(i), stream.stamp(i))
        if report is not None:
            session.watch([probe(identity) for identity in identities_seen], report)
    # a chunk where an identity is in view in its first half only: the window starts at its second half
    cases = [(identity, start) for identity in identities_seen for start in range(0, FRAMES - 8, 8)
             if stream.identity_frames(identity, start + 4) and start + 3 in stream.identity_frames(identity, start + 4)
             and not any(start + k in stream.identity_frames(identity, FRAMES) for k in range(4, 8 + 8))]
    assert cases, "no chunk of this stream shows an identity in its first half only"
    identity, start = cases[0]
    since, until = stream.stamp(start + 4), stream.stamp(start + 15)
    standing = session.memory.standing_answers(probe(identity), "", Window(since, until))
    assert standing is not None and standing[0][1] >= 0.5  # it stood there, and said yes over the whole chunk
    found = session.when(probe(identity), "last", since=since, until=until)
    assert not found.found, found  # the frames that said yes lie outside the window
    session.close_archive()


def test_a_walks_moment_the_chunk_alone_does_not_confirm_is_passed_over(stream, tmp_path, monkeypatch):
    """A walk (no index) judges the moment it finds a second time, its chunk replayed alone; one that
    is not confirmed is passed over and the search goes on past it in the same replay."""
    from streamcache_ros.engine.questions import desk

    session = archived(tmp_path)
    for i in range(FRAMES):
        session.add_frame(stream.frame(i), stream.stamp(i))
    identity = max(identities(stream), key=lambda i: len({f // 8 for f in stream.identity_frames(i, FRAMES)}))
    assert len({f // 8 for f in stream.identity_frames(identity, FRAMES)}) >= 2  # seen in two chunks at least
    first = session.when(probe(identity), "last")
    assert first.found and first.found_by == "walk"
    judged = []
    confirm = desk.confirm_moment

    def reject_the_first(tier, question, camera, stamp, window):
        judged.append(stamp)
        return 0.1 if len(judged) == 1 else confirm(tier, question, camera, stamp, window)
    monkeypatch.setattr(desk, "confirm_moment", reject_the_first)
    again = session.when(probe(identity), "last")
    assert judged[0] == first.stamp and len(judged) >= 2  # the walk went on past the moment rejected
    held = next(r for r in session.memory.archive.rows() if r.first_stamp <= first.stamp <= r.last_stamp)
    assert not again.found or again.stamp < held.first_stamp  # an older moment, outside the rejected chunk
    session.close_archive()


def test_a_walk_whose_every_moment_is_rejected_answers_not_found_and_never_raises(stream, tmp_path, monkeypatch):
    """Replays of two chunks: a moment passed over in a replay's oldest chunk leaves nothing of that
    replay to search past it; the walk goes on to the next replay, and with every moment rejected
    answers not found (the index-less walk's false yes, judged a second time)."""
    from streamcache_ros.engine.questions import desk

    session = archived(tmp_path, max_replay_chunks=2)
    for i in range(64):
        session.add_frame(stream.frame(i), stream.stamp(i))
    monkeypatch.setattr(desk, "confirm_moment", lambda *args: 0.1)
    for identity in identities(stream)[:3]:
        for mode in ("last", "first"):
            found = session.when(probe(identity), mode)
            assert not found.found and found.found_by == "walk"
    session.close_archive()
