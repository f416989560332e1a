"""What a client follows without blocking (behaviour-tree leaves poll them once a tick): an Ask
action goal, the newest MemoryStatus, the standing questions' WatchEvents."""
from __future__ import annotations

import threading
import time
from typing import Callable


class AskGoal:
    """One Ask action goal, followed without blocking: ``state`` goes from PENDING (sent, not yet
    accepted) to RUNNING (accepted: the answer streams into ``partial_answer``) to DONE (``result()``
    holds the action's result; check its ``success``: a cancelled goal ends DONE with success false
    and error_message "cancelled"), or to REJECTED / FAILED (no result; ``error`` says why)."""

    PENDING, RUNNING, DONE, REJECTED, FAILED = "pending", "running", "done", "rejected", "failed"

    def __init__(self, on_text: Callable[[str, str], None] | None = None):
        self.state = AskGoal.PENDING
        self.partial_answer = ""
        self.error = ""
        self.exception: BaseException | None = None
        self.cancel_requested = False
        self._on_text = on_text
        self._result = None
        self._handle = None
        self._cancel_sent = False
        self._cond = threading.Condition()
        # a done-callback added to a future already done runs on the adding thread, not the executor's
        self._text_lock = threading.Lock()

    def done(self) -> bool:
        """True once the goal has ended (DONE, REJECTED or FAILED)."""
        return self.state in (AskGoal.DONE, AskGoal.REJECTED, AskGoal.FAILED)

    def result(self):
        """The Ask action's result; None while the goal runs, or when it was rejected or failed."""
        return self._result

    def cancel(self) -> None:
        """Ask the node to stop answering (now, or as soon as the goal is accepted)."""
        with self._cond:
            if self.done():
                return
            self.cancel_requested = True
            handle = self._handle
            send = handle is not None and not self._cancel_sent
            self._cancel_sent = self._cancel_sent or send
        if send:
            handle.cancel_goal_async()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (for scripts; a BT leaf polls ``done()`` instead); False on timeout."""
        return self._wait_for(self.done, timeout)

    # -- the client's executor thread calls these -------------------------------------------------
    def _on_goal_response(self, future) -> None:
        if future.exception() is not None:
            return self._fail(f"sending the goal failed: {future.exception()}", future.exception())
        handle = future.result()
        if not handle.accepted:
            return self._end(AskGoal.REJECTED, error="the ask_action goal was rejected")
        with self._cond:
            self._handle = handle
            self.state = AskGoal.RUNNING
            cancel = self.cancel_requested and not self._cancel_sent
            self._cancel_sent = self._cancel_sent or cancel
            self._cond.notify_all()
        if cancel:
            handle.cancel_goal_async()
        handle.get_result_async().add_done_callback(self._on_result)

    def _on_feedback(self, msg) -> None:
        with self._text_lock:
            if self.done():
                return  # late feedback (see _on_result)
            self.partial_answer = msg.feedback.partial_answer
            if self._on_text is not None:
                self._on_text(msg.feedback.partial_answer, msg.feedback.new_text)

    def _on_result(self, future) -> None:
        if future.exception() is not None:
            return self._fail(f"getting the result failed: {future.exception()}", future.exception())
        result = future.result().result
        # Feedback and the result travel separately: the result can overtake the last pieces. Once
        # it is here, late feedback is ignored and what is missing is handed over from the result.
        with self._text_lock:
            received = self.partial_answer.lstrip()  # the result's answer is stripped
            if result.answer.startswith(received) and len(result.answer) > len(received):
                missing = result.answer[len(received):]
                self.partial_answer += missing
                if self._on_text is not None:
                    self._on_text(self.partial_answer, missing)
            self._end(AskGoal.DONE, result=result)

    def _fail(self, error: str, exception: BaseException | None = None) -> None:
        self._end(AskGoal.FAILED, error=error, exception=exception)

    def _end(self, state: str, result=None, error: str = "", exception: BaseException | None = None) -> None:
        with self._cond:
            self._result, self.error, self.exception = result, error, exception
            self.state = state
            self._cond.notify_all()

    def _wait_for(self, predicate, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def _raise_if_failed(self) -> None:
        if self.state == AskGoal.REJECTED:
            raise RuntimeError(self.error)
        if self.state == AskGoal.FAILED:
            raise self.exception if self.exception is not None else RuntimeError(self.error)


class MemoryStatusWatch:
    """The newest MemoryStatus, kept by one subscription that lasts (``latest``: None until one came)."""

    def __init__(self, client, topic: str):  # client: the StreamCacheClient that makes it
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy  # noqa: PLC0415

        self.topic = topic
        self.latest = None
        self.received = 0  # messages so far
        self.closed = False
        self.published_ns = 0  # the newest message's source timestamp (ns, the publisher's clock)
        self._client = client
        self._cond = threading.Condition()
        self._sub = client.node.create_subscription(
            client._types["MemoryStatus"], topic, self._take,
            QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE))

    def _take(self, msg, info) -> None:
        with self._cond:
            self.latest, self.published_ns = msg, info["source_timestamp"]
            self.received += 1
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[object], bool], timeout: float | None = None):
        """The first message (the latest one included) for which ``predicate(msg)`` holds."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.latest is not None and predicate(self.latest), timeout):
                raise TimeoutError(f"no matching {self.topic} within {timeout} s")
            return self.latest

    def next(self, timeout: float | None = 10.0):
        """The next message published after this call: by its source timestamp, or where the node's
        clock and this one disagree, the second one to arrive (the first may have been in flight)."""
        called_ns, seen = time.time_ns(), self.received
        with self._cond:
            if not self._cond.wait_for(lambda: (self.received > seen and self.published_ns >= called_ns)
                                       or self.received >= seen + 2, timeout):
                raise TimeoutError(f"no {self.topic} within {timeout} s")
            return self.latest

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._client._participant.in_spin_thread(self._client.node.destroy_subscription, self._sub)


class WatchEvents:
    """The standing questions' WatchEvents (watch_questions) as they come, kept in ``events`` (never
    blocks: a behaviour-tree leaf polls ``since(n)`` once per tick)."""

    def __init__(self, client, topic: str):  # client: the StreamCacheClient that makes it
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy  # noqa: PLC0415

        self.topic = topic
        self.events: list = []
        self.closed = False
        self._client = client
        self._cond = threading.Condition()
        self._sub = client.node.create_subscription(
            client._types["WatchEvent"], topic, self._take, QoSProfile(depth=200, reliability=QoSReliabilityPolicy.RELIABLE))

    def _take(self, msg) -> None:
        with self._cond:
            self.events.append(msg)
            self._cond.notify_all()

    def since(self, count: int) -> list:
        """The events after the first ``count`` (a leaf keeps its count and asks for what is new)."""
        with self._cond:
            return list(self.events[count:])

    def wait_for(self, predicate: Callable[[object], bool], timeout: float | None = None, after: int = 0):
        """The first event after the first ``after`` for which ``predicate`` holds (TimeoutError)."""
        with self._cond:
            found: list = []

            def match() -> bool:
                found[:] = [e for e in self.events[after:] if predicate(e)][:1]
                return bool(found)

            if not self._cond.wait_for(match, timeout):
                raise TimeoutError(f"no matching {self.topic} within {timeout} s")
            return found[0]

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._client._participant.in_spin_thread(self._client.node.destroy_subscription, self._sub)
