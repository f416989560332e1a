"""One hour of world stream through `ros2 launch`: memory flat, no chunk failed, answers checked.

    python bench/hour_soak.py                          # 3600 frames, HERMES, the bundled world model
    python bench/hour_soak.py --frames 96 --segment 32 --json /tmp/h.json --figure /tmp/h.png   # the CI run

A held-out world stream (docs/world.md) of ``--frames`` frames at 1 fps is written as bags of
``--segment`` frames (300: five minutes). `ros2 launch streamcache_ros live.launch.py` starts the
node (HERMES, the model's own budget; console entries where `ros2 launch` cannot run this
checkout, said in the JSON); each bag is replayed in lock step, as fast as the node takes it, and
after each one the world's option questions for that moment are asked over DDS and scored against
the truth, with `last_seen` / `first_seen` through the `when` service (±2 s). Reported (table, JSON,
and a plot of the node's RSS and KV bytes over the frames): memory flat (KV bytes after the budget
is reached; RSS growth), chunks failed (must be 0), accuracy per 600 frames, and the exit after
SIGINT. Exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import node_harness as h  # noqa: E402

NS = "/hour"
CAM = "/hour/cam"
SEED = 500_000_000 + 9_500_000  # the benchmarks' held-out range (docs/world-models.md)
WHEN_TOLERANCE_S = 2.0
KINDS = ("first_color", "first_shape", "seen", "now_color", "now_count", "now_shape", "last_seen", "first_seen")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=3600)
    p.add_argument("--segment", type=int, default=300, help="frames per bag; questions after each")
    p.add_argument("--policy", default="hermes")
    p.add_argument("--model", default="", help="model_path (default: the node's, the bundled world model)")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--json", type=pathlib.Path, default=h.RESULTS / "hour_soak.json")
    p.add_argument("--figure", type=pathlib.Path, default=h.ROOT / "bench" / "figures" / "hour_soak.png")
    return p.parse_args(argv)


def launch_command(args, camera: str) -> tuple[list[str], str]:
    """`ros2 launch ... live.launch.py`, or the console entry where it cannot run this checkout;
    ``camera``: the bag's topic (a JPEG stream is on <topic>/compressed, docs/world.md)."""
    from streamcache_ros.tools.ros_install import ros2_launch_unavailable  # noqa: PLC0415

    overrides = {"camera_topics": f"['{camera}']", "policy": args.policy, **({"model_path": args.model} if args.model else {})}
    unavailable = ros2_launch_unavailable(h.ROOT)
    if unavailable:
        return h.node_command(NS, overrides), f"console entry ({unavailable})"
    return (["ros2", "launch", "streamcache_ros", "live.launch.py", f"namespace:={NS.strip('/')}"]
            + [f"{k}:={v}" for k, v in overrides.items()], "ros2 launch streamcache_ros live.launch.py")


def node_pid(launcher: subprocess.Popen) -> int:
    """The node's own process (under `ros2 launch` a child of the launch) for its RSS."""
    for pid in [launcher.pid, *h.descendants(launcher.pid)]:
        try:
            cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "streamcache_ros.node.main" in cmd or "streamcache_node" in cmd:
            return pid
    return launcher.pid


def ask_point(client, record: dict, n: int) -> list[dict]:
    """The world's questions after ``n`` frames, over DDS, each scored against the truth."""
    out = []
    for q in record["questions"]:
        if q["after_frames"] != n or q["kind"] not in KINDS:
            continue
        if q["kind"] in ("last_seen", "first_seen"):
            r = client.when(q["probe"], "last" if q["kind"] == "last_seen" else "first")
            truth = q["answer_stamp_ns"] * 1e-9
            said = r.stamp.sec + r.stamp.nanosec * 1e-9 if r.success and r.found else None
            out.append({"frames": n, "kind": q["kind"], "success": r.success, "said": said, "truth": truth,
                        "correct": said is not None and abs(said - truth) <= WHEN_TOLERANCE_S})
            continue
        r = client.ask(q["text"], q["options"])
        out.append({"frames": n, "kind": q["kind"], "success": r.success, "said": r.option_index,
                    "truth": q["answer_index"], "correct": r.success and r.option_index == q["answer_index"]})
    return out


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from streamcache_ros.client.client import StreamCacheClient  # noqa: PLC0415
    from streamcache_ros.tools.bagfile import make_world_segments, read_world_questions  # noqa: PLC0415

    work = pathlib.Path(tempfile.mkdtemp(prefix="streamcache-hour-"))
    bags = make_world_segments(work / "stream", args.seed, args.frames, args.segment, topic=CAM)
    record = read_world_questions(work / "stream")
    domain = h.new_domain()
    env = h.child_env(domain)
    env["ROS_LOG_DIR"] = str(work / "ros-log")
    command, how = launch_command(args, record["world"]["topic"])
    started = time.monotonic()
    launcher = h.start(command, env, work / "node.log")
    monitor = h.Monitor(domain, NS)
    answers, points = [], []
    try:
        monitor.wait_for(lambda: monitor.statuses, h.GUARD_S, "the node's first memory_status")
        monitor.node_pid = node_pid(launcher)
        with StreamCacheClient(NS, timeout=120, domain_id=domain) as client:
            for k, bag in enumerate(bags):
                done = subprocess.run(h.replay_command(bag, NS), env=env, cwd=h.ROOT, capture_output=True, text=True,
                                      timeout=h.GUARD_S)
                if done.returncode != 0:
                    raise RuntimeError(f"replay of {bag.name} failed: {done.stdout[-400:]} {done.stderr[-400:]}")
                n = min((k + 1) * args.segment, args.frames)
                answers += ask_point(client, record, n)
                status = client.memory_status()
                points.append({"frames": n, "kv_bytes": status.kv_bytes, "frames_in_memory": status.frames_in_memory,
                               "chunks_failed": status.chunks_failed, "rss": h.rss_bytes(monitor.node_pid),
                               "process_rss_bytes": status.process_rss_bytes, "seconds": time.monotonic() - started})
                print(f"[hour_soak] {n} frames: {points[-1]}", flush=True)
    finally:
        code = h.stop(launcher)
        monitor.close()
    left = [pid for pid in h.descendants(launcher.pid) if h.alive(pid)]
    return report(args, how, answers, points, monitor, code, left)


def report(args, how: str, answers, points, monitor, code: int, left) -> int:
    step = max(args.segment, 600 if args.frames >= 1200 else args.segment)
    per = []
    for end in range(step, args.frames + 1, step):
        mine = [a for a in answers if end - step < a["frames"] <= end]
        per.append({"frames": end, "questions": len(mine), "accuracy": round(sum(a["correct"] for a in mine) /
                                                                              len(mine), 3) if mine else None,
                    **{kind: round(sum(a["correct"] for a in mine if a["kind"] == kind) /
                                   max(1, sum(a["kind"] == kind for a in mine)), 2)
                       for kind in ("last_seen", "first_seen") if any(a["kind"] == kind for a in mine)}})
    full = [p for p in points[1:]] or points  # the first segment fills the budget
    kv = [p["kv_bytes"] for p in full]
    checks = {"memory flat (KV bytes within 5% after the first segment)": max(kv) <= 1.05 * min(kv),
              "no chunk failed": points[-1]["chunks_failed"] == 0,
              "exit 0 after SIGINT": code == 0, "no process left": not left}
    print(h.table(per, list(per[0])))
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    plot(monitor, points, args.figure)
    h.write_json(args.json, {"machine": h.machine(), "config": {**vars(args), "json": str(args.json),
                                                                "figure": str(args.figure)},
                             "started_through": how, "per_600_frames": per, "points": points,
                             "answers": answers, "checks": checks, "exit_code": code,
                             "rss_over_status": [(msg.frames_received, rss) for _, rss, msg in monitor.statuses
                                                 if rss][::10]})
    print(f"wrote {args.json}")
    return 0 if all(checks.values()) else 1


def plot(monitor, points, path: pathlib.Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    seen = [(msg.frames_received, rss, msg.kv_bytes) for _, rss, msg in monitor.statuses if rss]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    if seen:
        ax.plot([s[0] for s in seen], [s[1] / 2**20 for s in seen], label="node RSS (MiB)")
        ax.plot([s[0] for s in seen], [s[2] / 2**20 for s in seen], label="KV cache (MiB)")
    ax.set_xlabel("frames received")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"one hour of world stream through the node: memory over {points[-1]['frames']} frames")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
