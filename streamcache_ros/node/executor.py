"""The node's executor: rclpy's MultiThreadedExecutor, with each ready task handed to the thread
pool once.

rclpy up to 9.x (Kilted) yields a task again while it still waits in the thread pool's queue
(ros2/rclpy#1452; fixed upstream in 10.0.4 by ros2/rclpy#1547 and the executor rework before it):
the spinning thread resubmits it in a tight loop while holding the GIL, thousands of copies queue
up, and every callback and the ingest thread crawl. Measured here before this class: a lock-step
replay took a frame in about 170 ms with chunks of 11-27 ms, and a tiny model's question waited
0.7 s for its first token. Here a task waiting to start is not submitted again; the spinning thread
waits a moment for a worker to start it instead. Where rclpy's executor does not have the internals
this relies on, the stock executor is used unchanged.
"""
from __future__ import annotations

import threading

from rclpy import executors

_SKIPPED = tuple(getattr(executors, name) for name in ("ExternalShutdownException", "ShutdownException",
                                                       "TimeoutException", "ConditionReachedException")
                 if hasattr(executors, name))
QUEUED_WAIT_S = 0.005  # how long the spinning thread sleeps while a submitted task waits for a worker


def _destroyed_meanwhile(err: RuntimeError) -> bool:
    """rcl's refusal of an entity whose handle was destroyed by another thread (rclpy's InvalidHandle,
    or RCLError "Failed to add '<entity>' to wait set: ... pointer is invalid")."""
    text = str(err)
    return type(err).__name__ == "InvalidHandle" or ("to wait set" in text and "is invalid" in text)


class NodeExecutor(executors.MultiThreadedExecutor):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._waiting: dict[object, threading.Event] = {}  # submitted, not yet started -> set when started
        self._patched = all(hasattr(self, name) for name in ("_executor", "_futures", "wait_for_ready_callbacks"))

    def _spin_once_impl(self, timeout_sec=None, wait_condition=lambda: False):
        if not self._patched:
            return super()._spin_once_impl(timeout_sec, wait_condition)
        try:
            handler, _, _ = self.wait_for_ready_callbacks(timeout_sec, None, wait_condition)
        except _SKIPPED:
            return None
        except RuntimeError as err:  # rclpy's RCLError, InvalidHandle
            # SIGTERM's handler shuts the context down from another thread: between spin()'s ok()
            # check and the wait set made here. That is the end of spinning, not an error.
            # A lifecycle transition on a worker thread (cleanup, shutdown) destroys the services and
            # the action server: one destroyed between the wait set's list of entities and its
            # addition is refused by rcl ("... pointer is invalid"), and the next wait set is made
            # without it (the failed generator is replaced). That is not an error either.
            if self._context.ok() and not _destroyed_meanwhile(err):
                raise
            return None
        started = self._waiting.get(handler)
        if started is not None:  # yielded again while queued: let a worker take it
            started.wait(QUEUED_WAIT_S)
            return None
        started = threading.Event()
        self._waiting[handler] = started

        def run():
            started.set()
            try:
                handler()
            finally:
                self._waiting.pop(handler, None)

        self._executor.submit(run)
        self._futures.append(handler)
        for future in self._futures[:]:
            if future.done():
                self._futures.remove(future)
                future.result()  # raise any exceptions, as the stock executor does
        return None
