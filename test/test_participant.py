"""The client's own ROS participant (streamcache_ros/client/participant.py) against two ways its
spinning thread could die and leave every later call waiting for its timeout:

- rclpy's ActionClient joins the node's wait set before its constructor has finished; made while
  the executor spins and with the server's transient-local goal status already waiting, the
  executor took that status from a half-built client (AttributeError: no ``_lock``) and the thread
  ended. CI once hung 180 s on exactly that in ``streamcache-ask``. The window is a few microseconds;
  here it is held open (a pause after ``add_waitable``), so the old order fails every time.
- any callback that raises.

Real DDS between two participants in this process; timeouts only guard against hangs.
"""
import threading
import time

import pytest
from rclpy.action import ActionServer

from node_procs import HANG_GUARD_S
from streamcache_ros.client.client import StreamCacheClient
from streamcache_ros.client.participant import OwnParticipant

NS = "/sc_participant"


@pytest.fixture(scope="module")
def server(domain):
    """An Ask service and an Ask action server that answer at once; one goal has finished, so the
    action's status topic holds a message for every new client."""
    from streamcache_ros_interfaces.action import Ask as AskAction
    from streamcache_ros_interfaces.srv import Ask

    participant = OwnParticipant("participant_test_server", domain)

    def answer(request, response):
        response.success, response.answer = True, f"heard: {request.question}"
        return response

    def execute(goal):
        goal.succeed()
        return AskAction.Result(success=True, answer=f"heard: {goal.request.question}")

    participant.node.create_service(Ask, f"{NS}/ask", answer)
    ActionServer(participant.node, AskAction, f"{NS}/ask_action", execute_callback=execute)
    with StreamCacheClient(NS, timeout=HANG_GUARD_S, domain_id=domain) as first:
        assert first.ask_streaming("first", timeout=HANG_GUARD_S).answer == "heard: first"
    yield participant
    participant.close()


def test_a_client_made_while_a_goal_status_waits_answers(server, domain, monkeypatch):
    from rclpy.node import Node

    add_waitable = Node.add_waitable

    def add_then_pause(node, waitable):
        add_waitable(node, waitable)
        time.sleep(0.5)  # the window between joining the wait set and the end of the constructor

    monkeypatch.setattr(Node, "add_waitable", add_then_pause)
    with StreamCacheClient(NS, timeout=HANG_GUARD_S, domain_id=domain) as client:
        assert client._participant._thread.is_alive()
        assert client.ask("after", timeout=HANG_GUARD_S).answer == "heard: after"
        assert client.ask_streaming("streamed", timeout=HANG_GUARD_S).answer == "heard: streamed"


def test_a_callback_that_raises_does_not_end_the_spinning(domain, capfd):
    participant = OwnParticipant("participant_test_raises", domain)
    calls, cond = [], threading.Condition()

    def tick():
        with cond:
            calls.append(time.monotonic())
            cond.notify_all()
        if len(calls) == 1:
            raise RuntimeError("the first tick fails")

    try:
        participant.node.create_timer(0.05, tick)
        with cond:
            assert cond.wait_for(lambda: len(calls) >= 3, HANG_GUARD_S), "the spinning stopped after the failure"
        assert participant._thread.is_alive()
    finally:
        participant.close()
    assert not participant._thread.is_alive()
    err = capfd.readouterr().err
    assert "an executor callback failed; spinning on" in err and "the first tick fails" in err
