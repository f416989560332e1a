"""A ROS 2 participant of its own inside any process: a private rclpy context, one node, and an
executor spinning on a daemon thread.

The Python client is built on it so that it works from plain scripts and from inside another node's
callbacks alike (nothing of the caller's is spun, shut down or given signal handlers); the tests'
probe and the benchmarks' monitor use it the same way.
"""
from __future__ import annotations

import threading


class OwnParticipant:
    def __init__(self, node_name: str, domain_id: int | None = None):
        """``domain_id``: None for ROS_DOMAIN_ID (default 0)."""
        import rclpy  # noqa: PLC0415
        from rclpy.executors import SingleThreadedExecutor  # noqa: PLC0415
        from rclpy.signals import SignalHandlerOptions  # noqa: PLC0415

        self.context = rclpy.Context()
        # no signal handlers: Ctrl-C stays the host program's (a KeyboardInterrupt where it expects one)
        rclpy.init(context=self.context, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node(node_name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, name=node_name, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException  # noqa: PLC0415

        try:
            self.executor.spin()
        except ExternalShutdownException:
            pass

    def in_spin_thread(self, function, *args) -> None:
        """Run ``function(*args)`` on the spinning thread, between two waits: destroying an entity
        from another thread can pull it out from under a wait in progress (rclpy InvalidHandle then
        ends the spin)."""
        self.executor.create_task(function, *args)

    def close(self) -> None:
        import rclpy  # noqa: PLC0415

        if self.context.ok():
            # the spinning thread ends before the node and the context go (else rcl aborts at exit)
            self.executor.shutdown(timeout_sec=2.0)
            self._thread.join(timeout=5.0)
            self.node.destroy_node()
            rclpy.try_shutdown(context=self.context)
