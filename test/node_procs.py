"""Helpers for the tests that run real processes: streamcache_node, streamcache-replay, ros2 launch,
the ros2 CLI.

Every test module gets a ROS domain of its own, on localhost only; every process started here is
stopped by the fixture that started it (SIGINT, then SIGKILL as a last resort).
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from rclpy.qos import QoSProfile, QoSReliabilityPolicy

from streamcache_ros.client.participant import OwnParticipant
from streamcache_ros.tools import processes
from streamcache_ros.tools.processes import descendants, new_domain  # noqa: F401 - the tests import them from here

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"  # this process's own contexts too
HANG_GUARD_S = 180  # timeouts only guard against hangs: nothing asserts on time
# what a probe collects a node's frame_acks and memory_status with: bursts of a fast replay fit
RELIABLE = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE)

# A shell's background job starts with SIGINT ignored, and SIG_IGN is inherited across exec: every
# child would then ignore the SIGINT a test stops it with. A handled signal resets to the default
# in an exec'd child, so handling it here gives the children a normal SIGINT.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def child_env(domain: int, extra_pythonpath: str | None = None) -> dict:
    """The environment of a child on ``domain`` that runs this checkout (``extra_pythonpath`` first),
    with a ROS home of its own, so that every node starts with an empty archive of its own unless
    a test names one (archive_path)."""
    return processes.child_env(domain, (extra_pythonpath, str(ROOT)), tempfile.mkdtemp(prefix="home-", dir=LOG_DIR))


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

    def wait_for_output(self, text: str, timeout: float = HANG_GUARD_S, count: int = 1) -> str:
        """The output once it holds ``text`` (``count`` times); AssertionError (with the output) when
        the process ends first or the hang guard passes."""
        deadline = time.monotonic() + timeout
        while self.output().count(text) < count:
            assert self.alive() and time.monotonic() < deadline, f"no '{text}' from {self.cmd[:4]}:\n{self.output()}"
            time.sleep(0.2)
        return self.output()

    def wait(self, timeout: float = HANG_GUARD_S) -> int:
        return self.popen.wait(timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGINT (a clean shutdown); SIGKILL to the whole group only when that hangs."""
        return processes.stop(self.popen, timeout)

    def kill_group(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> "Proc":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        self.kill_group()  # whatever the process itself started and left behind


@contextlib.contextmanager
def client_of(node: Proc, domain: int, namespace: str | None):
    """A StreamCacheClient of ``node`` (None: found in the graph); the node's output is printed when
    the client cannot reach it, so the failure says why."""
    from streamcache_ros.client.client import StreamCacheClient  # noqa: PLC0415

    try:
        client = StreamCacheClient(namespace, timeout=HANG_GUARD_S, domain_id=domain)
    except Exception:
        print(node.output())
        raise
    with client:
        yield client


def ros2_env(domain: int) -> dict:
    """child_env for `ros2 ...` processes, their ROS logs kept with the other children's."""
    env = child_env(domain)
    env["ROS_LOG_DIR"] = os.path.join(LOG_DIR, "ros-log")
    return env


@functools.cache
def installed_here() -> str:
    """'' when `ros2 launch streamcache_ros ...` / `ros2 run` would run this checkout, else why not."""
    from streamcache_ros.tools.ros_install import ros2_launch_unavailable  # noqa: PLC0415

    return ros2_launch_unavailable(ROOT)


# CI's set-up installs the ros2 CLI, launch and launch_ros (scripts/setup.sh): there their absence
# is a broken set-up, a failure, never a skip
ON_CI = os.environ.get("CI", "").strip().lower() == "true"

# A test that runs `ros2 launch` / `ros2 run`: conftest.py skips it where they cannot run this
# checkout, naming why (installed_here), and fails it on CI
needs_install = pytest.mark.needs_install


def ros_library(name: str):
    """The module ``name`` of the ROS 2 CLI's wheels (launch, launch_ros, diagnostic_updater): a skip
    naming it where it is not installed, a failure on CI (ON_CI), whose set-up installs it."""
    if ON_CI:
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=f"cannot run here: {name} is not installed (scripts/setup.sh installs it "
                                            "from the ros2 CLI wheels, docs/setup.md)")


def run_launch(domain: int, *args: str) -> Proc:
    """`ros2 launch streamcache_ros <args>` in the background."""
    return Proc(["ros2", "launch", "streamcache_ros", *args], ros2_env(domain))


def status_name(namespace: str | None, task: str) -> str:
    """A /diagnostics status of streamcache_node in ``namespace`` (None or '' = the root): named by
    the node's fully qualified name, so robots on one domain are told apart."""
    ns = (namespace or "").strip("/")
    return f"{'/' + ns if ns else ''}/streamcache_node: {task}"


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def tiny_node(namespace: str, cameras: list[str], **params) -> list[str]:
    """streamcache_node's command line for the tests: the tiny Qwen2.5-VL on the CPU in float32, fifo,
    one frame a second in chunks of 4, short answers, in ``namespace`` listening on ``cameras``;
    ``params`` add parameters or override these."""
    values = {"policy": "fifo", "sample_fps": 1.0, "chunk_frames": 4, "max_new_tokens": 8,
              "model_path": "tiny-qwen2_5_vl", "device": "cpu", "dtype": "float32", **params}
    rules = ["-p", "camera_topics:=[" + ", ".join(f"'{camera}'" for camera in cameras) + "]"]
    for name, value in values.items():
        rules += ["-p", f"{name}:={value}"]
    return python_module("streamcache_ros.node.main", "--namespace", namespace, "--ros-args", *rules)


def run_replay(domain: int, bag, *args: str) -> subprocess.CompletedProcess:
    cmd = python_module("streamcache_ros.tools.replay", str(bag), *args)
    return subprocess.run(cmd, cwd=ROOT, env=child_env(domain), capture_output=True, text=True, timeout=HANG_GUARD_S)


def replay_lock_step(domain: int, bag, namespace: str, *args: str) -> subprocess.CompletedProcess:
    """streamcache-replay into the node in ``namespace``, each frame waited for (--lock-step); the
    test fails unless the replay exits 0."""
    done = run_replay(domain, bag, "--lock-step", "--namespace", namespace, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


class Probe(OwnParticipant):
    """This test process's own ROS participant: subscriptions that collect, publishers."""

    def __init__(self, domain: int):
        super().__init__(f"test_probe_{os.getpid()}", domain)
        self.cond = threading.Condition()

    def collect(self, msg_type, topic: str, qos, on_message=None, matched: bool = False) -> list:
        """Messages on ``topic`` as they arrive (appended to the returned list). ``matched``: return
        only once a publisher is matched, so that nothing published from then on is missed (a
        volatile topic keeps nothing for a subscription that matches late)."""
        got: list = []

        def take(msg):
            with self.cond:
                got.append(msg)
                if on_message is not None:
                    on_message(msg)
                self.cond.notify_all()

        subscription = self.node.create_subscription(msg_type, topic, take, qos)
        if matched:
            self.wait_for(lambda: subscription.get_publisher_count() >= 1, what=f"publisher matched on {topic}")
        return got

    def wait_for(self, predicate, timeout: float = HANG_GUARD_S, what: str = "condition"):
        """Until ``predicate()`` holds: re-checked on every message collected and every 50 ms, since
        graph state (a match, a subscription count) changes without a message to wake it."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"hang guard: no {what} within {timeout} s")
                self.cond.wait(min(left, 0.05))

    def call(self, srv_type, name: str, request):
        """The reply of service ``name`` to ``request``, polled (no message of ours wakes ``cond`` for it)."""
        service = self.node.create_client(srv_type, name)
        try:
            assert service.wait_for_service(timeout_sec=HANG_GUARD_S), f"hang guard: no service {name}"
            future = service.call_async(request)
            deadline = time.monotonic() + HANG_GUARD_S  # a hang guard only
            while not future.done():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"hang guard: no reply from {name} within {HANG_GUARD_S} s")
                time.sleep(0.05)
            return future.result()
        finally:
            self.in_spin_thread(self.node.destroy_client, service)

    def set_parameter(self, node: str, name: str, value):
        """``ros2 param set <node> <name> <value>`` through the node's service: its SetParametersResult."""
        from rcl_interfaces.srv import SetParameters  # noqa: PLC0415
        from rclpy.parameter import Parameter  # noqa: PLC0415

        request = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
        return self.call(SetParameters, f"{node}/set_parameters", request).results[0]

    def get_parameter(self, node: str, name: str):
        """``ros2 param get <node> <name>`` through the node's service: the value."""
        from rcl_interfaces.srv import GetParameters  # noqa: PLC0415
        from rclpy.parameter import parameter_value_to_python  # noqa: PLC0415

        reply = self.call(GetParameters, f"{node}/get_parameters", GetParameters.Request(names=[name]))
        return parameter_value_to_python(reply.values[0])


def stamp_ns(t) -> int:
    return t.sec * 1_000_000_000 + t.nanosec


def wait_gone(pids) -> list[int]:
    """The pids still alive after the hang guard (empty when every one ended)."""
    return processes.wait_gone(pids, HANG_GUARD_S)


def stop_and_check_all_gone(proc: Proc, to_group: bool = False) -> None:
    """SIGINT as Ctrl-C in its terminal: to ``proc`` (a launch passes it on to what it started) or,
    ``to_group``, to its whole process group (`ros2 run` passes nothing on: the terminal's SIGINT
    reaches its child directly). It exits 0 and every process under it ends."""
    tree = descendants(proc.popen.pid)
    assert tree, f"{proc.cmd[:3]} started no process\n{proc.output()}"
    if to_group:
        os.killpg(proc.popen.pid, signal.SIGINT)
    else:
        proc.popen.send_signal(signal.SIGINT)
    assert proc.wait() == 0, proc.output()
    assert not wait_gone(tree), proc.output()


def ros2_daemons(domain: int) -> list[int]:
    """The pids of the `ros2` CLI's daemon for this domain (it detaches: not below any test process)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if any(b"ros2cli.daemon" in a for a in args) and b"--ros-domain-id" in args \
                and args[args.index(b"--ros-domain-id") + 1] == str(domain).encode():
            found.append(int(entry.name))
    return found


def stop_ros2_daemon(domain: int) -> list[int]:
    """`ros2 daemon stop` for this domain; the daemon pids still alive after it (empty when it ended).
    The command returns once the daemon was asked to stop, before the process has ended."""
    daemons = ros2_daemons(domain)
    subprocess.run(["ros2", "daemon", "stop"], cwd=ROOT, env=ros2_env(domain), capture_output=True,
                   timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL)
    return wait_gone(daemons)


def load_example(name: str):
    """``examples/<name>.py`` as a module: the examples are files to copy, not a package."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
