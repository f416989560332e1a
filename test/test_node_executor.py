"""The end of spinning: NodeExecutor when the context goes away, the node process on SIGINT / SIGTERM."""
import os
import signal
import subprocess

import pytest
import rclpy

from node_procs import HANG_GUARD_S, ROOT, child_env, new_domain, python_module

from streamcache_ros.node.executor import NodeExecutor


@pytest.fixture
def executor():
    """A NodeExecutor with one node, in a context of its own (domain from new_domain())."""
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=new_domain())
    node = rclpy.create_node("executor_probe", context=context)
    executor = NodeExecutor(context=context)
    executor.add_node(node)
    yield executor
    executor.shutdown(timeout_sec=1.0)
    node.destroy_node()
    rclpy.try_shutdown(context=context)


def test_a_context_shut_down_between_checks_ends_spinning_without_an_error(executor):
    # SIGTERM's handler shuts the context down from another thread; the spinning thread may already
    # be past spin()'s ok() check (seen as an RCLError traceback and exit code 1 on `kill -TERM`)
    executor.spin_once(timeout_sec=0.05)
    rclpy.shutdown(context=executor.context)
    assert executor._spin_once_impl(0.05) is None
    executor.spin()  # returns at once: the context is no longer ok


def test_other_rcl_errors_still_raise(executor):
    def broken(*_args, **_kwargs):
        raise RuntimeError("not a shutdown")

    executor.wait_for_ready_callbacks = broken
    with pytest.raises(RuntimeError, match="not a shutdown"):
        executor._spin_once_impl(0.05)


def test_an_entity_destroyed_by_a_transition_while_the_wait_set_is_made_is_skipped(executor):
    """`ros2 lifecycle set ... shutdown` (and cleanup) destroys the action server on a
    worker thread; the spinning thread, making its wait set at that moment, got rcl's refusal and the
    process ended with a traceback and exit code 1 instead of 0. The next wait set is made without it."""
    calls = []

    def racing(*_args, **_kwargs):
        calls.append(1)
        raise RuntimeError("Failed to add 'rcl_action_server_t' to wait set: action server pointer is invalid, "
                           "at /project/src/rcl_action/action_server.c:1054")

    real = executor.wait_for_ready_callbacks
    executor.wait_for_ready_callbacks = racing
    assert executor._spin_once_impl(0.05) is None and calls == [1]
    executor.wait_for_ready_callbacks = real
    executor.spin_once(timeout_sec=0.05)  # spinning goes on


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["sigint-default", "sigint-ignored"])
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_node_process_ends_cleanly_on_sigint_and_sigterm(stop_signal, sigint_ignored):
    """Ctrl-C, `kill`, systemd: exit code 0 and no traceback, also when started from a background job
    (SIGINT inherited ignored; rclpy installs its own handler)."""
    def ignore_sigint():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(python_module("streamcache_ros.node.main", "--ros-args", "-p", "policy:=fifo"),
                            cwd=ROOT, env=child_env(new_domain()), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=ignore_sigint if sigint_ignored else None)
    try:
        lines = []
        for line in proc.stdout:  # until the node is active (or has ended)
            lines.append(line)
            if "active: listening on" in line:
                break
        assert "active: listening on" in lines[-1], "".join(lines)
        proc.send_signal(stop_signal)
        rest, _ = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == 0, "".join(lines) + rest
        assert "Traceback" not in rest, rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
