"""Child processes on a ROS domain of their own, as the tests (test/node_procs.py) and the benchmarks
(bench/node_harness.py) run the node, the replay and clients: a domain, the children's environment,
stopping one as Ctrl-C would, and the process tree under a pid (Linux /proc). No ROS imports.
"""
from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import time


def new_domain() -> int:
    """A ROS domain for one test module or benchmark run: random, so parallel runs on one machine do
    not meet; within ``STREAMCACHE_TEST_DOMAINS`` (e.g. ``60-69``) where other ROS processes use the
    other domains."""
    low, _, high = os.environ.get("STREAMCACHE_TEST_DOMAINS", "10-230").partition("-")
    return random.SystemRandom().randint(int(low), int(high or low))


def child_env(domain: int, pythonpath=(), ros_home: str | None = None) -> dict:
    """This process's environment for a child on ``domain``, localhost only, offline, unbuffered, with
    ``pythonpath`` (the checkout, ...) first on its PYTHONPATH; ``ros_home``: its ROS home (where a
    node keeps its archive by default, docs/archive.md), else this process's."""
    env = dict(os.environ)
    if ros_home:
        env["ROS_HOME"] = ros_home
    paths = [p for p in (*pythonpath, env.get("PYTHONPATH")) if p]
    env.update(PYTHONPATH=os.pathsep.join(paths), ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1")
    return env


def stop(proc: subprocess.Popen, timeout: float) -> int:
    """SIGINT, as Ctrl-C (a clean shutdown); SIGKILL to the whole group only when that hangs (the
    return code is then -9). The child must have been started with ``start_new_session=True``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid``."""
    parents = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids, timeout: float) -> list[int]:
    """The pids still alive after ``timeout`` (empty when every one ended)."""
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]
