"""Which robot saw it, over DDS (docs/places.md "Which robot saw it"): three streamcache_node processes
(/robot1..3), each fed its own held-out patrol bag (its own camera and odometry), all stamped on one
clock, then ``ask_fleet`` asked about every identity.

    python bench/fleet.py                         # 3 robots x 600 frames, the Qwen world model
    python bench/fleet.py --frames 300 --out bench/reported

Every robot's patrol keeps the same three identities out of view, so "nobody saw it" is asked too.
An answer is right when the best entry names the robot whose patrol last saw the identity (a tie:
either of them), its stamp within 2 s of that sighting and its pose within 1 m of the robot's true
pose there; for an identity nobody saw, when no robot says found. Beside it, what naming one robot
always, and saying "nobody" always, score on the same questions; and the time a fleet call takes
(warm: one participant kept; cold: one made for the call, discovery included) against one `when`
asked of one node.
"""
from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import node_harness as h  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.client import StreamCacheClient, ask_fleet  # noqa: E402
from streamcache_ros.client.participant import OwnParticipant  # noqa: E402
from streamcache_ros.tools import bagfile  # noqa: E402

ROBOTS = ("/robot1", "/robot2", "/robot3")
SEED = 530_000_000  # held out: no training run draws it
WHEN_TOLERANCE_S = 2.0
WHERE_TOLERANCE_M = 1.0


def truth_of(streams, identity, frames: int):
    """(the robots that saw ``identity`` last, that frame) or ((), None) when none saw it."""
    seen = [(s.last_seen(identity, frames), k) for k, s in enumerate(streams)]
    seen = [(f, k) for f, k in seen if f is not None]
    if not seen:
        return (), None
    newest = max(f for f, _ in seen)
    return tuple(k for f, k in seen if f == newest), newest


def bagfile_posed(folder: pathlib.Path) -> tuple[int, int]:
    """(frames archived with a pose, without one) in a robot's archive, read after its node stopped."""
    import json  # noqa: PLC0415
    import sqlite3  # noqa: PLC0415

    db = sqlite3.connect(folder / "archive.sqlite")
    poses = [p for stamps, row in db.execute("SELECT stamps, poses FROM chunks")
             for p in (json.loads(row) if row else [None] * len(json.loads(stamps)))]
    db.close()
    return sum(p is not None for p in poses), sum(p is None for p in poses)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="world-qwen2_5_vl")
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--timeout", type=float, default=60.0, help="the fleet call's timeout")
    parser.add_argument("--out", type=pathlib.Path, default=h.RESULTS)
    args = parser.parse_args(argv)
    work = pathlib.Path(tempfile.mkdtemp(prefix="streamcache-fleet-"))
    absent = world.kept_out(SEED, 3)
    seeds = [SEED + k for k in range(len(ROBOTS))]
    bags = [bagfile.make_patrol_bag(work / ns.strip("/"), seed, args.frames, topic=f"{ns}/cam",
                                    odom_topic=f"{ns}/odom", absent=absent) for ns, seed in zip(ROBOTS, seeds)]
    streams = [world.make_long_patrol_stream(seed, args.frames, absent=absent, places=world.patrol_map(seed, 6))
               for seed in seeds]
    start_ns = bagfile.read_world_questions(bags[0])["world"]["start_ns"]
    domain = h.new_domain()
    env = h.child_env(domain)
    import os  # noqa: PLC0415

    os.environ["ROS_DOMAIN_ID"] = str(domain)
    nodes = [h.start(h.node_command(ns, {"model_path": args.model, "policy": "fifo", "device": "cpu",
                                         "camera_topics": f"['{ns}/cam']", "pose_topic": f"{ns}/odom",
                                         "archive_path": str(work / f"archive{k}")}), env, work / f"node{k}.log")
             for k, ns in enumerate(ROBOTS)]
    records, fleet_ms, cold_ms, one_ms = [], [], [], []
    try:
        clients = [StreamCacheClient(ns, timeout=180.0) for ns in ROBOTS]
        shared = OwnParticipant("streamcache_fleet_bench")
        replays = [threading.Thread(target=lambda b=bag, ns=ns: h.subprocess.run(
            h.replay_command(b, ns), env=env, cwd=h.ROOT, check=True, timeout=h.GUARD_S)) for bag, ns in zip(bags, ROBOTS)]
        for t in replays:
            t.start()
        for t in replays:
            t.join()
        identities = [(s, c) for s in world.SHAPES for c in world.COLOUR_NAMES]
        for identity in identities:
            question = world.SEEN_PROBE.format(colour=identity[1], shape=identity[0])
            robots, frame = truth_of(streams, identity, args.frames)
            started = time.perf_counter()  # cold: a participant of its own, as a one-off call makes
            ask_fleet(question, "last", timeout_s=args.timeout, namespaces=list(ROBOTS))
            cold_ms.append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()  # warm: one participant kept, as a behaviour tree keeps it
            answer = ask_fleet(question, "last", timeout_s=args.timeout, namespaces=list(ROBOTS), participant=shared)
            fleet_ms.append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            clients[0].when(question, "last")
            one_ms.append((time.perf_counter() - started) * 1e3)
            best = answer.best
            record = {"identity": identity, "truth_robots": [ROBOTS[k] for k in robots], "truth_frame": frame,
                      "best": None if best is None else best.node, "no_answer": answer.no_answer,
                      "refused": answer.refused, "found_by": [e.node for e in answer.entries if e.found]}
            if frame is None:
                record["right"] = best is None
            elif best is not None and best.node in record["truth_robots"]:
                k = ROBOTS.index(best.node)
                truth_stamp = start_ns / 1e9 + frame
                x, y, _ = streams[k].pose(frame)
                record["stamp_off_s"] = best.stamp - truth_stamp
                record["pose_off_m"] = None if best.pose is None else math.hypot(best.pose.x - x, best.pose.y - y)
                record["right"] = (abs(record["stamp_off_s"]) <= WHEN_TOLERANCE_S and record["pose_off_m"] is not None
                                   and record["pose_off_m"] <= WHERE_TOLERANCE_M)
            else:
                record["right"] = False
            records.append(record)
        for client in clients:
            client.close()
        shared.close()
    finally:
        for node in nodes:
            h.stop(node)
    posed = [bagfile_posed(work / f"archive{k}") for k in range(len(ROBOTS))]
    seen = [r for r in records if r["truth_frame"] is not None]
    summary = {
        "questions": len(records), "seen_by_someone": len(seen), "nobody": len(records) - len(seen),
        "right": sum(r["right"] for r in records) / len(records),
        "right_seen": sum(r["right"] for r in seen) / max(1, len(seen)),
        "right_nobody": sum(r["right"] for r in records if r["truth_frame"] is None) / max(1, len(records) - len(seen)),
        "always_robot": {ns: sum(ns in r["truth_robots"] for r in records) / len(records) for ns in ROBOTS},
        "always_nobody": (len(records) - len(seen)) / len(records),
        "fleet_ms_median": statistics.median(fleet_ms), "fleet_ms_max": max(fleet_ms),
        "fleet_cold_ms_median": statistics.median(cold_ms),
        "one_node_when_ms_median": statistics.median(one_ms),
        "fleet_over_one_when": statistics.median(fleet_ms) / statistics.median(one_ms), "target": 0.9,
        "frames_archived_with_pose": [p[0] for p in posed], "frames_archived_without_pose": [p[1] for p in posed],
    }
    print(h.table([{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in summary.items() if k != "always_robot"}],
                  [k for k in summary if k != "always_robot"]))
    print("always one robot:", summary["always_robot"])
    path = h.write_json(args.out / f"fleet-{args.model}.json", {"machine": h.machine(), "model": args.model,
                                                                "frames": args.frames, "robots": list(ROBOTS),
                                                                "summary": summary, "records": records})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
