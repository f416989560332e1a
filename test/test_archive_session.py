"""The archive tier behind a Session (engine/recall/tier.py): questions that reach past the bounded working
memory are answered from a replay of archived chunks, exactly as the full cache answers the same
window of a short stream; the GPU cache is left as it was; a new Session on the same folder answers
about the frames from before."""
from __future__ import annotations

import numpy as np
import pytest

from streamcache_ros import world
from streamcache_ros.engine.recall.archive import Archive, ArchiveSettings
from streamcache_ros.engine.errors import ArchiveError, ConfigError
from streamcache_ros.engine.factory import build_session
from streamcache_ros.engine.adapters.models import resolve_model_path

FRAMES = 96
SEED = 800_000_123  # the tests' seed range (docs/world-models.md)
FAMILIES = ("qwen2_5_vl", "llava_onevision")


@pytest.fixture(scope="module")
def stream():
    return world.make_stream(SEED, FRAMES, question_points=[FRAMES])


def model(family: str) -> str:
    return resolve_model_path(f"world-{family}")


def archived_session(family: str, folder, policy: str = "uniform", budget: int = 48, dtype: str = "float32", **kw):
    session = build_session({"model_path": model(family), "policy": policy, "budget_tokens": budget})
    identity = {"model_id": session.adapter.model_id, "config_hash": session.adapter.config_hash}
    session.attach_archive(Archive.open(ArchiveSettings(str(folder), dtype=dtype, **kw), identity, owner="/test"))
    return session


def feed(session, stream, frames: range):
    for i in frames:
        session.add_frame(stream.frame(i), stream.stamp(i))
    session.flush()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_window_wholly_in_the_archive_answers_as_the_full_cache_on_a_short_stream(family, stream, tmp_path):
    """fp32 store: the replay is the short stream itself, so the probabilities agree to the bit's
    worth; the bounded working memory is unchanged by the question."""
    session = archived_session(family, tmp_path)
    feed(session, stream, range(FRAMES))
    before = session.status()
    rng = np.random.default_rng(1)
    questions = stream.window_questions(FRAMES, 0, 15, rng)
    assert {q.kind for q in questions} >= {"seen", "now_count"}
    short = build_session({"model_path": model(family), "policy": "full"})
    feed(short, stream, range(16))
    for q in questions:
        recalled = session.ask(q.text, q.options, since=stream.stamp(0), until=stream.stamp(15))
        direct = short.ask(q.text, q.options, since=stream.stamp(0), until=stream.stamp(15))
        assert recalled.recalled_chunks == 2
        assert recalled.option_index == direct.option_index >= 0
        np.testing.assert_allclose(recalled.option_probabilities, direct.option_probabilities, atol=1e-5)
        assert all(0.0 <= e.stamp <= 15.0 for e in recalled.evidence)  # evidence names recalled frames
    after = session.status()
    assert after.cache.kv_bytes == before.cache.kv_bytes and after.frames_in_memory == before.frames_in_memory
    session.close_archive()


def test_a_window_the_working_memory_holds_whole_is_not_recalled(stream, tmp_path):
    session = archived_session("qwen2_5_vl", tmp_path, policy="full", budget=0)
    feed(session, stream, range(32))
    answer = session.ask("How many objects are in view now?", ["0", "1", "2"], since=0.0, until=15.0)
    assert answer.recalled_chunks == 0
    session.close_archive()


def test_a_question_without_a_window_recalls_the_first_and_the_relevant_chunks(stream, tmp_path):
    session = archived_session("qwen2_5_vl", tmp_path, recall_chunks=3)
    feed(session, stream, range(FRAMES))
    # a question not about the beginning (that one reads the first chunk alone) nor about now
    answer = session.ask("What color was the object you saw?", list(world.COLOUR_NAMES[:4]))
    # the first chunk, three recalled for relevance, the two newest
    assert answer.recalled_chunks == 6 and answer.frames_in_memory == 6 * 8
    assert answer.oldest_stamp == 0.0 and answer.newest_stamp == FRAMES - 1
    # recall_chunks 0: none recalled for relevance, yet the question still reads the day's first
    # chunk and the newest two, as the archive reaches past the working memory
    none = archived_session("qwen2_5_vl", tmp_path / "off", recall_chunks=0)
    feed(none, stream, range(FRAMES))
    plain = none.ask("What color was the object you saw?", list(world.COLOUR_NAMES[:4]))
    assert plain.recalled_chunks == 3 and plain.oldest_stamp == 0.0
    session.close_archive(), none.close_archive()


def test_when_searches_the_archive_and_finds_frames_the_cache_evicted(stream, tmp_path):
    session = archived_session("qwen2_5_vl", tmp_path)
    feed(session, stream, range(FRAMES))
    identity = next(v.identity for v in stream.truth[0])
    first = stream.identity_frames(identity, FRAMES)[0]
    found = session.when(world.SEEN_PROBE.format(shape=identity[0], colour=identity[1]), "first")
    # the walk's replay of every chunk, then the moment's chunk replayed alone to confirm it
    assert found.recalled_chunks == FRAMES // 8 + 1 and found.frames_searched == FRAMES
    assert found.found and abs(found.stamp - stream.stamp(first)) <= 2.0
    session.close_archive()


def test_a_new_session_on_the_same_archive_answers_about_the_frames_from_before(stream, tmp_path):
    session = archived_session("qwen2_5_vl", tmp_path)
    feed(session, stream, range(48))
    q = stream.window_questions(FRAMES, 8, 15, np.random.default_rng(2), ("now_color", "now_count"))[0]
    expected = session.ask(q.text, q.options, since=8.0, until=15.0)
    with pytest.raises(ArchiveError, match="in use"):
        archived_session("qwen2_5_vl", tmp_path)
    session.close_archive()
    restarted = archived_session("qwen2_5_vl", tmp_path)
    assert restarted.status().frames_in_memory == 0 and restarted.status().archive.chunks == 6
    again = restarted.ask(q.text, q.options, since=8.0, until=15.0)
    assert again.recalled_chunks == 1 and again.option_index == expected.option_index >= 0
    plain = restarted.ask(q.text, q.options)  # no window, nothing in the working memory: the archive answers
    # the first chunk, the newest two and (recall_chunks 2) two more for relevance
    assert plain.recalled_chunks == 5 and plain.searched_since == stream.stamp(0) and plain.option_index >= 0
    feed(restarted, stream, range(48, 64))  # and it goes on where it was
    assert restarted.status().archive.chunks == 8
    restarted.close_archive()


def test_reset_clears_the_archive_too(stream, tmp_path):
    session = archived_session("qwen2_5_vl", tmp_path)
    feed(session, stream, range(32))
    session.reset()
    status = session.status()
    assert status.archive.chunks == 0 and status.archive.bytes == 0 and status.frames_in_memory == 0
    session.close_archive()


def test_standing_answers_are_kept_beside_their_chunk(stream, tmp_path):
    session = archived_session("qwen2_5_vl", tmp_path)
    for i in range(8):
        report = session.add_frame(stream.frame(i), stream.stamp(i))
    answers = session.watch(["Did you see a red circle?"], report)
    (row,) = session.memory.archive.rows()
    assert row.watch == {"Did you see a red circle?": pytest.approx(answers[0].yes_probability, abs=1e-4)}
    session.close_archive()


def test_build_session_opens_the_archive_a_folder_names_and_refuses_one_in_use(stream, tmp_path, monkeypatch):
    """The factory builds the archive tier as it builds the policy: every front end gets it from
    ``archive_path``; a folder held by another session is a ConfigError naming archive_path, with
    the holder's name; bad archive numbers are refused before a model loads."""
    params = {"model_path": model("qwen2_5_vl"), "policy": "uniform", "budget_tokens": 48,
              "archive_path": str(tmp_path), "recall_chunks": 2, "archive_owner": "/robot/memory"}
    session = build_session(params)
    feed(session, stream, range(16))
    assert session.status().archive.chunks == 2 and session.archive_warnings() == []
    with pytest.raises(ConfigError, match="archive_path") as refused:
        build_session({**params, "archive_owner": "/robot/other"})
    assert "/robot/memory" in str(refused.value)
    session.close_archive()
    assert build_session({**params, "archive_path": ""}).status().archive is None
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    for off in ("off", "OFF", " Off "):  # what a shell passes for no archive, not a folder named so
        assert build_session({**params, "archive_path": off}).status().archive is None
    assert list((tmp_path / "elsewhere").iterdir()) == []
    for name, value in (("recall_chunks", -1), ("archive_max_bytes", 0)):
        with pytest.raises(ConfigError, match=name):
            build_session({**params, "model_path": "/no/such/model", name: value})


def test_a_window_longer_than_one_replay_says_it_was_read_in_part(stream, tmp_path):
    """One replay holds ``max_replay_chunks``: a window of more archived chunks is read in part, and
    the reply says so (``evicted_before``); one that fits is read whole and says nothing."""
    session = archived_session("qwen2_5_vl", tmp_path, max_replay_chunks=3)
    feed(session, stream, range(FRAMES))  # 12 chunks; the working memory holds the newest few
    q = stream.window_questions(FRAMES, 0, 47, np.random.default_rng(3), ("now_count",))[0]
    wide = session.ask(q.text, q.options, since=stream.stamp(0), until=stream.stamp(47))  # 6 chunks
    assert wide.recalled_chunks == 3 and wide.evicted_before
    narrow = session.ask(q.text, q.options, since=stream.stamp(0), until=stream.stamp(23))  # 3 chunks
    assert narrow.recalled_chunks == 3 and not narrow.evicted_before
    # "did you see" walks the window in replays of 3 (no index here): all of it, read whole
    seen = stream.window_questions(FRAMES, 0, 47, np.random.default_rng(3), ("seen",))[0]
    walked = session.ask(seen.text, seen.options, since=stream.stamp(0), until=stream.stamp(47))
    assert walked.found_by == "walk" and walked.search_complete and not walked.evicted_before
    timeline = session.when("Did you see a red circle?", "timeline", since=stream.stamp(0), until=stream.stamp(47))
    assert timeline.recalled_chunks == 3 and timeline.evicted_before
    session.close_archive()


def test_questions_between_frames_do_not_split_the_archives_chunks(stream, tmp_path):
    """A question encodes the frames waiting for their chunk (it must see them): those parts are
    archived at once, then replaced by one chunk made again from their frames once they add up to a
    chunk, so the bytes a frame take do not depend on how often questions come."""
    quiet = archived_session("qwen2_5_vl", tmp_path / "quiet")
    feed(quiet, stream, range(24))
    asked = archived_session("qwen2_5_vl", tmp_path / "asked")
    for i in range(27):
        asked.add_frame(stream.frame(i), stream.stamp(i))
        if i % 3 == 2:  # a question after every third frame: each flushes a part of 3 (or 2) frames
            asked.ask("How many objects are in view now?", ["0", "1", "2"])
    rows = asked.memory.archive.rows()
    # every frame archived once, in whole chunks: three parts of 3 made one chunk of 9, three times
    assert sorted(s for r in rows for s in r.stamps) == [stream.stamp(i) for i in range(27)]
    assert [len(r.stamps) for r in rows] == [9, 9, 9]
    whole = [r for r in rows if len(r.stamps) >= 8]
    per_frame = sum(r.bytes for r in whole) / sum(len(r.stamps) for r in whole)
    quiet_rows = quiet.memory.archive.rows()
    quiet_per_frame = sum(r.bytes for r in quiet_rows) / sum(len(r.stamps) for r in quiet_rows)
    assert per_frame <= 1.15 * quiet_per_frame
    assert rows[0].pinned  # the camera's first chunk stays pinned when its parts are made whole
    # the whole chunk answers a question over its window as the quiet archive's does
    q = stream.window_questions(27, 0, 7, np.random.default_rng(4), ("now_count",))[0]
    a = asked.ask(q.text, q.options, since=stream.stamp(0), until=stream.stamp(7))
    b = quiet.ask(q.text, q.options, since=stream.stamp(0), until=stream.stamp(7))
    assert a.recalled_chunks >= 1 and a.option_index == b.option_index
    quiet.close_archive(), asked.close_archive()


def test_parts_that_cannot_be_made_whole_stay_as_they_are(stream, tmp_path):
    session = archived_session("qwen2_5_vl", tmp_path)

    def out_of_memory(camera, frames):
        raise RuntimeError("CUDA out of memory (a stand-in for the vision encoder failing)")
    session.memory.encode_whole = out_of_memory
    for i in range(8):
        session.add_frame(stream.frame(i), stream.stamp(i))
        if i % 4 == 3:
            session.ask("How many objects are in view now?", ["0", "1", "2"])
    rows = session.memory.archive.rows()
    assert [len(r.stamps) for r in rows] == [4, 4]  # both parts kept, every frame archived once
    assert session.status().chunks_encoded == 2
    session.close_archive()


def test_a_question_about_now_reads_the_working_memory_and_one_about_the_past_the_archive(stream, tmp_path):
    """"How many objects are in view now?" with no window is answered by the working memory, which
    always holds the newest frames whole, however far the archive reaches; "the first object" reads
    the archive's first chunk alone, as a short stream of it answers; another question replays more;
    after a restart on the archive (the working memory empty) "now" replays."""
    session = archived_session("qwen2_5_vl", tmp_path)
    feed(session, stream, range(FRAMES))  # the archive reaches far past the working memory
    now = session.ask("How many objects are in view now?", ["0", "1", "2"])
    assert now.recalled_chunks == 0 and now.newest_stamp == stream.stamp(FRAMES - 1)
    first = session.ask("What color was the first object you saw?", list(world.COLOUR_NAMES))
    assert first.recalled_chunks == 1 and first.oldest_stamp == stream.stamp(0)  # the first chunk alone
    short = build_session({"model_path": model("qwen2_5_vl"), "policy": "full"})
    feed(short, stream, range(8))  # the same chunk as a short stream: the same answer
    direct = short.ask("What color was the first object you saw?", list(world.COLOUR_NAMES))
    assert first.option_index == direct.option_index
    np.testing.assert_allclose(first.option_probabilities, direct.option_probabilities, atol=1e-4)
    other = session.ask("What color was the object you saw?", list(world.COLOUR_NAMES))
    assert other.recalled_chunks >= 3  # the first, the best-ranked and the newest chunks
    session.close_archive()
    restarted = archived_session("qwen2_5_vl", tmp_path)
    assert restarted.ask("How many objects are in view now?", ["0", "1", "2"]).recalled_chunks >= 1
    restarted.close_archive()


def _same_state(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    if hasattr(a, "shape"):
        return a.shape == b.shape and bool((a == b).all())
    return a == b


def test_a_replays_scratch_memory_starts_from_a_copy_of_its_system_prompt(stream):
    """The scratch memory a replay is prefilled into holds the system prompt's KV; the first one
    prefills it, the next ones start from a copy (recall/scratch.py), bit for bit the same, and a
    chunk taken into one changes neither the copy nor the others."""
    session = build_session({"model_path": model("qwen2_5_vl"), "policy": "uniform", "budget_tokens": 48})
    first, second = session.memory.make_scratch(), session.memory.make_scratch()
    assert first._prefix_state is None and second._prefix_state is not None
    prompt = first.policy.state_dict()
    assert _same_state(prompt, second.policy.state_dict())
    feed(second, stream, range(8))
    assert second.status().frames_in_memory == 8
    assert _same_state(prompt, session.memory.make_scratch().policy.state_dict())
    assert _same_state(prompt, first.policy.state_dict())
