"""Answers that say when, through streamcache_node over DDS (docs/interfaces.md "Time windows and evidence"):
a shape-world bag replayed in lock step, then questions with and without a time window through the
Ask service, the Ask action and streamcache-ask, and the memory_timeline service.

The tiny models have random weights: what is asserted is what the mechanism guarantees whatever the
weights (evidence among the frames in memory and inside the window, refusals, the same answer and
evidence after a restore), plus one pinned case where excluding the frames that show the answer
changes the answer's text. Timeouts only guard against hangs.
"""
import json
import subprocess

import pytest

from node_procs import (HANG_GUARD_S, ROOT, Proc, child_env, client_of, python_module, replay_lock_step, stamp_ns,
                        tiny_node)
from streamcache_ros import world
from streamcache_ros.engine.memory.snapshots import read_state
from streamcache_ros.tools import bagfile

NS = "/sc_when"
CAM = "/when/cam"
START = bagfile.DEFAULT_START_NS
S = 1_000_000_000
FRAMES = 48
SEED = 0  # a stream whose last_seen answers change when their frames are masked (checked in the test)
LOOK = world.Look(160, 120, (40, 50, 60), 0, 0, False, "rgb8")
K = 4


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    return bagfile.make_world_bag(tmp_path_factory.mktemp("world") / "bag", SEED, FRAMES, look=LOOK, topic=CAM)


@pytest.fixture(scope="module")
def last_seen(bag):
    questions = [q for q in bagfile.read_world_questions(bag)["questions"] if q["kind"] == "last_seen"]
    assert questions, "the pinned stream asks no last_seen question"
    return questions


@pytest.fixture(scope="module")
def node(domain):
    command = tiny_node(NS, [CAM], policy="hermes", budget_tokens=120, evidence_k=K)
    with Proc(command, child_env(domain)) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(node, domain, bag):
    with client_of(node, domain, NS) as c:
        replay_lock_step(domain, bag, NS, "--fast")
        yield c


def seconds(t) -> float:
    return stamp_ns(t) / S


def held(client) -> list[int]:
    timeline = client.memory_timeline()
    assert timeline.success, timeline.error_message
    return [stamp_ns(f.stamp) for f in timeline.frames]


def counted(client) -> list[int]:
    """The timeline's frames that frames_in_memory counts: some layer keeps at least half of them
    (docs/interfaces.md "What the numbers mean"; HERMES keeps a token or two of many others)."""
    return [stamp_ns(f.stamp) for f in client.memory_timeline().frames if max(f.layer_kept) >= 0.5]


def check_evidence(reply, memory: list[int], since_ns=None, until_ns=None, k=K):
    assert reply.success, reply.error_message
    stamps = [stamp_ns(t) for t in reply.evidence_stamps]
    assert 1 <= len(stamps) <= k and len(reply.evidence_cameras) == len(reply.evidence_weights) == len(stamps)
    assert set(stamps) <= set(memory), (stamps, memory)
    assert all(c == CAM for c in reply.evidence_cameras)
    if since_ns is not None:
        assert all(s >= since_ns for s in stamps)
    if until_ns is not None:
        assert all(s <= until_ns for s in stamps)
    weights = list(reply.evidence_weights)
    assert weights == sorted(weights, reverse=True) and all(0 < w <= 1 for w in weights)


def test_the_timeline_lists_the_frames_in_memory(client):
    timeline = client.memory_timeline()
    assert timeline.success and timeline.policy == "hermes" and timeline.bank_names == []
    stamps = [stamp_ns(f.stamp) for f in timeline.frames]
    status = client.memory_status()
    assert stamps == sorted(stamps) and len(counted(client)) == status.frames_in_memory < len(stamps)
    assert stamps[-1] == START + (FRAMES - 1) * S and stamps[-1] == stamp_ns(status.newest_stamp)
    assert all(len(f.layer_kept) == timeline.num_layers for f in timeline.frames)
    assert all(0 <= x <= 1 for f in timeline.frames for x in f.layer_kept)
    assert min(sum(f.layer_kept) for f in timeline.frames) < timeline.num_layers  # the budget binds
    other = client.memory_timeline("/no/such/cam")
    assert not other.success and "unknown camera" in other.error_message


def test_a_window_that_excludes_the_frames_showing_the_answer_changes_the_answer(client, last_seen):
    memory = held(client)
    for q in last_seen:
        whole = client.ask(q["text"])
        check_evidence(whole, memory)
        since = q["answer_stamp_ns"] + S  # after the identity was last in view: none of its frames
        after = client.ask(q["text"], since=since / S)
        check_evidence(after, memory, since_ns=since)
        assert after.answer != whole.answer, q["text"]
        assert after.frames_in_memory == sum(s >= since for s in counted(client))
        assert after.evidence_summary_share == 0  # a window hides HERMES's summary tokens


def test_evidence_lies_among_the_frames_in_memory_and_inside_the_window(client, domain, last_seen):
    memory = held(client)
    question = last_seen[0]["text"]
    since, until = memory[len(memory) // 3], memory[2 * len(memory) // 3]
    windowed = client.ask(question, since=since / S, until=until / S, evidence_k=2)
    check_evidence(windowed, memory, since, until, k=2)
    assert stamp_ns(windowed.oldest_stamp) >= since and stamp_ns(windowed.newest_stamp) <= until
    # the action gives the same answer and evidence as the service
    streamed = client.ask_streaming(question, since=since / S, until=until / S, evidence_k=2)
    assert (streamed.answer, list(streamed.evidence_stamps)) == (windowed.answer, list(windowed.evidence_stamps))
    # streamcache-ask: --since/--until/--evidence-k, the evidence in its JSON and after the answer
    cli = subprocess.run(python_module("streamcache_ros.client.ask_cli", "--namespace", NS, "--json", "--since",
                                       f"{since / S:.9f}", "--until", f"{until / S:.9f}", "--evidence-k", "2",
                                       question), cwd=ROOT, env=child_env(domain), capture_output=True, text=True,
                         timeout=HANG_GUARD_S)
    assert cli.returncode == 0, cli.stderr
    reply = json.loads(cli.stdout)
    assert reply["answer"] == windowed.answer and len(reply["evidence_stamps"]) == len(windowed.evidence_stamps)
    assert all(abs(a - seconds(b)) < 1e-6 for a, b in zip(reply["evidence_stamps"], windowed.evidence_stamps))
    shown = subprocess.run(python_module("streamcache_ros.client.ask_cli", "--namespace", NS, "--evidence",
                                         question), cwd=ROOT, env=child_env(domain), capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
    lines = shown.stdout.strip().splitlines()
    assert shown.returncode == 0 and sum(line.startswith("evidence: ") for line in lines) >= 1


def test_a_window_holding_no_frame_in_memory_is_refused_and_the_memory_kept(client, last_seen):
    memory = held(client)
    before = client.memory_status()
    question = last_seen[0]["text"]
    for since, until, words in [((START + 10 * S) / S, (START + 5 * S) / S, "the window is empty"),
                                ((memory[-1] + S) / S, None, "no frames in memory between"),
                                (None, (memory[0] - S) / S, "no frames in memory between")]:
        for reply in (client.ask(question, since=since, until=until),
                      client.ask_streaming(question, since=since, until=until)):
            assert not reply.success and words in reply.error_message, reply.error_message
            assert reply.evidence_stamps == [] and reply.answer == ""
    assert held(client) == memory
    after = client.memory_status()
    assert (after.kv_tokens, after.kv_bytes, after.frames_in_memory) == \
        (before.kv_tokens, before.kv_bytes, before.frames_in_memory)


def h2svc_node(snapshot_path) -> list[str]:
    # the archive beside the snapshot: a restart keeps both, as on a robot (docs/archive.md)
    return tiny_node(NS + "_h2", [CAM], policy="h2svc", reindex="eager", memory_snapshot_path=str(snapshot_path),
                     archive_path=str(snapshot_path.parent / "archive"),
                     evidence_k=K, **{"h2svc.w_s": 1, "h2svc.w_w": 3, "h2svc.n_e": 6})


def test_window_and_evidence_after_a_reindex_and_after_a_restore(domain, bag, last_seen, tmp_path):
    """h2svc (per-head stores of different lengths), re-indexed after every chunk; the memory saved,
    the node restarted from the snapshot: the same answers and evidence."""
    path = tmp_path / "memory.pt"
    question = last_seen[0]["text"]
    with Proc(h2svc_node(path), child_env(domain)) as first:
        with client_of(first, domain, NS + "_h2") as c:
            replay_lock_step(domain, bag, NS + "_h2", "--fast")
            memory = held(c)
            timeline = c.memory_timeline()
            assert list(timeline.bank_names) and all(len(f.bank_kept) == len(timeline.bank_names)
                                                     for f in timeline.frames)
            since = memory[len(memory) // 2]
            before = [c.ask(question), c.ask(question, since=since / S)]
            check_evidence(before[0], memory)
            check_evidence(before[1], memory, since_ns=since)
            assert c.save("").success
        state = read_state(str(path))  # a snapshot file: a checked header, then torch.save's bytes
        assert state["policy_state"]["reindex_events"] > 0  # re-indexed before these answers
    with Proc(h2svc_node(path), child_env(domain)) as second:
        with client_of(second, domain, NS + "_h2") as c:
            assert held(c) == memory
            after = [c.ask(question), c.ask(question, since=since / S)]
    for mine, theirs in zip(before, after):
        assert theirs.success and theirs.answer == mine.answer
        assert list(theirs.evidence_stamps) == list(mine.evidence_stamps)
        assert list(theirs.evidence_weights) == pytest.approx(list(mine.evidence_weights))
