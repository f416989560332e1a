"""When and standing questions through streamcache_node over DDS (docs/interfaces.md "When",
"Standing questions"): shape-world bags replayed in lock step; the when service, its refusals and
the CLI; watch_questions answered on every chunk, published as WatchEvents with `changed` right,
and changed at runtime.

The tiny model has random weights: what is asserted is what the mechanism guarantees whatever the
weights (stamps among the frames in memory, the timeline over every frame, one event per standing
question per chunk, refusals with the memory unchanged). Timeouts only guard against hangs.
"""
import json
import subprocess
import sys

import pytest

from node_procs import (HANG_GUARD_S, ROOT, RELIABLE, Proc, child_env, python_module, replay_lock_step, stamp_ns,
                        tiny_node)
from streamcache_ros import world
from streamcache_ros.tools import bagfile

NS = "/sc_watch"
NODE = f"{NS}/streamcache_node"
CAM = "/watch/cam"
START = bagfile.DEFAULT_START_NS
S = 1_000_000_000
LOOK = world.Look(160, 120, (40, 50, 60), 0, 0, False, "rgb8")
RED, BLUE = "Did you see a red circle?", "Did you see a blue square?"
GREEN = "Did you see a green triangle?"  # not a standing question: searched


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    """Two bags on one camera, the second 100 s after the first (16 frames each: 4 chunks of 4)."""
    folder = tmp_path_factory.mktemp("watch")
    return [bagfile.make_world_bag(folder / f"bag{i}", 3 + i, 16, look=LOOK, topic=CAM, start_ns=START + i * 100 * S)
            for i in range(2)]


@pytest.fixture(scope="module")
def node(domain):
    command = tiny_node(NS, [CAM], policy="full", **{"watch_questions": f"['{RED}', '{BLUE}']"})
    with Proc(command, child_env(domain)) as proc:
        yield proc


@pytest.fixture(scope="module")
def events(probe, client):
    """Every WatchEvent from the moment the node's publisher is matched (the node is up: client)."""
    from streamcache_ros_interfaces.msg import WatchEvent  # noqa: PLC0415

    return probe.collect(WatchEvent, f"{NS}/watch_events", RELIABLE, matched=True)


def test_when_refuses_an_empty_memory(client, events):
    reply = client.when(RED, "last")
    assert not reply.success and "no frames in memory yet" in reply.error_message


def test_standing_questions_answer_every_chunk(client, probe, events, bags, domain):
    replay_lock_step(domain, bags[0], NS, "--fast")
    probe.wait_for(lambda: len(events) >= 8, what="8 watch events")
    assert [e.question for e in events] == [RED, BLUE] * 4
    # the window of each chunk: its last frame's stamp, chunks of 4 frames at 1 fps
    assert [stamp_ns(e.header.stamp) for e in events[::2]] == [START + (4 * k + 3) * S for k in range(4)]
    for question in (RED, BLUE):
        mine = [e for e in events if e.question == question]
        assert all(e.camera == CAM and e.answer == ("yes" if e.yes_probability >= 0.5 else "no") for e in mine)
        assert not mine[0].changed  # nothing before the first window
        assert [e.changed for e in mine[1:]] == [a.answer != b.answer for a, b in zip(mine, mine[1:])]


def test_when_searches_the_memory(client):
    memory = [stamp_ns(f.stamp) for f in client.memory_timeline().frames]
    held = client.memory_status().frames_in_memory
    for mode in ("last", "first", "LAST", "First"):  # modes in any case
        reply = client.when(GREEN, mode)
        assert reply.success, reply.error_message
        # the tiny model has no index: searched in place or over replays, never by an index
        assert reply.found_by in ("memory", "walk") and reply.frames_in_window == 16
        assert reply.questions_asked > 0 and reply.frames_searched == len(memory) == held == 16
        # a standing question answers its own when from the answers noted for every chunk: no search
        standing = client.when(RED, mode)
        assert standing.success and standing.found_by == "standing" and standing.questions_asked == 0
        assert standing.frames_searched == 16 and standing.recalled_chunks == 0
        # the full cache holds every frame seen: the search reaches the first, nothing was evicted
        assert stamp_ns(reply.searched_since) == memory[0] and not reply.evicted_before and not reply.may_be_older
    answer = client.ask("What is there?")
    assert answer.success and stamp_ns(answer.searched_since) == memory[0] and not answer.evicted_before
    timeline = client.when(BLUE, "timeline")
    assert [stamp_ns(t) for t in timeline.timeline_stamps] == memory
    assert all(0.0 <= p <= 1.0 for p in timeline.timeline_yes_probability)
    windowed = client.when(BLUE, "timeline", since=(START + 4 * S) / S, until=(START + 7 * S) / S)
    assert [stamp_ns(t) for t in windowed.timeline_stamps] == [START + k * S for k in range(4, 8)]


@pytest.mark.parametrize("request_fields, reason", [
    ({"mode": "sometimes"}, "unknown mode 'sometimes'"),
    ({"camera": "/other/cam"}, "unknown camera '/other/cam'"),
    ({"since": (START + 500 * S) / S}, "no frames"),
    ({"question": "   "}, "the question is empty"),
    ({"question": "What color is the square now?"}, "is not a yes/no question: `when` takes a yes/no question"),
    ({"question": "When did you last see a red circle?"}, "is not a yes/no question"),
])
def test_when_refusals_say_why_and_leave_the_memory(client, request_fields, reason):
    before = client.memory_status()
    fields = {"question": RED, "mode": "last", **request_fields}
    reply = client.when(fields.pop("question"), fields.pop("mode"), **fields)
    assert not reply.success and reason in reply.error_message
    after = client.memory_status()
    assert (after.frames_in_memory, after.kv_tokens) == (before.frames_in_memory, before.kv_tokens)


def test_the_cli_json_says_recalled_chunks(capsys):
    """`--json` carries recalled_chunks for an ask (service and action) and a `--when`."""
    from streamcache_ros.client import ask_cli  # noqa: PLC0415
    from streamcache_ros_interfaces.action import Ask as AskAction  # noqa: PLC0415
    from streamcache_ros_interfaces.srv import Ask, When  # noqa: PLC0415

    class Memory:  # StreamCacheClient's replies, as the node fills them
        def ask(self, *args, **kwargs):
            return Ask.Response(success=True, answer="1", recalled_chunks=3)

        def ask_streaming(self, *args, **kwargs):
            return AskAction.Result(success=True, answer="1", recalled_chunks=4)

        def when(self, *args, **kwargs):
            return When.Response(success=True, found=True, recalled_chunks=5)

    for argv, chunks in ((["--json", "How many objects?"], 3), (["--json", "--stream", "How many objects?"], 4),
                         (["--json", "--when", "first", RED], 5)):
        assert ask_cli.run(ask_cli.parse_args(argv), Memory()) == 0
        assert json.loads(capsys.readouterr().out)["recalled_chunks"] == chunks


def test_the_cli_asks_when(domain, client):
    def cli(*args):
        return subprocess.run(python_module("streamcache_ros.client.ask_cli", "--namespace", NS, *args),
                              env=child_env(domain), cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)

    done = cli("--when", "timeline", "--json", BLUE)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["success"] and len(data["timeline"]) == 16 and data["frames_searched"] == 16
    assert data["searched_since"] == START / S and data["evicted_before"] is False
    assert data["recalled_chunks"] == client.when(BLUE, "timeline").recalled_chunks
    last = cli("--when", "last", RED)
    assert last.returncode == 0, last.stderr
    assert "questions" in last.stdout or "not found" in last.stdout
    refused = cli("--when", "last", "--camera", "/nope", RED)
    assert refused.returncode == 1 and "unknown camera" in refused.stderr


def test_watch_questions_change_at_runtime(client, probe, events, bags, domain):
    assert not probe.set_parameter(NODE, "watch_questions", [RED, " "]).successful  # an empty question
    assert probe.set_parameter(NODE, "watch_questions", [BLUE]).successful
    seen = len(events)
    replay_lock_step(domain, bags[1], NS, "--fast")
    probe.wait_for(lambda: len(events) >= seen + 4, what="4 more watch events")
    new = events[seen:]
    assert [e.question for e in new] == [BLUE] * 4  # from the next chunk on, only the question set
    assert [stamp_ns(e.header.stamp) for e in new] == [START + 100 * S + (4 * k + 3) * S for k in range(4)]
    assert probe.set_parameter(NODE, "watch_questions", []).successful
    status = client.memory_status()
    assert status.process_rss_bytes > 0  # the node's own memory is reported beside the cache's


def test_the_behaviour_tree_waits_for_an_event(domain, probe, events, tmp_path):
    """examples/bt_wait_for_event.py: makes its question a standing one, waits for a yes, then asks
    when it first held; ends with the question taken out again. Whether the tiny model ever says yes
    is up to its weights: the expected outcome is read from the events the probe saw."""
    bag = bagfile.make_world_bag(tmp_path / "bag", 5, 16, look=LOOK, topic=CAM, start_ns=START + 300 * S)
    command = [sys.executable, str(ROOT / "examples" / "bt_wait_for_event.py"), "--namespace", NS,
               "--question", RED, "--timeout", "40", "--domain-id", str(domain)]
    seen = len(events)
    with Proc(command, child_env(domain)) as tree:
        tree.wait_for_output("[watch] standing question")
        assert probe.get_parameter(NODE, "watch_questions") == [RED]
        replay_lock_step(domain, bag, NS, "--fast")
        code = tree.wait()
        output = tree.output()
    mine = [e for e in events[seen:] if e.question == RED]
    assert mine and all(e.question == RED for e in events[seen:])
    if any(e.answer == "yes" for e in mine):
        assert code == 0 and "outcome: appeared" in output and "[act]" in output, output
    else:
        assert code == 3 and "outcome: timed out" in output, output
    assert probe.get_parameter(NODE, "watch_questions") == []


def test_a_question_mid_chunk_still_gives_every_chunk_its_event(client, probe, events, domain, tmp_path):
    """A question that arrives with half a chunk waiting encodes it (a partial chunk); the standing
    question still answers that chunk, and every chunk after it: one event per chunk, each at its
    own last frame."""
    assert probe.set_parameter(NODE, "watch_questions", [RED]).successful
    assert client.reset().success
    start = START + 500 * S
    first, second = bagfile.make_world_segments(tmp_path / "segments", 7, 12, 6, look=LOOK, topic=CAM, start_ns=start)
    seen = len(events)
    replay_lock_step(domain, first, NS, "--fast")  # 6 frames: a chunk of 4, then 2 waiting
    assert client.ask("What is there?").success  # encodes them: a partial chunk
    replay_lock_step(domain, second, NS, "--fast")  # 6 more: a chunk of 4, then 2 waiting
    reply = client.when(RED, "last")  # encodes them: another partial chunk
    assert reply.success, reply.error_message
    probe.wait_for(lambda: len(events) >= seen + 4, what="4 watch events")
    new = events[seen:]
    assert [e.question for e in new] == [RED] * 4
    assert [stamp_ns(e.header.stamp) for e in new] == [start + k * S for k in (3, 5, 9, 11)]
