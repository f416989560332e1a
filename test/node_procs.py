"""Helpers for the tests that run real processes: streamcache_node, streamcache-replay, ros2 launch.

Every test module gets a ROS domain of its own, on localhost only; every process started here is
stopped by the fixture that started it (SIGINT, then SIGKILL as a last resort).
"""
from __future__ import annotations

import atexit
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"  # this process's own contexts too
HANG_GUARD_S = 180  # timeouts only guard against hangs: nothing asserts on time


def new_domain() -> int:
    """A ROS domain for one test module: random, so parallel runs on one machine do not meet."""
    return random.SystemRandom().randint(10, 230)


def child_env(domain: int, extra_pythonpath: str | None = None) -> dict:
    env = dict(os.environ)
    paths = [p for p in (extra_pythonpath, str(ROOT), env.get("PYTHONPATH")) if p]
    env.update(PYTHONPATH=os.pathsep.join(paths), ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1")
    return env


# every child's log in one folder, removed when the test session ends
LOG_DIR = tempfile.mkdtemp(prefix="streamcache-test-logs-")
atexit.register(shutil.rmtree, LOG_DIR, True)


class Proc:
    """A child process whose output goes to a temporary file (read it with .output())."""

    def __init__(self, cmd: list[str], env: dict):
        self.cmd = cmd
        self.log = tempfile.NamedTemporaryFile("w+", prefix="proc-", suffix=".log", dir=LOG_DIR, delete=False)
        self.popen = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    def output(self) -> str:
        return pathlib.Path(self.log.name).read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float = HANG_GUARD_S) -> int:
        return self.popen.wait(timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGINT (a clean shutdown); SIGKILL to the whole group only when that hangs."""
        if self.alive():
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        return self.popen.returncode

    def kill_group(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_replay(domain: int, bag, *args: str) -> subprocess.CompletedProcess:
    cmd = python_module("streamcache_ros.node.replay", str(bag), *args)
    return subprocess.run(cmd, cwd=ROOT, env=child_env(domain), capture_output=True, text=True, timeout=HANG_GUARD_S)


class Probe:
    """This test process's own ROS participant: subscriptions that collect, publishers."""

    def __init__(self, domain: int):
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node(f"test_probe_{os.getpid()}", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self):
        try:
            self.executor.spin()
        except ExternalShutdownException:
            pass

    def collect(self, msg_type, topic: str, qos, on_message=None) -> list:
        """Messages on ``topic`` as they arrive (appended to the returned list)."""
        got: list = []

        def take(msg):
            with self.cond:
                got.append(msg)
                if on_message is not None:
                    on_message(msg)
                self.cond.notify_all()

        self.node.create_subscription(msg_type, topic, take, qos)
        return got

    def wait_for(self, predicate, timeout: float = HANG_GUARD_S, what: str = "condition"):
        with self.cond:
            if not self.cond.wait_for(predicate, timeout):
                raise TimeoutError(f"hang guard: no {what} within {timeout} s")

    def close(self):
        self.executor.shutdown(timeout_sec=2.0)
        self.thread.join(timeout=5.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def stamp_ns(t) -> int:
    return t.sec * 1_000_000_000 + t.nanosec


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid`` (Linux /proc)."""
    parents = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
