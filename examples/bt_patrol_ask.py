#!/usr/bin/env python3
"""A behaviour tree (py_trees) that asks streamcache_node a question about what the cameras saw.

    python examples/bt_patrol_ask.py --namespace /streamcache --question "Is the door open?" --options yes no

The tree waits until the memory holds frames, asks through the Ask action without blocking (the
leaf is RUNNING while the answer streams, and the text is printed as it comes), then takes the
branch of the chosen option (or, without options, of whether the answer mentions --keyword). A
failed answer (success false) or one that takes longer than --timeout (the goal is then cancelled)
goes to the fallback branch instead.

Exit codes: 0 answered, 1 the answer failed, 2 bad arguments, 3 timed out (goal cancelled),
4 no streamcache node found, 130 interrupted (Ctrl-C; a running goal is cancelled).
"""
from __future__ import annotations

import argparse
import sys
import time

import py_trees
from py_trees.common import Access, Status

from streamcache_ros.client.client import NodeNotFound, StreamCacheClient

EXIT = {"answered": 0, "failed": 1, "timed out": 3, "no node": 4, "interrupted": 130}


def say(text: str) -> None:
    print(text, flush=True)


class WaitForFrames(py_trees.behaviour.Behaviour):
    """RUNNING until a MemoryStatus says the memory holds frames."""

    def __init__(self, client: StreamCacheClient):
        super().__init__("wait for frames")
        self.client, self.said = client, False

    def setup(self, **kwargs) -> None:
        self.watch = self.client.watch_memory_status()  # subscribe now: the first status is on its way

    def update(self) -> Status:
        status = self.watch.latest
        if status is None or status.frames_in_memory == 0:
            if not self.said:
                say("[wait] no frames in memory yet: waiting")
                self.said = True
            return Status.RUNNING
        say(f"[wait] memory holds {status.frames_in_memory} frames")
        return Status.SUCCESS


class Ask(py_trees.behaviour.Behaviour):
    """The Ask action: RUNNING while the answer streams; SUCCESS with a successful answer; FAILURE
    when it failed, or took longer than ``timeout`` seconds (the goal is cancelled)."""

    def __init__(self, client: StreamCacheClient, question: str, options: list[str], camera: str,
                 max_new_tokens: int, timeout: float):
        super().__init__("ask")
        self.client, self.question, self.options = client, question, options
        self.camera, self.max_new_tokens, self.timeout = camera, max_new_tokens, timeout
        self.goal = None
        self.bb = self.attach_blackboard_client(self.name)
        for key in ("answer", "outcome", "goal"):
            self.bb.register_key(key, access=Access.WRITE)

    def initialise(self) -> None:
        say(f"[ask] {self.question}")
        self.goal = self.client.ask_async(self.question, self.options, self.camera, self.max_new_tokens)
        self.bb.goal, self.started, self.shown = self.goal, time.monotonic(), 0

    def update(self) -> Status:
        text = self.goal.partial_answer
        if len(text) > self.shown:  # what streamed in since the last tick
            print(text[self.shown:], end="", flush=True)
            self.shown = len(text)
        if self.goal.done():
            result = self.bb.answer = self.goal.result()
            if self.shown:
                print(flush=True)
            if result is not None and result.success:
                self.bb.outcome = "answered"
                say(f"[ask] answer: {result.answer!r} (option_index {result.option_index})")
                return Status.SUCCESS
            self.bb.outcome = "failed"
            self.feedback_message = result.error_message if result is not None else self.goal.error
            return Status.FAILURE
        if time.monotonic() - self.started > self.timeout:
            self.goal.cancel()
            self.bb.outcome = "timed out"
            if self.shown:
                print(flush=True)
            return Status.FAILURE
        return Status.RUNNING

    def terminate(self, new_status: Status) -> None:
        if new_status == Status.INVALID and self.goal is not None:  # interrupted, or a higher branch won
            self.goal.cancel()


class Branch(py_trees.behaviour.Behaviour):
    """SUCCESS (and says so) when ``test(answer)`` holds: one branch of the decision."""

    def __init__(self, name: str, test):
        super().__init__(name)
        self.test = test
        self.bb = self.attach_blackboard_client(name)
        self.bb.register_key("answer", access=Access.READ)

    def update(self) -> Status:
        if not self.test(self.bb.answer):
            return Status.FAILURE
        say(f"[branch] {self.name}")  # a robot would act here: go left, open the gripper, ...
        return Status.SUCCESS


class Fallback(py_trees.behaviour.Behaviour):
    """What the robot does when there is no answer: says why, and carries on."""

    def __init__(self):
        super().__init__("fall back")
        self.bb = self.attach_blackboard_client(self.name)
        for key in ("answer", "outcome", "goal"):
            self.bb.register_key(key, access=Access.READ)

    def update(self) -> Status:
        if self.bb.outcome == "timed out":
            say("[fallback] no answer in time: goal cancelled")
        else:
            answer, goal = self.bb.answer, self.bb.goal
            say(f"[fallback] the answer failed: {answer.error_message if answer is not None else goal.error}")
        return Status.SUCCESS


def build_tree(client: StreamCacheClient, question: str, options=(), camera: str = "", max_new_tokens: int = 0,
               timeout: float = 60.0, keyword: str = "yes") -> py_trees.behaviour.Behaviour:
    options = list(options)
    if options:
        branches = [Branch(f"option {i}: {text}", lambda r, i=i: r.option_index == i) for i, text in enumerate(options)]
        branches.append(Branch("none of the options", lambda r: True))
    else:
        branches = [Branch(f"answer mentions {keyword!r}", lambda r: keyword.lower() in r.answer.lower()),
                    Branch("any other answer", lambda r: True)]
    act = py_trees.composites.Selector("act on the answer", memory=True, children=branches)
    answered = py_trees.composites.Sequence("answered", memory=True, children=[
        Ask(client, question, options, camera, max_new_tokens, timeout), act])
    answer_or_fall_back = py_trees.composites.Selector("answer or fall back", memory=True,
                                                       children=[answered, Fallback()])
    return py_trees.composites.Sequence("patrol ask", memory=True,
                                        children=[WaitForFrames(client), answer_or_fall_back])


def run(tree: py_trees.trees.BehaviourTree, period: float) -> str:
    """Ticks the tree to its end; the outcome ("answered", "failed", "timed out")."""
    while tree.root.status not in (Status.SUCCESS, Status.FAILURE):
        tree.tick()
        time.sleep(period)
    return py_trees.blackboard.Blackboard.get("/outcome")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", default=None, help="the node's namespace (default: find the one node)")
    parser.add_argument("--question", default="What is on the table?")
    parser.add_argument("--options", nargs="+", default=[], help="answer options: branch on the chosen one")
    parser.add_argument("--keyword", default="yes", help="without options: branch on whether the answer has it")
    parser.add_argument("--camera", default="", help="one camera topic (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="0: the node's default")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for the answer, then cancel")
    parser.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the node to appear")
    parser.add_argument("--domain-id", type=int, default=None, help="default: ROS_DOMAIN_ID")
    parser.add_argument("--tick", type=float, default=0.1, help="seconds between ticks")
    args = parser.parse_args(argv)

    client = tree = None
    try:
        try:
            client = StreamCacheClient(args.namespace, timeout=args.wait, domain_id=args.domain_id)
        except (NodeNotFound, LookupError) as err:
            print(f"bt_patrol_ask: {err}", file=sys.stderr)
            return EXIT["no node"]
        root = build_tree(client, args.question, args.options, args.camera, args.max_new_tokens, args.timeout,
                          args.keyword)
        tree = py_trees.trees.BehaviourTree(root)
        tree.setup()
        say(py_trees.display.ascii_tree(root))
        outcome = run(tree, args.tick)
        say(py_trees.display.ascii_tree(root, show_status=True))
        goal = py_trees.blackboard.Blackboard.get("/goal")
        if outcome == "timed out" and goal.wait(10.0) and goal.result() is not None:
            result = goal.result()  # the node's own word on the cancel
            say(f"[timeout] the node ended the goal: {result.error_message!r} after {result.answer_tokens} tokens")
        say(f"outcome: {outcome} (exit {EXIT[outcome]})")
        return EXIT[outcome]
    except KeyboardInterrupt:
        if tree is not None:
            tree.root.stop(Status.INVALID)  # the Ask leaf cancels its goal ...
            goal = py_trees.blackboard.Blackboard.storage.get("/goal")
            if goal is not None:
                goal.wait(2.0)  # ... and the cancel gets out before the client closes
        say("outcome: interrupted (exit 130)")
        return EXIT["interrupted"]
    finally:
        if client is not None:
            client.close()


if __name__ == "__main__":
    sys.exit(main())
