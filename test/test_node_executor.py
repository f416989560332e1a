"""streamcache_ros.node.executor.NodeExecutor: the end of spinning when the context goes away."""
import pytest
import rclpy

from streamcache_ros.node.executor import NodeExecutor


def test_a_context_shut_down_between_checks_ends_spinning_without_an_error():
    # SIGTERM's handler shuts the context down from another thread; the spinning thread may already
    # be past spin()'s ok() check (seen as an RCLError traceback and exit code 1 on `kill -TERM`)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=0)
    node = rclpy.create_node("executor_probe", context=context)
    executor = NodeExecutor(context=context)
    executor.add_node(node)
    try:
        executor.spin_once(timeout_sec=0.05)
        rclpy.shutdown(context=context)
        assert executor._spin_once_impl(0.05) is None
        executor.spin()  # returns at once: the context is no longer ok
    finally:
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()


def test_other_rcl_errors_still_raise():
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=0)
    node = rclpy.create_node("executor_probe_errors", context=context)
    executor = NodeExecutor(context=context)
    executor.add_node(node)

    def broken(*_args, **_kwargs):
        raise RuntimeError("not a shutdown")

    executor.wait_for_ready_callbacks = broken
    try:
        with pytest.raises(RuntimeError, match="not a shutdown"):
            executor._spin_once_impl(0.05)
    finally:
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown(context=context)
