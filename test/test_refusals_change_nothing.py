"""A refusal changes nothing (docs/reliability.md "A refusal changes nothing"): every request the
session refuses (ask, when, save, load) is refused before a waiting frame is encoded or a token
evicted. A partial chunk is left waiting, every kind of refusal is sent, and the whole memory is
compared before and after: the ledger, the cache's tensors and positions, its bytes, the frames
waiting, the archive's rows, the history and the counters."""
import copy
import math

import pytest
import torch

from streamcache_ros.engine import QuestionError, Session, SessionConfig
from streamcache_ros.engine.errors import SnapshotError

from conftest import policy_for
from test_reliability_session import assert_same

CHUNK = 4  # frames per chunk: two Qwen2.5-VL units
WAITING = 2  # frames left waiting for their chunk (a partial chunk)


def memory_state(session: Session) -> dict:
    """Everything a refusal must leave as it was, read without touching the memory (``save``
    would encode the waiting frames)."""
    policy_state = {k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                    for k, v in session.policy.state_dict().items()}
    waiting = {camera: [(stamp, frame.tobytes()) for frame, stamp in batch]
               for camera, batch in session._pending.pending.items()}
    archive = session.memory.archive
    stats = archive.stats()
    rows = [(r.chunk_id, r.camera, r.stamps, r.pinned, r.bytes, r.watch) for r in archive.rows()]
    return {"ledger": copy.deepcopy(session.ledger.state_dict()), "policy": policy_state,
            "kv_bytes": session.policy.stats().kv_bytes, "kv_tokens": session.policy.stats().kv_tokens,
            "waiting": waiting, "pending_frames": session.pending_frames(),
            "archive": {k: stats[k] for k in ("chunks", "bytes", "oldest_stamp", "newest_stamp")}, "rows": rows,
            "history": [(x.question, x.answer, list(x.options)) for x in session.history],
            "questions_answered": session.questions_answered,
            "chunks": (session.chunks.encoded, session.chunks.failed, session.chunks.attempts)}


@pytest.fixture
def session(qwen_adapter, frames, tmp_path):
    """A fifo session with an archive, 3 whole chunks in memory (some of it evicted), and a
    partial chunk of 2 frames waiting."""
    session = Session(qwen_adapter, policy_for(qwen_adapter, "fifo", budget_tokens=24),
                      SessionConfig(chunk_frames=CHUNK, cameras=("/cam",), max_question_tokens=64))
    session.open_archive(str(tmp_path / "archive"), max_bytes=1 << 30, recall_chunks=2)
    for i, frame in enumerate(frames(3 * CHUNK + WAITING)):
        session.add_frame(frame, stamp=10.0 + i, camera="/cam")
    session.ask("what moved?", max_new_tokens=2)  # a history to keep unchanged (encodes the waiting 2)
    for i, frame in enumerate(frames(WAITING, start=20)):
        session.add_frame(frame, stamp=40.0 + i, camera="/cam")
    assert session.pending_frames() == WAITING
    yield session
    session.close_archive()


def other_policy_snapshot(qwen_adapter, frames, path) -> str:
    other = Session(qwen_adapter, policy_for(qwen_adapter, "full"), SessionConfig(chunk_frames=CHUNK))
    for i, frame in enumerate(frames(CHUNK)):
        other.add_frame(frame, stamp=float(i), camera="/cam")
    other.save(str(path))
    return str(path)


def refusals(session, qwen_adapter, frames, tmp_path):
    """(what, call, the error it must raise, a pattern of its message), one per kind of refusal."""
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a snapshot at all")
    (tmp_path / "a_folder").mkdir()
    other = other_policy_snapshot(qwen_adapter, frames, tmp_path / "other.pt")
    far = dict(since=1000.0, until=2000.0)  # no frame there: not in memory, not waiting, not archived
    return [
        ("ask: empty", lambda: session.ask(""), QuestionError, "the question is empty"),
        ("ask: too many options", lambda: session.ask("which?", [f"o{i}" for i in range(27)]), QuestionError,
         "at most 26 options"),
        ("ask: empty option", lambda: session.ask("which?", ["red", " "]), QuestionError, "is empty"),
        ("ask: not UTF-8", lambda: session.ask("what is \ufffd?"), QuestionError, "not valid UTF-8"),
        ("ask: too long", lambda: session.ask("why " * 300), QuestionError, "max_question_tokens"),
        ("ask: unknown camera", lambda: session.ask("what?", camera="/rear"), QuestionError, "unknown camera"),
        ("ask: empty window", lambda: session.ask("what?", since=5.0, until=4.0), QuestionError, "window is empty"),
        ("ask: NaN window", lambda: session.ask("what?", since=math.nan), QuestionError, "must be numbers"),
        ("ask: window with no frame", lambda: session.ask("what?", **far), QuestionError, "no frames"),
        ("ask: negative max_new_tokens", lambda: session.ask("what?", max_new_tokens=-1), QuestionError, ">= 0"),
        ("ask: an answer past the room a chunk leaves", lambda: session.ask("what?", max_new_tokens=500),
         QuestionError, "ask for at most"),
        ("ask: negative evidence_k", lambda: session.ask("what?", evidence_k=-1), QuestionError, "evidence_k"),
        ("when: unknown mode", lambda: session.when("Did you see a red circle?", mode="sometimes"), QuestionError,
         "unknown mode"),
        ("when: not a yes/no question", lambda: session.when("What color is the square now?"), QuestionError,
         "yes/no question"),
        ("when: empty", lambda: session.when(""), QuestionError, "the question is empty"),
        ("when: window with no frame", lambda: session.when("Did you see a red circle?", **far), QuestionError,
         "no frames"),
        ("when: unknown camera", lambda: session.when("Did you see a red circle?", camera="/rear"), QuestionError,
         "unknown camera"),
        ("save: missing folder", lambda: session.save(str(tmp_path / "missing" / "m.pt")), SnapshotError,
         "does not exist"),
        ("save: a folder", lambda: session.save(str(tmp_path / "a_folder")), SnapshotError, "is a folder"),
        ("load: missing file", lambda: session.load(str(tmp_path / "missing.pt")), SnapshotError, "no snapshot at"),
        ("load: not a snapshot", lambda: session.load(str(garbage)), SnapshotError, "is not a streamcache snapshot"),
        ("load: another policy's", lambda: session.load(other), SnapshotError, "was made with policy"),
    ]


def test_every_refusal_leaves_the_whole_memory_and_the_waiting_frames_as_they_were(session, qwen_adapter, frames,
                                                                                  tmp_path):
    before = memory_state(session)
    for what, call, error, message in refusals(session, qwen_adapter, frames, tmp_path):
        with pytest.raises(error, match=message):
            call()
        assert_same(before, memory_state(session), what)
    # the comparison sees a change: an answered question encodes the waiting frames
    assert session.ask("what moved?", max_new_tokens=2).text is not None
    after = memory_state(session)
    assert after["pending_frames"] == 0 and after["ledger"] != before["ledger"]
    # archived, then made whole with the part the fixture's question encoded: 2 + 2 frames, one chunk
    # in place of the first part (docs/archive.md "Questions never stop the cameras")
    assert after["archive"]["chunks"] == before["archive"]["chunks"] and after["archive"] != before["archive"]


def test_a_window_that_only_the_waiting_frames_reach_is_answered(session):
    """The check before encoding counts the waiting frames: a window holding only them is no
    refusal (they are encoded, then answered from)."""
    answer = session.ask("what moved?", since=40.0, until=41.0, max_new_tokens=2)
    assert session.pending_frames() == 0
    assert answer.frames_in_memory >= 1 and 40.0 <= answer.oldest_stamp <= answer.newest_stamp <= 41.0
