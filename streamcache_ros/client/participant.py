"""A ROS 2 participant of its own inside any process: a private rclpy context, one node, and an
executor spinning on a daemon thread.

The Python client is built on it so that it works from plain scripts and from inside another node's
callbacks alike (nothing of the caller's is spun, shut down or given signal handlers); the tests'
probe and the benchmarks' monitor use it the same way.
"""
from __future__ import annotations

import sys
import threading
import traceback


class OwnParticipant:
    def __init__(self, node_name: str, domain_id: int | None = None, start: bool = True):
        """``domain_id``: None for ROS_DOMAIN_ID (default 0). ``start=False``: create the entities
        first, then call ``start()`` (see ``start``)."""
        import rclpy  # noqa: PLC0415
        from rclpy.executors import SingleThreadedExecutor  # noqa: PLC0415
        from rclpy.signals import SignalHandlerOptions  # noqa: PLC0415

        self.context = rclpy.Context()
        # no signal handlers: Ctrl-C stays the host program's (a KeyboardInterrupt where it expects one)
        rclpy.init(context=self.context, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node(node_name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._closing = False
        self._thread = threading.Thread(target=self._spin, name=node_name, daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Start spinning. rclpy's ActionClient joins the node's wait set before its constructor has
        finished (its lock comes last): made while the executor spins, a status message already
        waiting for it (the server's transient-local status) makes the executor take it from a
        half-built client. Entities made before ``start`` cannot meet that."""
        if self._thread.ident is None:  # not started yet
            self._thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException  # noqa: PLC0415

        # One failed callback or take must not end the thread: every later reply would then wait
        # for its timeout with nothing said. It is printed, and spinning goes on.
        while self.context.ok() and not self._closing:
            try:
                self.executor.spin_once()
            except ExternalShutdownException:
                return
            except Exception:  # noqa: BLE001
                if self._closing or not self.context.ok():
                    return
                print(f"{self._thread.name}: an executor callback failed; spinning on:\n"
                      f"{traceback.format_exc()}", file=sys.stderr, flush=True)

    def in_spin_thread(self, function, *args) -> None:
        """Run ``function(*args)`` on the spinning thread, between two waits: destroying an entity
        from another thread can pull it out from under a wait in progress (rclpy InvalidHandle then
        ends the spin)."""
        self.executor.create_task(function, *args)

    def close(self) -> None:
        import rclpy  # noqa: PLC0415

        if self.context.ok():
            # the spinning thread ends before the node and the context go (else rcl aborts at exit)
            self._closing = True
            self.executor.shutdown(timeout_sec=2.0)
            if self._thread.ident is not None:
                self._thread.join(timeout=5.0)
            self.node.destroy_node()
            rclpy.try_shutdown(context=self.context)
