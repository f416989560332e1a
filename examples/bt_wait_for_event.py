#!/usr/bin/env python3
"""A behaviour tree (py_trees) that waits for something to appear: "tell me when a red circle appears".

    python examples/bt_wait_for_event.py --namespace /streamcache --question "Did you see a red circle?"

Instead of asking the same question again and again, the tree adds it to the node's standing
questions (the ``add_watch_question`` service: the questions other clients stand are kept), then
waits without blocking for a WatchEvent on ``watch_events`` whose answer turns yes; once it comes,
it asks the ``when`` service for the first stamp at which the answer was yes since the tree started
(``since``: the newest frame in memory when it added its question, in the cameras' own clock, so a
replayed bag and a live camera alike). At the end it removes its own hold on the question, and only
that: a question another client (or the params file) stands as well stays (docs/interfaces.md
"Standing questions").

Exit codes: 0 it appeared, 1 the node refused the standing question, 3 not within --timeout,
4 no streamcache node found, 130 interrupted (Ctrl-C).
"""
from __future__ import annotations

import argparse
import sys
import time

import py_trees
from py_trees.common import Access, Status

from streamcache_ros.client.client import NodeNotFound, StreamCacheClient

EXIT = {"appeared": 0, "refused": 1, "timed out": 3, "no node": 4, "interrupted": 130}


def say(text: str) -> None:
    print(text, flush=True)


class StandingQuestion(py_trees.behaviour.Behaviour):
    """Adds the question to the node's standing questions (SUCCESS), or FAILURE with the node's
    reason. Notes when the tree started, in the cameras' clock (``started``: the newest frame in
    memory then; zero, an open window, while the memory is empty). ``added``: the tree holds the
    question, to let go at the end."""

    def __init__(self, client: StreamCacheClient, question: str):
        super().__init__("stand the question")
        self.client, self.question = client, question
        self.added = False
        self.bb = self.attach_blackboard_client(self.name)
        for key in ("outcome", "started"):
            self.bb.register_key(key, access=Access.WRITE)

    def update(self) -> Status:
        try:
            self.bb.started = self.client.memory_status().newest_stamp
        except TimeoutError:  # no status (an inactive node): the whole memory is searched
            self.bb.started = None
        reply = self.client.add_watch_question(self.question)
        if not reply.success:
            self.bb.outcome = "refused"
            self.feedback_message = reply.error_message
            say(f"[watch] refused: {reply.error_message}")
            return Status.FAILURE
        self.added = True
        say(f"[watch] standing question: {self.question} (standing now: {list(reply.watch_questions)})")
        return Status.SUCCESS


class WaitForYes(py_trees.behaviour.Behaviour):
    """RUNNING until a WatchEvent of the question answers yes (the events are kept by the client's
    subscription; the leaf only reads what is new each tick); FAILURE after ``timeout`` seconds."""

    def __init__(self, client: StreamCacheClient, question: str, timeout: float):
        super().__init__("wait for yes")
        self.client, self.question, self.timeout = client, question, timeout
        self.bb = self.attach_blackboard_client(self.name)
        for key in ("outcome", "event"):
            self.bb.register_key(key, access=Access.WRITE)

    def setup(self, **kwargs) -> None:
        self.events = self.client.watch_events()  # subscribe before the question stands

    def initialise(self) -> None:
        self.seen, self.started = len(self.events.events), time.monotonic()

    def update(self) -> Status:
        new = self.events.since(self.seen)
        self.seen += len(new)
        for event in new:
            if event.question != self.question:
                continue
            stamp = event.header.stamp.sec + event.header.stamp.nanosec * 1e-9
            say(f"[watch] {stamp:.3f} {event.camera}: {event.answer} (P(yes) {event.yes_probability:.2f}"
                f"{', changed' if event.changed else ''})")
            if event.answer == "yes":
                self.bb.event, self.bb.outcome = event, "appeared"
                return Status.SUCCESS
        if time.monotonic() - self.started > self.timeout:
            self.bb.outcome = "timed out"
            return Status.FAILURE
        return Status.RUNNING


class SinceWhen(py_trees.behaviour.Behaviour):
    """Asks the when service for the first stamp since the tree started at which the answer was yes
    (a robot would act here: turn towards it, tell the operator)."""

    def __init__(self, client: StreamCacheClient, question: str):
        super().__init__("since when")
        self.client, self.question = client, question
        self.bb = self.attach_blackboard_client(self.name)
        for key in ("event", "started"):
            self.bb.register_key(key, access=Access.READ)

    def update(self) -> Status:
        event = self.bb.event
        found = self.client.when(self.question, "first", event.camera, since=self.bb.started)
        if found.success and found.found:
            say(f"[act] in view since {found.stamp.sec + found.stamp.nanosec * 1e-9:.3f} on {found.camera} "
                f"({found.questions_asked} windows asked)")
        else:
            say(f"[act] in view now; when it first came: {found.error_message or 'not found'}")
        return Status.SUCCESS


def build_tree(client: StreamCacheClient, question: str, timeout: float) -> py_trees.behaviour.Behaviour:
    return py_trees.composites.Sequence("tell me when", memory=True, children=[
        StandingQuestion(client, question), WaitForYes(client, question, timeout), SinceWhen(client, question)])


def let_go(client: StreamCacheClient, tree: py_trees.trees.BehaviourTree) -> None:
    """The tree's own hold on its question, and nothing else, removed."""
    for leaf in tree.root.iterate():
        if isinstance(leaf, StandingQuestion) and leaf.added:
            reply = client.remove_watch_question(leaf.question)
            say(f"[watch] let go of: {leaf.question} (standing now: {list(reply.watch_questions)})"
                if reply.success else f"[watch] could not let go of {leaf.question}: {reply.error_message}")


def run(tree: py_trees.trees.BehaviourTree, period: float) -> str:
    while tree.root.status not in (Status.SUCCESS, Status.FAILURE):
        tree.tick()
        time.sleep(period)
    return py_trees.blackboard.Blackboard.get("/outcome")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", default=None, help="the node's namespace (default: find the one node)")
    parser.add_argument("--question", default="Did you see a red circle?", help="a yes/no question")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a yes")
    parser.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the node to appear")
    parser.add_argument("--domain-id", type=int, default=None, help="default: ROS_DOMAIN_ID")
    parser.add_argument("--tick", type=float, default=0.1, help="seconds between ticks")
    args = parser.parse_args(argv)
    client, tree = None, None
    try:
        try:
            client = StreamCacheClient(args.namespace, timeout=args.wait, domain_id=args.domain_id)
        except (NodeNotFound, LookupError) as err:
            print(f"bt_wait_for_event: {err}", file=sys.stderr)
            return EXIT["no node"]
        tree = py_trees.trees.BehaviourTree(build_tree(client, args.question, args.timeout))
        tree.setup()
        outcome = run(tree, args.tick)
        say(f"outcome: {outcome} (exit {EXIT[outcome]})")
        return EXIT[outcome]
    except KeyboardInterrupt:
        say("outcome: interrupted (exit 130)")
        return EXIT["interrupted"]
    finally:
        if client is not None:
            if tree is not None:
                let_go(client, tree)
            client.close()


if __name__ == "__main__":
    sys.exit(main())
