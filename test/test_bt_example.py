"""examples/bt_patrol_ask.py (a py_trees tree) against a real streamcache_node with the tiny model and
a replayed bag: run as a process for each outcome (answered, option branch, waiting for frames,
failed answer, timed out, no node, Ctrl-C), and ticked in this process where that shows more.

The tiny model's answers are random text, but greedy and so repeatable while the memory stays the
same: expected branches come from asking the same question through the Ask service first.
Timeouts only guard against hangs.
"""
import ast
import pathlib
import re
import sys
import time

import py_trees  # in requirements.txt: when missing, the set-up is broken (a failure, not a skip)
import pytest

from node_procs import HANG_GUARD_S, ROOT, Proc, child_env, client_of, load_example, replay_lock_step, tiny_node

from py_trees.common import Status  # noqa: E402
from streamcache_ros_interfaces.action import Ask as AskAction  # noqa: E402

from streamcache_ros.tools import bagfile  # noqa: E402
from streamcache_ros.client.client import StreamCacheClient  # noqa: E402

NS = "/sc_bt"
CAM = "/bt/cam"
EXAMPLE = ROOT / "examples" / "bt_patrol_ask.py"
QUESTION = "What is on the table?"
LONG = 500  # tokens of an answer known to run that long (no end-of-sequence before)


bt = load_example("bt_patrol_ask")


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    return bagfile.make_bag(tmp_path_factory.mktemp("bags") / "bt", frames=40, fps=2.0, topic=CAM)


@pytest.fixture(scope="module")
def node(domain):
    with Proc(tiny_node(NS, [CAM]), child_env(domain)) as proc:
        yield proc


def example(domain, *args, namespace=NS) -> Proc:
    return Proc([sys.executable, str(EXAMPLE), *(["--namespace", namespace] if namespace else []), *args],
                child_env(domain))


def output(proc: Proc) -> str:
    # bytes, not read_text(): a '\r' in a random answer must stay a '\r'
    return pathlib.Path(proc.log.name).read_bytes().decode("utf-8", errors="replace")


def finish(proc: Proc) -> tuple[int, str]:
    try:
        code = proc.wait()
    finally:
        proc.stop()
    return code, output(proc)


def wait_for_line(proc: Proc, text: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard only
    while text not in output(proc):
        assert proc.alive(), output(proc)
        assert time.monotonic() < deadline, f"hang guard: no {text!r}\n{output(proc)}"
        time.sleep(0.05)


def streamed_and_answer(out: str) -> tuple[str, str]:
    """The text streamed after '[ask] <question>' and the answer of the '[ask] answer:' line."""
    m = re.search(r"^\[ask\] [^\n]*\n(.*)\n\[ask\] answer: ('.*'|\".*\") \(option_index (-?\d+)\)$", out, re.S | re.M)
    assert m, out
    return m.group(1), ast.literal_eval(m.group(2))


@pytest.fixture(scope="module")
def frames(client, domain, bag):
    """A memory with the bag in it (what the tests after the waiting ones start from)."""
    assert client.reset().success
    replay_lock_step(domain, bag, NS, "--fast")
    return client.memory_status().frames_in_memory


@pytest.fixture(scope="module")
def long_question(client, frames):
    """A question whose answer runs LONG tokens without ending (greedy: the same every time)."""
    for question in [QUESTION, "Describe everything you saw in detail.", "Tell a long story about the shapes.",
                     "List every colour you saw, one by one."]:
        if client.ask(question, max_new_tokens=LONG).answer_tokens == LONG:
            return question
    pytest.fail(f"no question found whose answer runs {LONG} tokens")


# -- the example as a process ---------------------------------------------------------------------
def test_ctrl_c_while_waiting_for_frames(client, domain):
    assert client.reset().success
    proc = example(domain)
    wait_for_line(proc, "[wait] no frames in memory yet: waiting")
    code = proc.stop()
    out = output(proc)
    assert code == 130 and "outcome: interrupted (exit 130)" in out and "Traceback" not in out, out


def test_waits_for_frames_then_answers(client, domain, bag):
    assert client.reset().success
    proc = example(domain, "--question", QUESTION)
    wait_for_line(proc, "[wait] no frames in memory yet: waiting")
    assert proc.alive()  # still RUNNING in the wait leaf: it has not asked (the memory is empty)
    assert "[ask]" not in output(proc)
    replay_lock_step(domain, bag, NS, "--fast")
    code, out = finish(proc)
    assert code == 0, out
    lines = [out.index(s) for s in ("[wait] no frames in memory yet", "[wait] memory holds", f"[ask] {QUESTION}",
                                    "[ask] answer:", "[branch] ", "outcome: answered (exit 0)")]
    assert lines == sorted(lines), out
    held = int(re.search(r"\[wait\] memory holds (\d+) frames", out).group(1))
    assert held > 0
    streamed, answer = streamed_and_answer(out)
    assert answer and streamed.strip() == answer  # the whole answer was printed as it streamed


def test_answers_and_branches_on_the_text(client, domain, frames):
    answer = client.ask(QUESTION).answer  # what the example will get: the memory is unchanged
    keyword = next(iter(re.findall(r"[A-Za-z]+", answer)), "yes")
    expected = f"answer mentions {keyword!r}" if keyword.lower() in answer.lower() else "any other answer"
    code, out = finish(example(domain, "--question", QUESTION, "--keyword", keyword))
    assert code == 0, out
    streamed, got = streamed_and_answer(out)
    assert got == answer and streamed.strip() == answer
    assert f"[wait] memory holds {frames} frames" in out
    assert f"[branch] {expected}\n" in out and out.count("[branch]") == 1, out
    assert out.count("{-} patrol ask") == 2  # the tree, before and after
    assert "[fallback]" not in out and out.rstrip().endswith("outcome: answered (exit 0)")


WORLD_NS = "/sc_bt_world"
WORLD_CAM = "/bt/world_cam"  # a camera of its own: the world bag must not reach the other node


@pytest.fixture(scope="module")
def world_client(domain, tmp_path_factory):
    """A node with the bundled world model (docs/world-models.md) and a world stream in its memory:
    its answers name the options of the world's questions."""
    bag = bagfile.make_world_bag(tmp_path_factory.mktemp("bags") / "world", seed=800_000_321, frames=16,
                                 topic=WORLD_CAM)
    node = tiny_node(WORLD_NS, [WORLD_CAM], model_path="world-qwen2_5_vl", policy="hermes", budget_tokens=0)
    with Proc(node, child_env(domain)) as proc, client_of(proc, domain, WORLD_NS) as client:
        replay_lock_step(domain, bag, WORLD_NS, "--fast")
        yield client, bagfile.read_world_questions(bag)


def test_the_branch_follows_option_index(world_client, domain):
    """The tree branches on the option the node's answer names, whichever it is."""
    client, world = world_client
    question = next(q for q in world["questions"] if q["kind"] == "now_color")
    options = question["options"]
    index = client.ask(question["text"], options=options).option_index
    assert index >= 0  # the world model answers a colour question with one of its options
    code, out = finish(example(domain, "--question", question["text"], "--options", *options, namespace=WORLD_NS))
    assert code == 0, out
    assert f"(option_index {index})" in out and f"[branch] option {index}: {options[index]}\n" in out
    assert out.count("[branch]") == 1


def test_a_failed_answer_takes_the_fallback(domain, frames):
    code, out = finish(example(domain, "--camera", "/other/cam"))
    assert code == 1, out
    assert "[fallback] the answer failed: unknown camera '/other/cam'" in out
    assert "[branch]" not in out and "outcome: failed (exit 1)" in out


def test_a_timed_out_answer_is_cancelled(client, domain, long_question):
    # The answer runs LONG tokens (checked above); timeout 0 cancels it at the first tick. The node
    # reporting "cancelled" with fewer tokens shows it was still answering when the cancel came.
    code, out = finish(example(domain, "--question", long_question, "--max-new-tokens", str(LONG), "--timeout", "0"))
    assert code == 3, out
    assert "[fallback] no answer in time: goal cancelled" in out and "[branch]" not in out
    m = re.search(r"\[timeout\] the node ended the goal: 'cancelled' after (\d+) tokens", out)
    assert m and int(m.group(1)) < LONG, out
    assert out.rstrip().endswith("outcome: timed out (exit 3)")
    assert client.ask(QUESTION).success  # the node carries on


def test_no_node_found(domain):
    other = domain + 1 if domain < 230 else domain - 1  # a domain no streamcache node is in
    code, out = finish(example(domain, "--domain-id", str(other), "--wait", "2", namespace=None))
    assert code == 4 and f"no streamcache node found within 2 s (ROS domain {other})" in out, out


def test_the_clients_memory_status_watch(client, frames):
    watch = client.watch_memory_status()
    assert watch is client.watch_memory_status()  # one subscription for the client's lifetime
    called = time.time_ns()
    status = client.memory_status()  # the next one published after the call
    assert status.frames_in_memory == frames and watch.published_ns >= called
    assert watch.wait_for(lambda m: m.frames_in_memory == frames, HANG_GUARD_S).frames_in_memory == frames


def test_a_goal_waits_for_its_action_server_and_fails_when_cancelled_first(domain, node):
    from rclpy.action import ActionClient

    with StreamCacheClient(NS, timeout=HANG_GUARD_S, domain_id=domain) as c:
        c._action = ActionClient(c.node, AskAction, "/sc_bt_nobody/ask_action")  # a server that never comes
        goal = c.ask_async(QUESTION)
        assert goal.state == goal.PENDING and not goal.done() and goal.result() is None
        goal.cancel()
        assert goal.wait(HANG_GUARD_S)
        assert goal.state == goal.FAILED and goal.result() is None
        assert goal.error == "cancelled before the action server was found"


# -- the tree ticked in this process ---------------------------------------------------------------
def tick_to_end(tree, on_tick=None):
    deadline = time.monotonic() + HANG_GUARD_S
    while tree.root.status not in (Status.SUCCESS, Status.FAILURE):
        assert time.monotonic() < deadline, "hang guard"
        tree.tick()
        if on_tick is not None:
            on_tick()
        time.sleep(0.01)


def leaf(root, name):
    return next(b for b in root.iterate() if b.name == name)


def test_the_ask_leaf_is_running_while_the_answer_streams(client, long_question):
    root = bt.build_tree(client, long_question, max_new_tokens=LONG)
    tree = py_trees.trees.BehaviourTree(root)
    tree.setup()
    ask, wait = leaf(root, "ask"), leaf(root, "wait for frames")
    seen = []

    def record():
        goal = ask.goal
        seen.append((wait.status, ask.status, len(goal.partial_answer) if goal else 0,
                     goal is not None and not goal.done() and goal.result() is None))
    tick_to_end(tree, record)
    assert py_trees.blackboard.Blackboard.get("/outcome") == "answered"
    first_ask = next(i for i, s in enumerate(seen) if s[1] != Status.INVALID)
    assert all(s[0] == Status.SUCCESS for s in seen[first_ask:])  # asked only once the frames were there
    # text streamed while the leaf was RUNNING and the goal had no result yet
    assert any(status == Status.RUNNING and n > 0 and no_result for _, status, n, no_result in seen)
    lengths = [n for _, _, n, _ in seen]
    assert lengths == sorted(lengths) and seen[-1][1] == Status.SUCCESS
    assert ask.goal.result().answer_tokens == LONG and ask.goal.partial_answer.strip() == ask.goal.result().answer


def test_a_timeout_in_the_middle_of_the_stream_cancels_the_goal(client, long_question):
    root = bt.build_tree(client, long_question, max_new_tokens=LONG)
    tree = py_trees.trees.BehaviourTree(root)
    tree.setup()
    ask = leaf(root, "ask")

    def time_out_once_text_came():
        if ask.goal is not None and ask.goal.partial_answer:
            ask.timeout = 0.0  # the next tick finds the answer late
    tick_to_end(tree, time_out_once_text_came)
    assert py_trees.blackboard.Blackboard.get("/outcome") == "timed out"
    assert leaf(root, "fall back").status == Status.SUCCESS and ask.status == Status.FAILURE
    assert ask.goal.wait(HANG_GUARD_S)
    result = ask.goal.result()
    assert not result.success and result.error_message == "cancelled"
    assert 1 <= result.answer_tokens < LONG  # stopped part-way


@pytest.mark.parametrize("options, answer, option_index, branch", [
    (["left", "right"], "right", 1, "option 1: right"),
    (["left", "right"], "left", 0, "option 0: left"),
    (["left", "right"], "up", -1, "none of the options"),
    ([], "Yes, the door is open.", -1, "answer mentions 'yes'"),
    ([], "It is closed.", -1, "any other answer"),
])
def test_the_branches(options, answer, option_index, branch):
    root = bt.build_tree(None, QUESTION, options)  # the decision subtree needs no node
    act = leaf(root, "act on the answer")
    py_trees.blackboard.Blackboard.set("/answer", AskAction.Result(success=True, answer=answer,
                                                                   option_index=option_index))
    act.tick_once()
    assert act.status == Status.SUCCESS
    taken = [b.name for b in act.children if b.status == Status.SUCCESS]
    assert taken == [branch]
