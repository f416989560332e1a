"""A small Python client for streamcache_node, for scripts, other nodes and behaviour-tree leaves.

    from streamcache_ros.node.client import StreamCacheClient
    with StreamCacheClient() as memory:                 # finds the node (or namespace="/streamcache")
        reply = memory.ask("what is on the table?")     # the Ask service
        print(reply.success, reply.answer, reply.error_message)
        result = memory.ask_streaming("describe the room", on_text=lambda partial, new: print(new, end=""))
        status = memory.memory_status()                 # the next MemoryStatus message

The client runs its own rclpy context, node and executor thread, so it works from plain scripts and
from inside another node's callbacks alike (nothing of the caller's is spun). Calls block until
the reply comes or ``timeout`` seconds pass (TimeoutError).
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Callable

ASK_SERVICE_TYPE = "streamcache_ros_interfaces/srv/Ask"
_instances = itertools.count()


class NodeNotFound(TimeoutError):
    """No streamcache node answered in time (not running, another ROS_DOMAIN_ID, ...)."""


def find_namespaces(node) -> list[str]:
    """Namespaces of the streamcache nodes ``node`` can see ('' for the root namespace)."""
    found = []
    for name, types in node.get_service_names_and_types():
        if name.endswith("/ask") and ASK_SERVICE_TYPE in types:
            found.append(name[: -len("/ask")])
    return sorted(found)


def discover_namespace(node, timeout: float, spin: Callable[[float], None] | None = None) -> str:
    """The namespace of the one streamcache node in the graph; NodeNotFound / LookupError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        found = find_namespaces(node)
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise LookupError(f"several streamcache nodes: {', '.join(n or '/' for n in found)}; "
                              "name one with --namespace")
        if time.monotonic() > deadline:
            raise NodeNotFound(f"no streamcache node found within {timeout:.0f} s "
                               f"(ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', '0')})")
        (spin or time.sleep)(0.1)


def _wait(future, timeout: float | None, what: str):
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    if not done.wait(timeout):
        raise TimeoutError(f"no reply to {what} within {timeout} s")
    if future.exception() is not None:
        raise future.exception()
    return future.result()


class StreamCacheClient:
    def __init__(self, namespace: str | None = None, timeout: float = 15.0, domain_id: int | None = None):
        """``namespace``: the node's namespace ('/streamcache' with the launch files, '' for a bare
        ``streamcache_node``); None finds the one node in the graph. ``timeout``: how long to wait for
        the node to appear. ``domain_id``: default ROS_DOMAIN_ID."""
        import rclpy  # noqa: PLC0415
        from rclpy.action import ActionClient  # noqa: PLC0415
        from rclpy.executors import SingleThreadedExecutor  # noqa: PLC0415
        from rclpy.signals import SignalHandlerOptions  # noqa: PLC0415
        from streamcache_ros_interfaces.action import Ask as AskAction  # noqa: PLC0415
        from streamcache_ros_interfaces.msg import MemoryStatus  # noqa: PLC0415
        from streamcache_ros_interfaces.srv import Ask, LoadMemory, ResetMemory, SaveMemory  # noqa: PLC0415

        self._types = {"Ask": Ask, "AskAction": AskAction, "ResetMemory": ResetMemory, "SaveMemory": SaveMemory,
                       "LoadMemory": LoadMemory, "MemoryStatus": MemoryStatus}
        self._context = rclpy.Context()
        rclpy.init(context=self._context, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node(f"streamcache_client_{os.getpid()}_{next(_instances)}", context=self._context)
        self._executor = SingleThreadedExecutor(context=self._context)
        self._executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, name="streamcache-client", daemon=True)
        self._thread.start()
        try:
            self.namespace = (discover_namespace(self.node, timeout) if namespace is None
                              else ("/" + namespace.strip("/")) if namespace.strip("/") else "")
            ns = self.namespace
            self._ask = self.node.create_client(Ask, f"{ns}/ask")
            self._reset = self.node.create_client(ResetMemory, f"{ns}/reset_memory")
            self._save = self.node.create_client(SaveMemory, f"{ns}/save_memory")
            self._load = self.node.create_client(LoadMemory, f"{ns}/load_memory")
            self._action = ActionClient(self.node, AskAction, f"{ns}/ask_action")
            if not self._ask.wait_for_service(timeout_sec=timeout):
                raise NodeNotFound(f"service {ns}/ask not available within {timeout:.0f} s")
        except BaseException:
            self.close()
            raise

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException  # noqa: PLC0415

        try:
            self._executor.spin()
        except ExternalShutdownException:
            pass

    # -- calls ----------------------------------------------------------------------------------
    def _request(self, client, request, timeout, what):
        if not client.wait_for_service(timeout_sec=timeout if timeout is not None else 15.0):
            raise NodeNotFound(f"service {client.srv_name} is not available")
        return _wait(client.call_async(request), timeout, what)

    def ask(self, question: str, options=(), camera: str = "", max_new_tokens: int = 0,
            timeout: float | None = 300.0):
        """The Ask service; returns its response (check ``success`` / ``error_message``)."""
        request = self._types["Ask"].Request(question=question, options=list(options), camera=camera,
                                             max_new_tokens=max_new_tokens)
        return self._request(self._ask, request, timeout, "ask")

    def ask_streaming(self, question: str, options=(), camera: str = "", max_new_tokens: int = 0,
                      on_text: Callable[[str, str], None] | None = None, cancel: threading.Event | None = None,
                      on_accepted: Callable[[], None] | None = None, timeout: float | None = 300.0):
        """The Ask action: ``on_text(partial_answer, new_text)`` per feedback; setting ``cancel``
        cancels the goal (the result then has success false and the partial answer). Returns the
        action's result."""
        if not self._action.wait_for_server(timeout_sec=timeout if timeout is not None else 15.0):
            raise NodeNotFound(f"action {self.namespace}/ask_action is not available")
        goal = self._types["AskAction"].Goal(question=question, options=list(options), camera=camera,
                                             max_new_tokens=max_new_tokens)
        # Feedback and the result travel separately: the result can overtake the last pieces. Once
        # it is here, late feedback is ignored and what is missing is handed over from the result.
        shown = {"partial": "", "done": False}
        lock = threading.Lock()

        def feedback(msg):
            with lock:
                if shown["done"] or on_text is None:
                    return
                shown["partial"] = msg.feedback.partial_answer
                on_text(msg.feedback.partial_answer, msg.feedback.new_text)
        handle = _wait(self._action.send_goal_async(goal, feedback_callback=feedback), timeout, "ask_action goal")
        if not handle.accepted:
            raise RuntimeError("the ask_action goal was rejected")
        if on_accepted is not None:
            on_accepted()
        result_future = handle.get_result_async()
        deadline = None if timeout is None else time.monotonic() + timeout
        cancelled = False
        while not result_future.done():
            if cancel is not None and cancel.is_set() and not cancelled:
                handle.cancel_goal_async()
                cancelled = True
            if deadline is not None and time.monotonic() > deadline:
                handle.cancel_goal_async()
                raise TimeoutError(f"no ask_action result within {timeout} s (goal cancelled)")
            threading.Event().wait(0.02)
        result = result_future.result().result
        with lock:
            shown["done"] = True
            received = shown["partial"].lstrip()  # the result's answer is stripped
            if on_text is not None and result.answer.startswith(received) and len(result.answer) > len(received):
                missing = result.answer[len(received):]
                on_text(shown["partial"] + missing, missing)
        return result

    def reset(self, timeout: float | None = 60.0):
        return self._request(self._reset, self._types["ResetMemory"].Request(), timeout, "reset_memory")

    def save(self, path: str, timeout: float | None = 120.0):
        return self._request(self._save, self._types["SaveMemory"].Request(path=path), timeout, "save_memory")

    def load(self, path: str, timeout: float | None = 120.0):
        return self._request(self._load, self._types["LoadMemory"].Request(path=path), timeout, "load_memory")

    def memory_status(self, timeout: float = 10.0):
        """The next MemoryStatus the node publishes (1 Hz, and after each chunk) after this call."""
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy  # noqa: PLC0415

        got: list = []
        arrived = threading.Event()

        def take(msg):
            if not got:
                got.append(msg)
                arrived.set()

        # a subscription of its own: a volatile one gets only what is published from now on
        sub = self.node.create_subscription(self._types["MemoryStatus"], f"{self.namespace}/memory_status", take,
                                            QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE))
        try:
            if not arrived.wait(timeout):
                raise TimeoutError(f"no {self.namespace}/memory_status within {timeout} s")
            return got[0]
        finally:
            # destroyed by the executor's own thread, between two waits: from here it could pull the
            # subscription out from under a wait in progress (rclpy InvalidHandle ends the spin)
            self._executor.create_task(self.node.destroy_subscription, sub)

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        import rclpy  # noqa: PLC0415

        if self._context.ok():
            # the spinning thread ends before the node and the context go (else rcl aborts at exit)
            self._executor.shutdown(timeout_sec=2.0)
            self._thread.join(timeout=5.0)
            self.node.destroy_node()
            rclpy.try_shutdown(context=self._context)

    def __enter__(self) -> "StreamCacheClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
