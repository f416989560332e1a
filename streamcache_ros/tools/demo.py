"""The main job through ROS 2: streamcache_node in its own process, the demo bag (a shape-world
stream, docs/world.md) replayed into it, the world's questions asked through the Ask service with
each answer printed beside the truth and the accuracy so far, one question streamed through the Ask
action, memory status and diagnostics printed.

    streamcache-node-demo [--policy fifo] [--budget 96] [--bag data/demo_bag]   (scripts/demo.sh)

Where `ros2 launch` runs this checkout (the ros2 CLI wheels or a system ROS 2, and the colcon install
scripts/setup.sh makes), the node and the replay start through
``ros2 launch streamcache_ros replay.launch.py``; elsewhere (or with ``--without-launch``) as the
console entries that start the same node with the same YAML. Everything runs in a ROS domain of its
own on localhost (unless ROS_DOMAIN_ID is set), and every process it starts is stopped at the end
(SIGINT, as Ctrl-C in a launch's terminal).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

from .ros_install import ros2_launch_unavailable

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMESPACE = "/streamcache"
DEMO_HOME = ROOT / "data" / "demo_ros_home"
# The demo bag: a world stream whose end allows every question kind (seed picked for that, not for
# the answers), 100 frames at 1 fps, 320x240 rgb8
DEMO_SEED, DEMO_FRAMES, DEMO_SIZE = 23, 100, (320, 240)
STREAMED_QUESTION = "What color is the {shape} now?"
NODE_NAME = f"{NAMESPACE}/streamcache_node"  # its /diagnostics statuses carry its fully qualified name
WHEN_TOLERANCE_S = 2.0  # a when answer is right within this of the true stamp (docs/world.md)
LEVELS = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}


def default_bag() -> pathlib.Path:
    if (ROOT / "setup.py").is_file():  # a checkout: the bag scripts/setup.sh makes
        return ROOT / "data" / "demo_bag"
    return pathlib.Path.home() / ".cache" / "streamcache_ros" / "demo_bag"


def demo_look():
    """The demo stream's look: the one its seed draws, at DEMO_SIZE, rgb8."""
    import numpy as np  # noqa: PLC0415

    from .. import world  # noqa: PLC0415

    drawn = world.random_look(np.random.default_rng((DEMO_SEED, 0)))
    return world.Look(**{**drawn.__dict__, "width": DEMO_SIZE[0], "height": DEMO_SIZE[1], "encoding": "rgb8"})


def make_demo_bag(path: pathlib.Path) -> pathlib.Path:
    from .bagfile import make_patrol_bag  # noqa: PLC0415

    # a patrol (docs/world.md "The patrol world"): the frames of a world stream and the robot's odometry
    return make_patrol_bag(path, DEMO_SEED, DEMO_FRAMES, look=demo_look(), overwrite=True)


def ensure_bag(path: pathlib.Path, default: bool = True) -> None:
    from .bagfile import WORLD_QUESTIONS_FILE  # noqa: PLC0415

    record = path / WORLD_QUESTIONS_FILE
    # the default demo bag from before the patrol (no odometry) is made again; a bag given is as it is
    if (path / "metadata.yaml").is_file() and record.is_file() and (not default or '"patrol"' in record.read_text()):
        return
    print(f"making the demo bag {path} (a shape-world stream: {DEMO_FRAMES} frames at 1 fps)", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    make_demo_bag(path)


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(ROOT)
    # a ROS home of its own, whose archive main() empties: the node's archive (docs/archive.md)
    # starts empty at every demo, as the answers beside the truth assume
    env["ROS_HOME"] = str(DEMO_HOME)
    return env


def stop(process: subprocess.Popen, name: str) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            print(f"{name} did not stop on SIGINT: killed", flush=True)
            process.kill()
            process.wait()
    return process.returncode


def time_s(t) -> float:
    return t.sec + t.nanosec * 1e-9


def print_status(m) -> None:
    print(f"  policy {m.policy}, model {m.model_id}: {m.frames_in_memory} frames in memory "
          f"(stamps {time_s(m.oldest_stamp):.1f} .. {time_s(m.newest_stamp):.1f} s)")
    print(f"  KV cache: {m.kv_tokens} tokens over {len(m.layer_tokens)} layers ({list(m.layer_tokens)}), "
          f"{m.kv_bytes / 1024:.0f} KiB; " + (f"budget {m.budget_tokens} video tokens per layer" if m.budget_tokens
                                               else f"banks {list(m.bank_tokens)}" if len(m.bank_tokens) else "unbounded"))
    print(f"  frames: {m.frames_received} received, {m.frames_sampled} sampled, {m.frames_dropped} dropped, "
          f"{m.frames_rejected} rejected; {m.chunks_encoded} chunks ({m.chunks_failed} failed), "
          f"{m.questions_answered} questions answered")
    print(f"  last chunk: encode {m.encode_ms:.1f} ms, prefill {m.prefill_ms:.1f} ms, compress "
          f"{m.compress_ms:.1f} ms; last TTFT {m.last_ttft_ms:.1f} ms")


def print_diagnostics(array, node_name: str) -> None:
    for status in array.status:
        if not status.name.startswith(node_name):
            continue
        level = LEVELS.get(int.from_bytes(status.level, "little") if isinstance(status.level, bytes) else status.level)
        print(f"  [{level:5}] {status.name}: {status.message}")
        keep = ("Frames received", "Frames dropped (encoder busy)", "Frames rejected", "Last frame age (s)",
                "KV bytes", "Layer tokens min/mean/max", "Encode (ms, last chunk)", "Last TTFT (ms)")
        shown = [f"{kv.key}={kv.value}" for kv in status.values if kv.key in keep]
        if shown:
            print(f"          {', '.join(shown)}")


def show_when(client, record: dict) -> None:
    """One `when` of each mode the world asks, beside the truth (docs/interfaces.md "When")."""
    asked = {}
    for q in record["questions"]:
        if q["kind"] in ("last_seen", "first_seen") and q.get("probe") and q["kind"] not in asked:
            asked[q["kind"]] = q
    if not asked:
        return
    print("\nwhen, searched in the memory (the when service, question asked over time windows):")
    for kind, q in asked.items():
        mode = "last" if kind == "last_seen" else "first"
        r = client.when(q["probe"], mode)
        truth = q["answer_stamp_ns"] * 1e-9
        if not r.success:
            print(f"  when {mode}: {q['probe']}  refused: {r.error_message}")
            continue
        said = time_s(r.stamp) if r.found else None
        mark = "right" if said is not None and abs(said - truth) <= WHEN_TOLERANCE_S else "WRONG"
        shown = f"{said:.0f} s" if said is not None else "not found"
        print(f"  when {mode}: {q['probe']}\n      found: {shown} (P(yes) {r.yes_probability:.2f}, "
              f"{r.questions_asked} windows, {r.total_ms:.0f} ms)   truth: {truth:.0f} s   {mark} "
              f"(within ±{WHEN_TOLERANCE_S:g} s)")


def show_where(client, record: dict) -> None:
    """"Where did you last see X?": a `when` that returns the pose of the frame found, beside the
    robot's true pose then and the place it was in (docs/places.md)."""
    patrol = record.get("patrol")
    q = next((q for q in record["questions"] if q["kind"] == "last_seen" and q.get("probe")), None)
    if patrol is None or q is None:
        return
    r = client.when(q["probe"], "last")
    truth_index = round((q["answer_stamp_ns"] - record["world"]["start_ns"]) / 1e9)
    tx, ty, _ = patrol["poses"][truth_index]
    place = patrol["place_at"][truth_index] or "between places"
    print("\nwhere, from the pose archived with the frame found (a `when`, mode last):")
    if not (r.success and r.found and r.has_pose):
        print(f"  where: {q['probe']}  {r.error_message or 'not found, or that frame has no pose'}")
        return
    p = r.pose.pose.position
    off = ((p.x - tx) ** 2 + (p.y - ty) ** 2) ** 0.5
    print(f"  where did you last see it? {q['probe']}\n      found: x={p.x:.2f} y={p.y:.2f} ({r.pose.header.frame_id}) "
          f"at {time_s(r.stamp):.0f} s   truth: x={tx:.2f} y={ty:.2f}, {place}   "
          f"{'right' if off <= 1.0 else 'WRONG'} ({off:.2f} m off; within 1 m)")
    inside = client.when(q["probe"], "last", place=place) if patrol["place_at"][truth_index] else None
    if inside is not None:
        print(f"      limited to {place}: {'found' if inside.found else 'not found'} "
              f"({inside.frames_in_place} of {inside.frames_in_window} frames were taken there)")


class PlainProcesses:
    """The node and the replay tool started as console entries (no `ros2 launch` needed)."""

    description = "streamcache_node and streamcache-replay as processes of their own"

    def __init__(self, bag: pathlib.Path, overrides: dict):
        self.bag = bag
        cmd = [sys.executable, "-m", "streamcache_ros.node.main", "--params-file", str(ROOT / "config" / "streamcache.yaml"),
               "--namespace", NAMESPACE, "--ros-args", "-p", "use_sim_time:=true"]
        for name, value in overrides.items():
            cmd += ["-p", f"{name}:={value}"]
        self.node = subprocess.Popen(cmd, cwd=ROOT, env=child_env())  # its log goes to this terminal

    def replay(self) -> bool:
        print(f"replaying {self.bag} in lock-step (every frame reaches the node), /clock from the bag", flush=True)
        done = subprocess.run([sys.executable, "-m", "streamcache_ros.tools.replay", str(self.bag), "--lock-step", "--fast",
                               "--clock", "--namespace", NAMESPACE], cwd=ROOT, env=child_env())
        return done.returncode == 0

    def alive(self) -> bool:
        return self.node.poll() is None

    def stop(self) -> int:
        code = stop(self.node, "streamcache_node")
        print(f"streamcache_node stopped (exit code {code})")
        return code


class LaunchedProcesses:
    """`ros2 launch streamcache_ros replay.launch.py`: the node and the replay of the bag (lock-step)."""

    description = "ros2 launch streamcache_ros replay.launch.py"

    def __init__(self, bag: pathlib.Path, overrides: dict):
        cmd = ["ros2", "launch", "streamcache_ros", "replay.launch.py", f"bag:={bag}", "rate:=0", "lock_step:=true",
               f"namespace:={NAMESPACE.strip('/')}"] + [f"{name}:={value}" for name, value in overrides.items()]
        print("  $ " + " ".join(cmd), flush=True)
        self.launch = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, bufsize=1)
        self.replay_ok: bool | None = None
        self.replay_ended = threading.Event()
        threading.Thread(target=self._echo, daemon=True).start()

    def _echo(self) -> None:
        """The launch's output goes to this terminal; the replay's end is read from it."""
        for line in self.launch.stdout:
            print(line, end="", flush=True)
            if "[replay] done:" in line:
                self.replay_ok = True
                self.replay_ended.set()
            elif "streamcache-replay" in line and "process has died" in line:
                self.replay_ok = False
                self.replay_ended.set()
        self.replay_ended.set()  # the launch ended

    def replay(self) -> bool:
        self.replay_ended.wait()
        return bool(self.replay_ok)

    def alive(self) -> bool:
        return self.launch.poll() is None

    def stop(self) -> int:
        code = stop(self.launch, "ros2 launch")
        print(f"ros2 launch stopped (exit code {code}): streamcache_node and streamcache-replay with it")
        return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamcache-node-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--bag", type=pathlib.Path, default=None, help="a rosbag2 (default: the demo bag)")
    parser.add_argument("--policy", default=None, help="full | fifo | hermes | h2svc (default: the node's)")
    parser.add_argument("--budget", type=int, default=None,
                        help="video tokens kept per layer (fifo, hermes; default: the node's)")
    parser.add_argument("--model", default=None, help="model_path (default: the bundled world model)")
    parser.add_argument("--without-launch", action="store_true",
                        help="start the node and the replay as console entries even where `ros2 launch` works")
    args = parser.parse_args(argv)
    shutil.rmtree(DEMO_HOME / "streamcache" / "archive", ignore_errors=True)  # the last demo's memory

    os.environ.setdefault("ROS_DOMAIN_ID", str(random.randint(120, 220)))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    bag = (args.bag or default_bag()).resolve()
    ensure_bag(bag, default=args.bag is None)
    overrides = {} if args.budget is None else {"budget_tokens": args.budget}
    from .bagfile import WORLD_QUESTIONS_FILE, read_world_questions  # noqa: PLC0415

    patrol = read_world_questions(bag).get("patrol") if (bag / WORLD_QUESTIONS_FILE).is_file() else None
    if patrol:  # a patrol bag's odometry and map: every frame's pose, its named places
        overrides.update(pose_topic=patrol["odom_topic"], places_file=str(bag / patrol["places_file"]))
    if args.policy:
        overrides["policy"] = args.policy
    if args.model:
        overrides["model_path"] = args.model
    unavailable = "--without-launch" if args.without_launch else ros2_launch_unavailable(ROOT)
    kind = PlainProcesses if unavailable else LaunchedProcesses
    print(f"starting streamcache_node in {NAMESPACE} (ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']}, localhost) "
          f"through {kind.description}" + (f" ({unavailable})" if unavailable else ""), flush=True)
    started = time.monotonic()
    processes = kind(bag, overrides)
    code = 0
    client = None
    try:
        from ..client.client import StreamCacheClient  # noqa: PLC0415

        client = StreamCacheClient(NAMESPACE, timeout=180.0)
        print(f"node ready after {time.monotonic() - started:.1f} s", flush=True)
        code = run_demo(client, processes, bag)
    except KeyboardInterrupt:
        code = 130
    except Exception as err:  # noqa: BLE001 - say what failed, then stop the processes
        print(f"demo failed: {type(err).__name__}: {err}", file=sys.stderr)
        code = 1
    finally:
        if client is not None:
            client.close()
        stopped_code = processes.stop()
        print(f"total {time.monotonic() - started:.1f} s")
        if stopped_code not in (0, None) and code == 0:
            code = 1
    return code


def run_demo(client, processes, bag: pathlib.Path) -> int:
    from diagnostic_msgs.msg import DiagnosticArray  # noqa: PLC0415
    from rclpy.qos import QoSProfile, QoSReliabilityPolicy  # noqa: PLC0415
    from streamcache_ros_interfaces.msg import MemoryStatus  # noqa: PLC0415

    from .bagfile import read_world_questions  # noqa: PLC0415

    latest_diag: list = []
    diag_seen = threading.Event()
    chunks_seen = set()
    replaying = threading.Event()
    replaying.set()

    def on_status(m):
        if replaying.is_set() and m.chunks_encoded and m.chunks_encoded not in chunks_seen:
            chunks_seen.add(m.chunks_encoded)
            print(f"  chunk {m.chunks_encoded:2d}: {m.frames_in_memory:3d} frames in memory, {m.kv_tokens:5d} KV tokens, "
                  f"{m.kv_bytes / 1024:6.0f} KiB | encode {m.encode_ms:5.1f} ms, prefill {m.prefill_ms:5.1f} ms, "
                  f"compress {m.compress_ms:4.1f} ms", flush=True)

    def on_diag(array):
        if any(s.name.startswith(NODE_NAME) for s in array.status):
            latest_diag[:] = [array]
            diag_seen.set()

    reliable = QoSProfile(depth=50, reliability=QoSReliabilityPolicy.RELIABLE)
    client.node.create_subscription(MemoryStatus, f"{NAMESPACE}/memory_status", on_status, reliable)
    client.node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, reliable)

    print("memory status after each chunk (from when the demo connected):", flush=True)
    replayed = processes.replay()
    client.memory_status(timeout=10.0)  # the status after the last chunk has been printed
    replaying.clear()
    if not replayed:
        print("streamcache-replay failed", file=sys.stderr)
        return 1

    record = read_world_questions(bag)
    scored = [q for q in record["questions"] if q["options"]]
    print(f"\nthe world's questions through the Ask service ({len(scored)} with options, "
          f"after {record['world']['frames']} frames):")
    right = 0
    for number, q in enumerate(scored, 1):
        r = client.ask(q["text"], q["options"])
        if not r.success:
            print(f"  Q: {q['text']}\n  refused: {r.error_message}")
            return 1
        right += r.option_index == q["answer_index"]
        mark = "right" if r.option_index == q["answer_index"] else "WRONG"
        print(f"  Q{number}: {q['text']}  options {q['options']}\n"
              f"      node: {r.answer!r} (option {r.option_index})   truth: {q['answer']!r}   {mark}   "
              f"accuracy so far {right}/{number}\n"
              f"      ({r.frames_in_memory} frames in memory, {r.kv_tokens} KV tokens, TTFT {r.ttft_ms:.1f} ms)")
    shown = next((q for q in scored if q["kind"] == "now_color"), None)
    if shown is not None:
        question = shown["text"]
        print("\na question through the Ask action (streamed feedback):")
        print(f"  Q: {question} (no options)\n  A: ", end="", flush=True)
        pieces = []

        def show(partial: str, new_text: str) -> None:
            pieces.append(new_text)
            print(new_text, end="", flush=True)

        result = client.ask_streaming(question, max_new_tokens=8, on_text=show)
        print(f"\n     ({len(pieces)} feedback messages; result success={result.success}, truth {shown['answer']!r})")
    show_when(client, record)
    show_where(client, record)
    refused = client.ask("What color is the circle now?", camera="/no/such/camera")
    print(f"\na question about an unknown camera is refused: success={refused.success}, "
          f"error_message={refused.error_message!r}")

    print("\nMemoryStatus (memory_status):")
    print_status(client.memory_status(timeout=10.0))
    diag_seen.clear()
    if diag_seen.wait(timeout=5.0):
        print("\n/diagnostics (the camera is WARN, then ERROR, once the bag has ended: no frames since):")
        print_diagnostics(latest_diag[0], NODE_NAME)
    print(f"\naccuracy: {right}/{len(scored)} of the world's questions (chance is about "
          f"{sum(1 / len(q['options']) for q in scored):.1f}/{len(scored)}); the bundled model is small and was "
          "trained here on the shape world only (README).")
    return 0 if processes.alive() else 1


if __name__ == "__main__":
    sys.exit(main())
