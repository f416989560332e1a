"""What bench/soak.py and bench/node_throughput.py share: streamcache_node, streamcache-replay and
client processes on a ROS domain of their own (localhost; the process helpers are the tests' too:
streamcache_ros/tools/processes.py), a monitor of memory_status and frame_acks in this process, and
small table / JSON / statistics helpers."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from streamcache_ros.client.participant import OwnParticipant  # noqa: E402 - after the path
from streamcache_ros.tools import processes  # noqa: E402
from streamcache_ros.tools.processes import alive, descendants, new_domain  # noqa: E402,F401 - the benchmarks' h.*

RESULTS = ROOT / "bench" / "results"
GUARD_S = 600  # hang guard for one process step
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # this process's own participants


def child_env(domain: int) -> dict:
    # a ROS home of its own: each benchmark node starts with an empty archive (docs/archive.md)
    return processes.child_env(domain, (str(ROOT),), tempfile.mkdtemp(prefix="streamcache-bench-home-"))


def start(cmd: list[str], env: dict, log: pathlib.Path) -> subprocess.Popen:
    handle = open(log, "w")  # noqa: SIM115 - the child keeps writing to it
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)


def node_command(namespace: str, params: dict) -> list[str]:
    args = []
    for name, value in params.items():
        args += ["-p", f"{name}:={value}"]
    return [sys.executable, "-m", "streamcache_ros.node.main", "--namespace", namespace, "--ros-args", *args]


def replay_command(bag, namespace: str, *extra: str, rate: float | None = None) -> list[str]:
    """A lock-step replay, as fast as the node takes frames (rate None) or at ``rate`` x the recording."""
    speed = ["--fast"] if rate is None else ["--rate", str(rate)]
    # a frame is resent only when not acknowledged for a long while: a question may hold the model
    return [sys.executable, "-m", "streamcache_ros.tools.replay", str(bag), "--lock-step", *speed, "--quiet",
            "--namespace", namespace, "--ack-timeout", "60", *extra]


def stop(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    """SIGINT, as Ctrl-C; SIGKILL to the group only when that hangs (returns -9 then)."""
    return processes.stop(proc, timeout)


def rss_bytes(pid: int) -> int:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def stamp_ns(t) -> int:
    return t.sec * 1_000_000_000 + t.nanosec


class Monitor(OwnParticipant):
    """This process's own ROS participant: every memory_status (with the node's RSS at arrival)
    and every frame acknowledgement (with its arrival time), in order."""

    def __init__(self, domain: int, namespace: str, node_pid: int | None = None):
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy  # noqa: PLC0415
        from std_msgs.msg import Header  # noqa: PLC0415
        from streamcache_ros_interfaces.msg import MemoryStatus  # noqa: PLC0415

        self.node_pid = node_pid
        self.statuses: list[tuple[float, int, object]] = []  # (monotonic, node RSS, MemoryStatus)
        self.acks: list[tuple[float, int]] = []  # (monotonic, stamp ns)
        self._cond = threading.Condition()
        super().__init__(f"bench_monitor_{os.getpid()}", domain)
        qos = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE)
        self.node.create_subscription(MemoryStatus, f"{namespace}/memory_status", self._on_status, qos)
        self.node.create_subscription(Header, f"{namespace}/frame_acks", self._on_ack, qos)
        from diagnostic_msgs.msg import DiagnosticArray  # noqa: PLC0415

        self.latency: dict[str, str] = {}  # the last "latency" diagnostic status's values
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)

    def _on_status(self, msg) -> None:
        rss = rss_bytes(self.node_pid) if self.node_pid else 0
        with self._cond:
            self.statuses.append((time.monotonic(), rss, msg))
            self._cond.notify_all()

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name.endswith(": latency"):
                self.latency = {kv.key: kv.value for kv in status.values}

    def _on_ack(self, msg) -> None:
        with self._cond:
            self.acks.append((time.monotonic(), stamp_ns(msg.stamp)))
            self._cond.notify_all()

    def wait_for(self, predicate, timeout: float = GUARD_S, what: str = "condition") -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise TimeoutError(f"hang guard: no {what} within {timeout} s")

    def latest(self):
        """The next memory_status published from now (the node publishes at 1 Hz)."""
        with self._cond:
            count = len(self.statuses)
        self.wait_for(lambda: len(self.statuses) > count, 30, "memory_status")
        return self.statuses[-1][2]


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two distinct xs)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def machine() -> dict:
    """What the figures were measured on, the date and the commit (common.py, as every benchmark)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from common import machine as common_machine  # noqa: PLC0415

    return common_machine()


def write_json(path: pathlib.Path, data: dict) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path
