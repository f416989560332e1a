"""Standing questions that several clients hold, through streamcache_node over DDS (docs/interfaces.md
"Standing questions"): add_watch_question and remove_watch_question edit the list on the node in one
step, so clients adding at once keep each other's questions; a client removes only its own hold; the
parameter watch_questions shows the list the node asks; a question that cannot stand is refused with
the reason, the list unchanged; examples/bt_wait_for_event.py lets go of its own question only, and
asks `first` over the stretch since it started.

The tiny model has random weights: nothing here depends on its answers. Timeouts only guard
against hangs.
"""
import importlib.util
import sys
import threading

import py_trees
import pytest

from node_procs import HANG_GUARD_S, ROOT, RELIABLE, Proc, child_env, client_of, replay_lock_step, stamp_ns, tiny_node
from streamcache_ros import world
from streamcache_ros.tools import bagfile

NS = "/sc_standing"
NODE = f"{NS}/streamcache_node"
CAM = "/standing/cam"
START = bagfile.DEFAULT_START_NS
S = 1_000_000_000
LOOK = world.Look(160, 120, (40, 50, 60), 0, 0, False, "rgb8")
RED, BLUE, GREEN = "Did you see a red circle?", "Is there a blue square?", "Did you see a green triangle?"
MAX_QUESTION_TOKENS = 96  # small, so that a question of a few dozen words is too long in tokens


@pytest.fixture(scope="module")
def node(domain):
    command = tiny_node(NS, [CAM], policy="full", max_question_tokens=MAX_QUESTION_TOKENS,
                        watch_questions=f"['{RED}']")  # the params file's standing question
    with Proc(command, child_env(domain)) as proc:
        yield proc


@pytest.fixture
def standing(probe):
    """The parameter back to the params file's list after each test."""
    yield
    assert probe.set_parameter(NODE, "watch_questions", [RED]).successful


def listed(probe) -> list[str]:
    return list(probe.get_parameter(NODE, "watch_questions"))


def test_two_clients_adding_at_once_keep_each_others_questions(node, client, probe, domain, standing):
    mine = {who: [f"Is there a {colour} shape number {i} seen by {who}?" for i in range(6)]
            for who, colour in (("a", "red"), ("b", "blue"))}
    with client_of(node, domain, NS) as a, client_of(node, domain, NS) as b:
        clients, replies, start = {"a": a, "b": b}, {"a": [], "b": []}, threading.Barrier(2)

        def add_all(who: str) -> None:
            start.wait()
            replies[who] = [clients[who].add_watch_question(q) for q in mine[who]]

        threads = [threading.Thread(target=add_all, args=(who,)) for who in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_GUARD_S)
        assert all(r.success and r.holders == 1 for rs in replies.values() for r in rs), replies
        now = listed(probe)
        assert sorted(now) == sorted([RED, *mine["a"], *mine["b"]])  # every question, each once
        assert now[0] == RED and [q for q in now if q in mine["a"]] == mine["a"]  # in the order added
        last = max((r for rs in replies.values() for r in rs), key=lambda r: len(r.watch_questions))
        assert list(last.watch_questions) == now  # the last edit's reply shows the list the parameter holds

        for q in mine["a"]:  # a lets go of its own: b's and the params file's stay
            reply = a.remove_watch_question(q)
            assert reply.success and reply.holders == 0 and q not in reply.watch_questions
        assert listed(probe) == [RED, *[q for q in now if q in mine["b"]]]


def test_a_question_two_hold_stands_until_both_let_go(client, probe, standing):
    reply = client.add_watch_question(RED)  # already standing from the params file: one more holder
    assert reply.success and reply.holders == 2 and list(reply.watch_questions) == [RED]
    reply = client.remove_watch_question(RED)
    assert reply.success and reply.holders == 1 and listed(probe) == [RED]  # the params file's hold stays
    reply = client.remove_watch_question(f"  {RED} ")  # the last hold: spaces around do not matter
    assert reply.success and reply.holders == 0 and listed(probe) == []
    refused = client.remove_watch_question(RED)
    assert not refused.success and "is not a standing question" in refused.error_message


def test_setting_the_parameter_keeps_the_holds_on_what_it_keeps(client, probe, standing):
    """`ros2 param set` names the whole list: a question it keeps keeps its holders, one it drops
    goes whoever held it, and a new one has one holder."""
    assert client.add_watch_question(RED).holders == 2
    assert client.add_watch_question(GREEN).holders == 1
    assert probe.set_parameter(NODE, "watch_questions", [RED, BLUE]).successful
    assert client.add_watch_question(BLUE).holders == 2
    assert client.remove_watch_question(RED).holders == 1 and listed(probe) == [RED, BLUE]
    refused = client.remove_watch_question(GREEN)
    assert not refused.success and "is not a standing question" in refused.error_message
    assert client.add_watch_question(GREEN).holders == 1


@pytest.mark.parametrize("question, reason", [
    ("", "the question is empty"),
    ("   ", "the question is empty"),
    ("What colour is the square?", "is not a yes/no question"),
    ("Did you see " + "a very " * 60 + "red circle?", f"the limit is {MAX_QUESTION_TOKENS} (max_question_tokens)"),
    ("Did you see " + "x" * 2000 + "?", f"max_question_tokens {MAX_QUESTION_TOKENS}"),
])
def test_a_question_that_cannot_stand_is_refused_the_list_unchanged(client, probe, question, reason):
    reply = client.add_watch_question(question)
    assert not reply.success and reason in reply.error_message, reply.error_message
    assert reply.error_message.startswith("not a standing question")
    assert list(reply.watch_questions) == listed(probe) == [RED]


def test_the_standing_questions_are_bounded(client, probe, standing):
    """At most MAX_WATCH_QUESTIONS stand; one more is refused saying so, the list
    unchanged; `ros2 param set` checks each question as add_watch_question does."""
    from streamcache_ros.node.params import MAX_WATCH_QUESTIONS  # noqa: PLC0415

    for i in range(MAX_WATCH_QUESTIONS - 1):
        assert client.add_watch_question(f"Is there a red shape number {i}?").success
    full = listed(probe)
    assert len(full) == MAX_WATCH_QUESTIONS
    reply = client.add_watch_question("Is there one too many?")
    assert not reply.success and f"at most {MAX_WATCH_QUESTIONS} stand at once" in reply.error_message, reply
    assert list(reply.watch_questions) == listed(probe) == full
    refused = probe.set_parameter(NODE, "watch_questions", full + ["Is there one too many?"])
    assert not refused.successful and f"has {MAX_WATCH_QUESTIONS + 1} questions" in refused.reason
    refused = probe.set_parameter(NODE, "watch_questions", [RED, "What colour is the square?"])
    assert not refused.successful and "is not a yes/no question" in refused.reason, refused.reason
    refused = probe.set_parameter(NODE, "watch_questions", [RED, "Did you see " + "a very " * 60 + "red circle?"])
    assert not refused.successful and f"the limit is {MAX_QUESTION_TOKENS}" in refused.reason, refused.reason
    assert listed(probe) == full


def test_the_node_asks_what_the_parameter_shows(client, probe, domain, tmp_path, standing):
    """One WatchEvent per chunk for each question listed, and for nothing else: added ones from the
    next chunk on, a removed one no more."""
    from streamcache_ros_interfaces.msg import WatchEvent  # noqa: PLC0415

    events = probe.collect(WatchEvent, f"{NS}/watch_events", RELIABLE, matched=True)
    assert client.add_watch_question(BLUE).success and client.add_watch_question(GREEN).success
    bag = bagfile.make_world_bag(tmp_path / "bag", 3, 8, look=LOOK, topic=CAM, start_ns=START)
    replay_lock_step(domain, bag, NS, "--fast")  # two chunks of 4
    probe.wait_for(lambda: len(events) >= 6, what="6 watch events")
    assert [e.question for e in events] == listed(probe) * 2 == [RED, BLUE, GREEN] * 2
    assert client.remove_watch_question(BLUE).success
    seen = len(events)
    later = bagfile.make_world_bag(tmp_path / "later", 4, 4, look=LOOK, topic=CAM, start_ns=START + 100 * S)
    replay_lock_step(domain, later, NS, "--fast")  # one chunk
    probe.wait_for(lambda: len(events) >= seen + 2, what="2 more watch events")
    assert [e.question for e in events[seen:]] == listed(probe) == [RED, GREEN]


def bt_example(domain: int, question: str) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / "bt_wait_for_event.py"), "--namespace", NS,
            "--question", question, "--timeout", "1", "--domain-id", str(domain)]


def test_the_behaviour_tree_lets_go_of_its_own_question_only(client, probe, domain, standing):
    """The example with nothing to see times out (exit 3): its question stood while it ran, and
    afterwards the list is as it found it; a question the params file stands too stays."""
    assert client.add_watch_question(BLUE).success  # another client's
    with Proc(bt_example(domain, GREEN), child_env(domain)) as tree:
        tree.wait_for_output("[watch] standing question")
        assert listed(probe) == [RED, BLUE, GREEN]
        assert tree.wait() == 3, tree.output()
    assert listed(probe) == [RED, BLUE]
    with Proc(bt_example(domain, RED), child_env(domain)) as tree:
        assert tree.wait() == 3, tree.output()
        assert "[watch] let go of: " + RED in tree.output()
    assert listed(probe) == [RED, BLUE]


def test_the_behaviour_tree_asks_first_since_it_started(node, domain, tmp_path):
    """The tree's `when` step searches from the newest frame in memory when the tree added its
    question (the cameras' clock), not the whole memory: the node's answer says where it searched
    from (searched_since)."""
    spec = importlib.util.spec_from_file_location("bt_wait_for_event", ROOT / "examples" / "bt_wait_for_event.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    bag = bagfile.make_world_bag(tmp_path / "before", 5, 8, look=LOOK, topic=CAM, start_ns=START + 200 * S)
    replay_lock_step(domain, bag, NS, "--fast")  # in memory before the tree starts
    with client_of(node, domain, NS) as memory:
        replies = []
        when = memory.when
        memory.when = lambda *args, **kwargs: replies.append(when(*args, **kwargs)) or replies[-1]
        stand, _, since_when = example.build_tree(memory, GREEN, 60.0).children
        py_trees.blackboard.Blackboard.set("/event", type("Event", (), {"camera": CAM})())
        stand.tick_once()
        started = py_trees.blackboard.Blackboard.get("/started")
        assert stand.status == py_trees.common.Status.SUCCESS and stamp_ns(started) == START + 207 * S
        later = bagfile.make_world_bag(tmp_path / "after", 6, 8, look=LOOK, topic=CAM, start_ns=START + 300 * S)
        replay_lock_step(domain, later, NS, "--fast")
        since_when.tick_once()
        assert since_when.status == py_trees.common.Status.SUCCESS
        # the whole memory reaches back to the first bag (START); since the tree started, to its last unit
        assert replies[0].success and stamp_ns(replies[0].searched_since) > START + 200 * S, replies[0]
        assert memory.remove_watch_question(GREEN).success
