"""Reliability of the engine's Session (docs/reliability.md, "Faults survived"): faults mid-chunk
and mid-question (errors and CUDA out of memory) leave a consistent cache, bad questions leave it
byte-identical, questions give way to a waiting chunk, the question history stays bounded.

"As if the chunk never came" is checked against a second session fed the same frames without the
failed chunk: every tensor and counter of the two caches must be equal (CPU, deterministic)."""
import threading

import pytest
import torch

from streamcache_ros.engine import AnswerError, ChunkError, QuestionError, Session, SessionConfig, failpoints
from streamcache_ros.engine.failpoints import FaultPlan
from streamcache_ros.engine.memory.snapshots import read_state
from streamcache_ros.engine.questions.turns import TurnLock

from conftest import policy_for

POLICIES = {"full": {}, "fifo": {"budget_tokens": 24}, "hermes": {"budget_tokens": 40}, "h2svc": {"n_e": 3}}
CHUNK = 4  # frames per chunk: two Qwen2.5-VL units (temporal patches of 2 frames)


def session_for(adapter, policy, **config):
    return Session(adapter, policy_for(adapter, policy, **POLICIES[policy]),
                   SessionConfig(chunk_frames=CHUNK, **config))


def feed(session, frames, first_stamp):
    """Feed whole chunks; returns the ChunkErrors raised (the stream goes on after each)."""
    errors = []
    for i, frame in enumerate(frames):
        try:
            session.add_frame(frame, stamp=first_stamp + i, camera="/cam")
        except ChunkError as err:
            errors.append(err)
    return errors


def assert_same(a, b, where="state"):
    """Deep equality of snapshot-like structures; tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, set(a) ^ set(b))
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def snapshot(session, path):
    session.save(str(path))
    return read_state(str(path))


def fail_on_forward(chunk_attempt, forward_index, exception):
    """A prefill failpoint action that raises at the middle layer of the ``forward_index``-th forward
    pass of the ``chunk_attempt``-th chunk (H2SVC prefills unit by unit: several forwards per chunk)."""
    seen = [0]

    def action(chunk, layer, layers):
        if chunk == chunk_attempt and layer == layers // 2:
            seen[0] += 1
            if seen[0] == forward_index:
                raise exception
    return action


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_fault_in_the_last_prefill_step_leaves_the_cache_as_if_the_chunk_never_came(qwen_adapter, frames, policy):
    video = frames(3 * CHUNK)
    faulty = session_for(qwen_adapter, policy)
    forwards = 2 if faulty.policy.prefill_unit_by_unit else 1  # the last one: every earlier step is done
    with failpoints.armed(prefill=fail_on_forward(2, forwards, RuntimeError("simulated fault"))):
        errors = feed(faulty, video, 0.0)
    assert len(errors) == 1 and not errors[0].kept and "dropped: RuntimeError: simulated fault" in str(errors[0])

    clean = session_for(qwen_adapter, policy)
    feed(clean, video[:CHUNK], 0.0)
    feed(clean, video[2 * CHUNK:], 2.0 * CHUNK)  # the same frames and stamps, without the failed chunk
    assert_same(faulty.policy.state_dict(), clean.policy.state_dict())
    assert faulty.ledger.units == clean.ledger.units  # unit ids, stamps, cameras and chunk ids
    status = faulty.status()
    assert (status.chunks_encoded, status.chunks_failed, status.frames_in_memory) == (2, 1, clean.status().frames_in_memory)
    assert faulty.ask("what moved?", max_new_tokens=4).text == clean.ask("what moved?", max_new_tokens=4).text


def test_cuda_out_of_memory_mid_chunk_drops_the_chunk_and_frees_the_allocator(qwen_adapter, frames, tmp_path,
                                                                               monkeypatch):
    # no GPU here: the allocator call is recorded instead (torch.cuda.empty_cache is a no-op on CPU)
    released = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: released.append(1))
    session = session_for(qwen_adapter, "fifo")
    video = frames(3 * CHUNK)
    with FaultPlan.parse("chunk:2=oom").armed():
        feed(session, video[:CHUNK], 0.0)
        before = snapshot(session, tmp_path / "before.pt")
        errors = feed(session, video[CHUNK:2 * CHUNK], float(CHUNK))
    assert len(errors) == 1 and errors[0].out_of_memory and not errors[0].kept
    assert "OutOfMemoryError: CUDA out of memory" in str(errors[0]) and "lower budget_tokens" in str(errors[0])
    assert released == [1]
    assert_same(before, snapshot(session, tmp_path / "after.pt"))
    assert feed(session, video[2 * CHUNK:], 2.0 * CHUNK) == []  # ingest continues
    assert session.status().chunks_encoded == 2 and session.status().chunks_failed == 1


@pytest.mark.parametrize("policy", ["fifo", "hermes", "h2svc"])
def test_a_fault_while_compressing_keeps_the_chunk_and_the_next_chunk_compresses(qwen_adapter, frames, policy):
    session = session_for(qwen_adapter, policy)
    prefix = len(qwen_adapter.prefix_ids)
    with FaultPlan.parse("compress:3=oom").armed():
        errors = feed(session, frames(3 * CHUNK), 0.0)
    assert len(errors) == 1 and errors[0].kept and errors[0].out_of_memory
    assert "compressing failed (OutOfMemoryError" in str(errors[0]) and "frames are kept" in str(errors[0])
    # the bookkeeping matches what the cache holds: every unit in the cache is booked, and back
    held = set(session.policy.stats().units)
    assert held == set(session.ledger.units) and max(session.ledger.units) == 5  # units 4, 5: the third chunk's
    assert session.status().chunks_failed == 1
    feed(session, frames(CHUNK, start=3 * CHUNK), 3.0 * CHUNK)
    stats = session.policy.stats()
    assert set(stats.units) == set(session.ledger.units)
    if policy in ("fifo", "hermes"):  # back within the budget (the system prompt on top)
        assert max(stats.layer_tokens) <= prefix + POLICIES[policy]["budget_tokens"]
    assert session.ask("what moved?", max_new_tokens=3).answer_tokens >= 1


def test_a_fault_mid_question_leaves_the_cache_unchanged(qwen_adapter, frames, tmp_path, monkeypatch):
    released = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: released.append(1))
    session = session_for(qwen_adapter, "fifo")
    feed(session, frames(2 * CHUNK), 0.0)
    before = snapshot(session, tmp_path / "before.pt")
    with FaultPlan.parse("question:1=oom,question:2=error").armed():
        with pytest.raises(AnswerError, match="answering failed: OutOfMemoryError: CUDA out of memory.*unchanged"):
            session.ask("what moved?", max_new_tokens=4)
        with pytest.raises(AnswerError, match="answering failed: RuntimeError: injected fault at question 2"):
            session.ask("what moved?", max_new_tokens=4)
    assert released == [1]  # only after the out-of-memory error
    assert_same(before, snapshot(session, tmp_path / "after.pt"))
    fresh = session_for(qwen_adapter, "fifo")
    feed(fresh, frames(2 * CHUNK), 0.0)
    assert session.ask("what moved?", max_new_tokens=4).text == fresh.ask("what moved?", max_new_tokens=4).text


BAD_QUESTIONS = [
    (dict(question=""), "the question is empty"),
    (dict(question=" \n\t "), "the question is empty"),
    (dict(question="why " * 300), r"tokens with its prompt; the limit is 512 \(max_question_tokens\)"),
    (dict(question="what is \ufffd\ufffd?"), r"the question is not valid UTF-8 \(character 8 is U\+FFFD"),
    (dict(question="which?", options=[f"o{i}" for i in range(27)]), r"at most 26 options \(A-Z\), got 27"),
    (dict(question="which?", options=["red", " "]), r"option 1 \(B\) is empty"),
    (dict(question="which?", options=["red", "bl\ufffde"]), r"option 1 \(B\) is not valid UTF-8"),
    (dict(question="what?", camera="/rear"), r"unknown camera '/rear' \(cameras seen: /cam\)"),
    (dict(question="what?", camera="/c\ufffdm"), "the camera name is not valid UTF-8"),
    (dict(question="what?", max_new_tokens=-1), "max_new_tokens must be >= 0, got -1"),
    (dict(question="what?", max_new_tokens=4_000_000_000),
     r"max_new_tokens 4000000000 is too many: .* the 576 positions the memory keeps for a question"),
]


def test_bad_questions_are_refused_and_the_snapshot_is_identical(qwen_adapter, frames, tmp_path):
    session = session_for(qwen_adapter, "hermes")
    feed(session, frames(2 * CHUNK), 0.0)
    session.ask("what moved?", max_new_tokens=2)  # a history to keep unchanged
    before = snapshot(session, tmp_path / "before.pt")
    for i, (request, message) in enumerate(BAD_QUESTIONS):
        with pytest.raises(QuestionError, match=message):
            session.ask(**request)
        assert_same(before, snapshot(session, tmp_path / f"after{i}.pt"), f"after {request}")
    empty = session_for(qwen_adapter, "hermes")
    before = snapshot(empty, tmp_path / "empty.pt")
    with pytest.raises(QuestionError, match="no frames in memory yet"):
        empty.ask("what do you see?")
    assert_same(before, snapshot(empty, tmp_path / "empty_after.pt"))


def test_the_question_history_is_bounded(qwen_adapter, frames):
    session = session_for(qwen_adapter, "fifo", history_size=3)
    feed(session, frames(CHUNK), 0.0)
    for i in range(5):
        session.ask(f"question {i}?", max_new_tokens=1)
    assert [x.question for x in session.history] == ["question 2?", "question 3?", "question 4?"]


def test_fault_plan_parsing():
    plan = FaultPlan.parse(" chunk:2=oom, question:10=error,compress:1=oom ")
    assert plan.faults == {("chunk", 2): "oom", ("question", 10): "error", ("compress", 1): "oom"}
    assert str(plan) == "chunk:2=oom,compress:1=oom,question:10=error"
    for bad in ("chunk:0=oom", "chunk:2", "frame:1=oom", "chunk:1=segfault"):
        with pytest.raises(ValueError, match="is not <encode|chunk|compress|question>"):
            FaultPlan.parse(bad)


def test_failpoints_are_off_unless_armed_and_patch_nothing(qwen_adapter, frames, monkeypatch):
    session = session_for(qwen_adapter, "fifo")
    after_chunk = session.policy.after_chunk
    assert failpoints.layer_hook("prefill", chunk=1, layers=4) is None  # off: the decoder calls nothing
    failpoints.hit("compress", chunk=1)  # off: nothing happens
    monkeypatch.setenv(failpoints.ENV, "encode:2=error")
    plan = failpoints.FaultPlan.from_environment()
    with plan.armed():
        errors = feed(session, frames(3 * CHUNK), 0.0)
    assert [str(e).split(": ", 1)[1] for e in errors] == ["RuntimeError: injected fault at encode 2"]
    assert not errors[0].kept and session.status().chunks_encoded == 2
    assert session.policy.after_chunk == after_chunk  # nothing was patched
    assert failpoints.layer_hook("prefill", chunk=1, layers=4) is None  # disarmed again


def _start(target, *args):
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _until(predicate, what):
    done = threading.Event()
    for _ in range(6000):  # hang guard: 60 s
        if predicate():
            return
        done.wait(0.01)
    raise TimeoutError(f"hang guard: {what}")


def test_a_waiting_chunk_goes_before_waiting_questions():
    lock, order = TurnLock(), []
    holding, release = threading.Event(), threading.Event()

    def first_question():
        with lock.question():
            holding.set()
            release.wait(60)
            order.append("question 1")

    def user(name, priority):
        if priority:
            with lock:
                order.append(name)
        else:
            with lock.question():
                order.append(name)

    threads = [_start(first_question)]
    holding.wait(60)
    threads.append(_start(user, "question 2", False))
    _until(lambda: lock.waiting() == (0, 1), "question 2 waiting")
    threads.append(_start(user, "chunk", True))
    _until(lambda: lock.waiting() == (1, 1), "the chunk waiting")
    release.set()
    for thread in threads:
        thread.join(60)
    assert order == ["question 1", "chunk", "question 2"]
    with lock, lock, lock.question():  # re-entrant in any mix
        pass


def test_ingest_waits_for_one_question_at_most(qwen_adapter, frames):
    """Question 1 is stopped mid-answer; then a chunk falls due and question 2 arrives. The chunk
    goes next: question 2 sees its frames (a question only encodes frames still queued, and the
    chunk had already taken them out of the queue)."""
    session = session_for(qwen_adapter, "full")
    video = frames(2 * CHUNK)
    feed(session, video[:CHUNK], 0.0)
    in_answer, release, answers = threading.Event(), threading.Event(), {}

    def block():  # called before each answer token, the question holding the model
        in_answer.set()
        release.wait(60)
        return False

    def ask(name, should_stop=None):
        answers[name] = session.ask("what moved?", max_new_tokens=2, should_stop=should_stop)

    threads = [_start(ask, "first", block)]
    in_answer.wait(60)
    for i, frame in enumerate(video[CHUNK:-1]):
        session.add_frame(frame, stamp=CHUNK + i, camera="/cam")
    threads.append(_start(session.add_frame, video[-1], float(2 * CHUNK - 1), "/cam"))  # completes a chunk
    _until(lambda: session._cache_lock.waiting() == (1, 0), "the chunk waiting")
    threads.append(_start(ask, "second"))
    _until(lambda: session._cache_lock.waiting() == (1, 1), "question 2 waiting")
    release.set()
    for thread in threads:
        thread.join(60)
    assert answers["first"].frames_in_memory == CHUNK
    assert answers["second"].frames_in_memory == 2 * CHUNK and session.status().chunks_encoded == 2
    assert session.status().most_questions_a_chunk_waited_for == 1


def test_chunks_failing_in_a_row_are_counted_until_one_goes_through(qwen_adapter, frames):
    session = session_for(qwen_adapter, "fifo")
    video = frames(5 * CHUNK)
    with FaultPlan.parse("chunk:2=error,encode:3=oom,compress:4=error").armed():
        errors = feed(session, video[:4 * CHUNK], 0.0)
        status = session.status()
        assert len(errors) == 3 and status.chunks_failed == 3 and status.chunks_failed_in_a_row == 3
        assert status.last_chunk_error == str(errors[-1]) and "compressing failed" in status.last_chunk_error
        assert feed(session, video[4 * CHUNK:], 4.0 * CHUNK) == []
    assert session.status().chunks_failed_in_a_row == 0 and session.status().chunks_failed == 3
