"""An hour through `ros2 launch` with the archive, stopped twice at the middle, asked about the first half.

    python bench/archive_restarts.py                                   # 3600 frames, HERMES, the bundled world model
    python bench/archive_restarts.py --frames 600 --segment 100        # a quick look

A held-out world stream is written as bags of ``--segment`` frames and replayed in lock step, as fast
as the node takes it, into `ros2 launch streamcache_ros live.launch.py` (HERMES, an archive in a
folder of its own, ``recall_chunks`` 4). At the middle:

1. the first-half questions are asked (``before``);
2. the launch gets SIGINT and is started again on the same archive; asked again (``after SIGINT``);
3. the next bag is replayed and the node is killed with SIGKILL half-way into a chunk; the launch is
   started again; asked again (``after kill -9``); then the rest of the stream, and asked at the end.

The first-half questions are windows of 100 frames (``seen``, ``now_color``, ``now_count`` over the
window), and ``first_color`` / ``first_shape`` / ``seen`` / ``when first`` up to the middle: every one
answered from the archive once the working memory has moved on. The stream keeps three identities
out (``world.kept_out``), so ``seen`` has "no" to ask; its yes/no questions are scored beside what
always-yes and always-no would score on them. Reported: accuracy per phase against
the truth, answers that changed across a restart, archive chunks before and after each restart,
frames lost to the kill (at most the chunk in progress: docs/archive.md "Durability"), the launch's exit
codes, memory flat. Exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import node_harness as h  # noqa: E402
from hour_soak import ask_point, node_pid  # noqa: E402

from streamcache_ros.tools.ros_install import ros2_launch_unavailable  # noqa: E402

NS = "/restarts"
CAM = "/restarts/cam"
SEED = 500_000_000 + 9_600_000  # the benchmarks' held-out range (docs/world-models.md)
WHEN_TOLERANCE_S = 2.0
WINDOW_FRAMES = 100
RECALL_CHUNKS = 4
FRAMES_PER_CHUNK = 8  # the bundled world model's chunk (its model folder): what a kill may lose


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=3600)
    p.add_argument("--segment", type=int, default=300, help="frames per bag")
    p.add_argument("--policy", default="hermes")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--json", type=pathlib.Path, default=h.RESULTS / "archive_restarts.json")
    return p.parse_args(argv)


# -- the questions about the first half -----------------------------------------------------------
def first_half_questions(stream, middle: int, start_s: float) -> list[dict]:
    """What is asked at every phase: the same requests each time, all about frames before ``middle``."""
    rng = np.random.default_rng((stream.seed, middle, 7))
    until = start_s + middle - 1 + 0.5
    out = []
    for first in (0, middle // 4, middle // 2, 3 * middle // 4):
        last = min(first + WINDOW_FRAMES - 1, middle - 1)
        for q in stream.window_questions(middle, first, last, rng, kinds=("seen", "now_color", "now_count")):
            out.append({"kind": f"window_{q.kind}", "text": q.text, "options": q.options, "answer_index": q.answer_index,
                        "since": start_s + first - 0.5, "until": start_s + last + 0.5,
                        "truth_yes": q.answer == "yes" if q.kind == "seen" else None})
    for q in stream.questions(middle, rng, ("first_color", "first_shape", "seen", "first_seen")):
        if q.kind == "first_seen":
            out.append({"kind": q.kind, "probe": q.probe, "answer_stamp": start_s + q.answer_frame, "until": until,
                        "truth_yes": True})
        else:
            out.append({"kind": q.kind, "text": q.text, "options": q.options, "answer_index": q.answer_index,
                        "until": until, "truth_yes": q.answer == "yes" if q.kind == "seen" else None})
    return out


def ask_first_half(client, questions: list[dict], phase: str) -> list[dict]:
    out = []
    for q in questions:
        started = time.perf_counter()
        if q["kind"] == "first_seen":
            r = client.when(q["probe"], "first", until=q["until"])
            said = r.stamp.sec + r.stamp.nanosec * 1e-9 if r.success and r.found else None
            correct = said is not None and abs(said - q["answer_stamp"]) <= WHEN_TOLERANCE_S
            recalled = None
        else:
            r = client.ask(q["text"], q["options"], since=q.get("since"), until=q["until"])
            said, correct = r.option_index, r.success and r.option_index == q["answer_index"]
            recalled = r.recalled_chunks
        out.append({"phase": phase, "kind": q["kind"], "truth_yes": q["truth_yes"], "success": r.success, "said": said,
                    "correct": bool(correct),
                    "recalled_chunks": recalled, "error": r.error_message if not r.success else "",
                    "ms": round((time.perf_counter() - started) * 1e3, 1)})
    return out


# -- the node -------------------------------------------------------------------------------------
def launch_command(args, camera: str, params_file: pathlib.Path) -> tuple[list[str], str]:
    unavailable = ros2_launch_unavailable(h.ROOT)
    if unavailable:
        return (h.node_command(NS, {"camera_topics": f"['{camera}']", "policy": args.policy})
                + ["--params-file", str(params_file)], f"console entry ({unavailable})")
    return (["ros2", "launch", "streamcache_ros", "live.launch.py", f"namespace:={NS.strip('/')}",
             f"camera_topics:=['{camera}']", f"policy:={args.policy}", f"policy_params_file:={params_file}"],
            "ros2 launch streamcache_ros live.launch.py")


def wait_ready(monitor, seen: int) -> object:
    """The first memory_status of a (re)started node: its archive open, its services up."""
    monitor.wait_for(lambda: len(monitor.statuses) > seen, h.GUARD_S, "the node's first memory_status")
    return monitor.statuses[-1][2]


def replay(bag, env) -> None:
    done = subprocess.run(h.replay_command(bag, NS), env=env, cwd=h.ROOT, capture_output=True, text=True,
                          timeout=h.GUARD_S)
    if done.returncode != 0:
        raise RuntimeError(f"replay of {bag.name} failed: {done.stdout[-400:]} {done.stderr[-400:]}")


def archive_state(status) -> dict:
    return {"archive_chunks": status.archive_chunks, "archive_bytes": status.archive_bytes,
            "archive_newest_s": h.stamp_ns(status.archive_newest_stamp) * 1e-9, "kv_bytes": status.kv_bytes,
            "frames_received": status.frames_received, "chunks_failed": status.chunks_failed}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from streamcache_ros import world  # noqa: PLC0415
    from streamcache_ros.client.client import StreamCacheClient  # noqa: PLC0415
    from streamcache_ros.tools.bagfile import (DEFAULT_START_NS, make_world_segments, read_world_questions,  # noqa: PLC0415
                                               world_segments_stream)

    work = pathlib.Path(tempfile.mkdtemp(prefix="streamcache-restarts-"))
    absent = world.kept_out(args.seed)  # "no" to ask in the first half, however long it is
    bags = make_world_segments(work / "stream", args.seed, args.frames, args.segment, topic=CAM, absent=absent)
    stream = world_segments_stream(args.seed, args.frames, args.segment, absent=absent)
    record = read_world_questions(work / "stream")
    middle_bag = len(bags) // 2
    middle = middle_bag * args.segment
    start_s = DEFAULT_START_NS * 1e-9
    questions = first_half_questions(stream, middle, start_s)
    params_file = work / "archive.yaml"
    params_file.write_text("/**:\n  ros__parameters:\n"
                           f"    archive_path: '{work / 'archive'}'\n    recall_chunks: {RECALL_CHUNKS}\n")
    domain = h.new_domain()
    env = h.child_env(domain)
    env["ROS_LOG_DIR"] = str(work / "ros-log")
    command, how = launch_command(args, record["world"]["topic"], params_file)
    monitor = h.Monitor(domain, NS)
    answers, first_half, states, exits = [], [], {}, {}
    launches = 0
    started = time.monotonic()

    def launch():
        nonlocal launches
        launches += 1
        proc = h.start(command, env, work / f"node-{launches}.log")
        status = wait_ready(monitor, len(monitor.statuses))
        monitor.node_pid = node_pid(proc)
        return proc, status

    def client():
        return StreamCacheClient(NS, timeout=120, domain_id=domain)

    launcher, _ = launch()
    try:
        with client() as c:
            for k in range(middle_bag):
                replay(bags[k], env)
                answers += ask_point(c, record, (k + 1) * args.segment)
            first_half += ask_first_half(c, questions, "before")
            states["before SIGINT"] = archive_state(c.memory_status())
        exits["SIGINT"] = h.stop(launcher)

        launcher, status = launch()
        states["after SIGINT"] = archive_state(status)
        with client() as c:
            first_half += ask_first_half(c, questions, "after SIGINT")
            acks = len(monitor.acks)
            player = subprocess.Popen(h.replay_command(bags[middle_bag], NS), env=env, cwd=h.ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            # half-way into a chunk: the frames of the chunk in progress are waiting, not yet encoded
            half = FRAMES_PER_CHUNK * 5 + FRAMES_PER_CHUNK // 2
            monitor.wait_for(lambda: len(monitor.acks) >= acks + half, h.GUARD_S, f"{half} frames acknowledged")
            os.kill(monitor.node_pid, signal.SIGKILL)
            acked = [stamp for _, stamp in monitor.acks[acks:]]
        try:
            exits["kill -9"] = launcher.wait(60)
        except subprocess.TimeoutExpired:
            exits["kill -9"] = f"still running after 60 s; stopped: {h.stop(launcher)}"
        os.killpg(player.pid, signal.SIGKILL)
        player.wait()

        launcher, status = launch()
        states["after kill -9"] = after = archive_state(status)
        lost = [s for s in acked if s * 1e-9 > after["archive_newest_s"] + 1e-6]
        with client() as c:
            first_half += ask_first_half(c, questions, "after kill -9")
            for k in range(middle_bag + 1, len(bags)):
                replay(bags[k], env)
                answers += ask_point(c, record, min((k + 1) * args.segment, args.frames))
            first_half += ask_first_half(c, questions, "end")
            states["end"] = archive_state(c.memory_status())
    finally:
        exits["end SIGINT"] = h.stop(launcher)
        monitor.close()
    left = [pid for pid in h.descendants(launcher.pid) if h.alive(pid)]
    return report(args, how, questions, first_half, answers, states, exits, acked, lost, left,
                  time.monotonic() - started)


def report(args, how, questions, first_half, answers, states, exits, acked, lost, left, wall_s) -> int:
    phases = ("before", "after SIGINT", "after kill -9", "end")
    per_phase = {}
    for phase in phases:
        mine = [a for a in first_half if a["phase"] == phase]
        yes_no = [a for a in mine if a["truth_yes"] is not None]
        share = float(np.mean([a["truth_yes"] for a in yes_no])) if yes_no else 0.0
        per_phase[phase] = {"questions": len(mine), "answered": sum(a["success"] for a in mine),
                            "accuracy": round(sum(a["correct"] for a in mine) / max(1, len(mine)), 3),
                            # the yes/no questions, against what always-yes and always-no score on them
                            "yes_no": len(yes_no), "yes_no_accuracy": round(float(np.mean([a["correct"] for a in yes_no])),
                                                                            3) if yes_no else None,
                            "always_yes": round(share, 3), "always_no": round(1 - share, 3),
                            "median_ms": float(np.median([a["ms"] for a in mine])) if mine else None}
    before = [a for a in first_half if a["phase"] == "before"]
    changed = {phase: sum(a["said"] != b["said"] for a, b in zip([x for x in first_half if x["phase"] == phase], before))
               for phase in phases[1:]}
    checks = {
        "every first-half question answered after each restart": all(
            per_phase[p]["answered"] == len(questions) for p in phases),
        "the archive came back whole after SIGINT":
            states["after SIGINT"]["archive_chunks"] == states["before SIGINT"]["archive_chunks"],
        f"at most the chunk in progress lost to kill -9 ({len(lost)} of {len(acked)} frames acknowledged)":
            len(lost) < FRAMES_PER_CHUNK,
        "exit 0 after SIGINT": exits["SIGINT"] == 0 and exits["end SIGINT"] == 0,
        "no chunk failed": states["end"]["chunks_failed"] == 0,
        "KV bytes flat at the end": states["end"]["kv_bytes"] <= 1.05 * states["before SIGINT"]["kv_bytes"],
        "no process left": not left,
    }
    print(h.table([{"phase": p, **v} for p, v in per_phase.items()], ["phase", "questions", "answered", "accuracy",
                                                                       "yes_no", "yes_no_accuracy", "always_yes",
                                                                       "always_no", "median_ms"]))
    print(h.table([{"state": k, **v} for k, v in states.items()], ["state", *states["end"]]))
    print(f"answers changed against 'before': {changed}; launch exit codes: {exits}")
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    h.write_json(args.json, {"machine": h.machine(), "config": {**vars(args), "json": str(args.json)},
                             "started_through": how, "first_half": per_phase, "changed_answers": changed,
                             "states": states, "launch_exit_codes": exits, "frames_lost_to_kill": len(lost),
                             "frames_acknowledged_before_kill": len(acked), "checks": checks,
                             "stream_accuracy": round(sum(a["correct"] for a in answers) / max(1, len(answers)), 3),
                             "questions": questions, "first_half_answers": first_half, "answers": answers,
                             "wall_s": round(wall_s, 1)})
    print(f"wrote {args.json}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
