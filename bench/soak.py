"""Soak: a long bag replay into streamcache_node while two clients ask questions every few seconds.

    python bench/soak.py                       # 3000 frames at 20 frames/s, hermes, questions every ~3 s
    python bench/soak.py --frames 200 --question-period 1 --json /tmp/soak.json   # the short CI run

Everything is a real process on a ROS domain of its own: the node (tiny Qwen2.5-VL), a lock-step
replay at --rate times the recording (default 10: the 2 fps bag at 20 frames/s; nothing dropped:
each frame is acknowledged once the node has taken it, every frame is sampled), client 1 on the Ask service and client 2 on the Ask action, each question carrying a
unique id. Reported (table, and JSON in bench/results/soak.json):

- memory: the node's RSS and the cache's kv_bytes against frames received, slope in bytes per 1000
  frames after warm-up (from the first status at which the cache was full and a quarter of the stream
  had gone by);
- questions: sent, answered, refused, lost (no reply), answered twice (the node's questions_answered
  count against the answers the clients got; the ids kept in the memory's question history are
  unique and all were answered);
- ingest, by order and counters only: every frame acknowledged before a question was sent is in
  memory for it (newest_stamp), and a chunk that fell due never waited for more than the question
  in progress (the node counts the questions that ended while a due chunk waited; its "latency"
  diagnostic shows the most);
- shutdown: exit code after SIGINT, processes left.
Exits 1 when any of those checks fails.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import node_harness as h  # noqa: E402

NS = "/soak"
CAM = "/soak/cam"
QUESTION = "What is on the table?"
STAMP_SLACK_NS = 1000  # stamps pass through float seconds in the engine


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=3000, help="frames in the replayed bag (all are sampled)")
    p.add_argument("--fps", type=float, default=2.0, help="bag rate = sample_fps")
    p.add_argument("--rate", type=float, default=10.0, help="replay speed over the recording (lock-step still)")
    p.add_argument("--policy", default="hermes")
    p.add_argument("--budget-units", type=int, default=48, help="budget_tokens in stream units (fifo/uniform/hermes)")
    p.add_argument("--chunk-frames", type=int, default=8)
    p.add_argument("--question-period", type=float, default=3.0, help="seconds between a client's questions (mean)")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--json", type=pathlib.Path, default=h.RESULTS / "soak.json")
    # client mode (started by the driver)
    p.add_argument("--client", type=int, help=argparse.SUPPRESS)
    p.add_argument("--action", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stop-file", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- a client process -------------------------------------------------------------------------------
def client_main(args) -> int:
    import threading  # noqa: PLC0415

    from std_msgs.msg import Header  # noqa: PLC0415
    from rclpy.qos import QoSProfile, QoSReliabilityPolicy  # noqa: PLC0415

    from streamcache_ros.client.client import StreamCacheClient  # noqa: PLC0415

    stop_file, rng = pathlib.Path(args.stop_file), random.Random(args.client)
    taken = {"max": 0, "count": 0}
    lock = threading.Lock()

    def on_ack(msg):
        with lock:
            taken["max"] = max(taken["max"], h.stamp_ns(msg.stamp))
            taken["count"] += 1

    records = []
    with StreamCacheClient(NS, timeout=h.GUARD_S) as client:
        client.node.create_subscription(Header, f"{NS}/frame_acks", on_ack,
                                        QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE))
        while not stop_file.exists() and taken["count"] == 0:  # no question before the first frame
            time.sleep(0.05)
        n = 0
        while not stop_file.exists():
            deadline = time.monotonic() + args.question_period * rng.uniform(0.5, 1.5)
            while time.monotonic() < deadline and not stop_file.exists():
                time.sleep(0.05)
            if stop_file.exists():
                break
            n += 1
            qid = f"c{args.client}-q{n}"
            with lock:
                taken_before = taken["max"]
            record = {"id": qid, "taken_before_ns": taken_before, "sent": time.monotonic()}
            try:
                text = f"[{qid}] {QUESTION}"
                r = (client.ask_streaming(text, max_new_tokens=args.max_new_tokens, timeout=h.GUARD_S) if args.action
                     else client.ask(text, max_new_tokens=args.max_new_tokens, timeout=h.GUARD_S))
                record.update(received=time.monotonic(), success=bool(r.success), error=r.error_message,
                              newest_ns=h.stamp_ns(r.newest_stamp), frames=int(r.frames_in_memory),
                              ttft_ms=float(r.ttft_ms), total_ms=float(r.total_ms))
            except Exception as err:  # noqa: BLE001 - a lost question is a result, not a crash
                record.update(received=None, success=False, error=f"lost: {type(err).__name__}: {err}")
            records.append(record)
    pathlib.Path(args.out).write_text(json.dumps(records))
    return 0


# -- the driver -------------------------------------------------------------------------------------
def run(args) -> dict:
    from streamcache_ros import world  # noqa: PLC0415
    from streamcache_ros.tools import bagfile  # noqa: PLC0415
    from streamcache_ros.engine import load_adapter  # noqa: PLC0415

    work = pathlib.Path(tempfile.mkdtemp(prefix="streamcache-soak-"))
    bag = bagfile.make_bag(work / "bag", frames=args.frames, fps=args.fps, topic=CAM)
    tokens_per_unit = load_adapter("tiny-qwen2_5_vl", device="cpu", dtype="float32").preprocess(
        list(world.world_frames(2, height=120, width=160))).tokens_per_unit
    params = {"camera_topics": f"['{CAM}']", "policy": args.policy, "budget_tokens": args.budget_units * tokens_per_unit,
              "sample_fps": args.fps, "chunk_frames": args.chunk_frames, "max_new_tokens": args.max_new_tokens,
              "model_path": "tiny-qwen2_5_vl", "device": "cpu", "dtype": "float32", "snapshot_dir": str(work),
              # lock-step: no frame may be lost on the way (best effort can lose one under load)
              f"qos_overrides.{CAM}.subscription.reliability": "reliable"}
    domain = h.new_domain()
    env = h.child_env(domain)
    node = h.start(h.node_command(NS, params), env, work / "node.log")
    monitor = h.Monitor(domain, NS, node.pid)
    clients, result = [], {"config": {**vars(args), "json": str(args.json), "budget_tokens": params["budget_tokens"]},
                           "machine": h.machine()}
    try:
        monitor.wait_for(lambda: monitor.statuses, 300, "the node's first memory_status")
        first = monitor.statuses[-1][2]
        stop_file = work / "stop"
        for i in (1, 2):
            cmd = [sys.executable, __file__, "--client", str(i), "--stop-file", str(stop_file),
                   "--out", str(work / f"client{i}.json"), "--question-period", str(args.question_period),
                   "--max-new-tokens", str(args.max_new_tokens)] + (["--action"] if i == 2 else [])
            clients.append(h.start(cmd, env, work / f"client{i}.log"))
        started = time.monotonic()
        done = h.start(h.replay_command(bag, NS, "--wait", "120", rate=args.rate), env, work / "replay.log")
        replay_code = done.wait(timeout=h.GUARD_S * 6)
        replay_s = time.monotonic() - started
        stop_file.touch()
        client_codes = [c.wait(timeout=h.GUARD_S) for c in clients]
        final = monitor.latest()
        history = saved_history(domain, work / "memory.pt")
    finally:
        for c in clients:
            h.stop(c)
        before_stop = h.descendants(node.pid) | {node.pid}
        exit_code = h.stop(node)
        left = sorted(pid for pid in before_stop if h.alive(pid))
        monitor.close()
    records = [r for i in (1, 2) for r in json.loads((work / f"client{i}.json").read_text())]
    result.update(analyse(args, monitor, first, final, records, history, replay_s))
    result["processes"] = {"replay_exit": replay_code, "client_exits": client_codes, "node_exit_after_sigint": exit_code,
                           "processes_left": left, "work_dir": str(work)}
    failures = result["failures"]
    if replay_code != 0:
        failures.append(f"the replay exited with {replay_code} (see {work}/replay.log)")
    if any(client_codes) or exit_code != 0 or left:
        failures.append(f"clients {client_codes}, node exit {exit_code} after SIGINT, processes left {left}")
    result["ok"] = not failures
    return result


def saved_history(domain: int, path: pathlib.Path) -> list[str]:
    """The questions kept in the memory's history (save_memory, then the snapshot file)."""
    from streamcache_ros.client.client import StreamCacheClient  # noqa: PLC0415
    from streamcache_ros.engine.memory.snapshots import read_state  # noqa: PLC0415

    with StreamCacheClient(NS, timeout=60, domain_id=domain) as client:
        if not client.save(path.name).success:  # the node's snapshot_dir is the path's folder
            return []
    return [x["question"] for x in read_state(str(path))["history"]]


def analyse(args, monitor, first, final, records, history, replay_s) -> dict:
    failures = []
    answered = [r for r in records if r["success"]]
    lost = [r for r in records if r["received"] is None]
    refused = [r for r in records if not r["success"] and r["received"] is not None]
    node_answered = final.questions_answered - first.questions_answered
    ids = [q.split("]")[0].lstrip("[") for q in history]
    answered_ids = {r["id"] for r in answered}
    if lost or refused:
        failures.append(f"{len(lost)} question(s) lost, {len(refused)} refused: "
                        f"{sorted({r['error'][:80] for r in lost + refused})}")
    if node_answered != len(answered):
        failures.append(f"the node answered {node_answered} questions, the clients got {len(answered)} answers")
    if len(set(ids)) != len(ids) or not set(ids) <= answered_ids:
        failures.append(f"the memory's question history is not a set of answered ids: {ids}")

    # every frame acknowledged before a question was sent is in memory for it
    order_violations = [r["id"] for r in answered if r["newest_ns"] < r["taken_before_ns"] - STAMP_SLACK_NS]
    if order_violations:
        failures.append(f"frames taken before the question missing from its memory: {order_violations}")
    # ingest waits for the model only when a chunk is due; the node counts the questions that ended
    # while a due chunk waited (its "latency" diagnostic): 1 is the question in progress, never more
    waited = int(monitor.latency.get("Most questions a chunk waited for", "-1"))
    if not 0 <= waited <= 1:
        failures.append(f"a chunk waited for {waited} questions (latency diagnostic)")
    ack_times = [t for t, _ in monitor.acks]
    during = sum(1 for t in ack_times for r in answered if r["sent"] < t < r["received"])

    frames = {"published": args.frames, "received": final.frames_received - first.frames_received,
              "sampled": final.frames_sampled - first.frames_sampled,
              "dropped": final.frames_dropped - first.frames_dropped,
              "rejected": final.frames_rejected - first.frames_rejected,
              "acknowledged": len(monitor.acks), "in_memory": final.frames_in_memory,
              "chunks_encoded": final.chunks_encoded, "chunks_failed": final.chunks_failed}
    if frames["sampled"] != args.frames or frames["dropped"]:  # received counts a resent frame twice
        failures.append(f"frames: {frames}")

    memory = memory_figures(args, monitor.statuses)
    totals = [r["total_ms"] for r in answered]
    per_client = {c: sum(1 for r in records if r["id"].startswith(f"c{c}-")) for c in (1, 2)}
    return {
        "failures": failures,
        "frames": frames,
        "questions": {"sent": len(records), "answered": len(answered), "refused": len(refused), "lost": len(lost),
                      "answered_twice": max(0, node_answered - len(answered)), "node_answered": node_answered,
                      "per_client": per_client, "history_ids_checked": len(ids),
                      "total_ms_p50": round(statistics.median(totals), 1) if totals else None,
                      "total_ms_p90": round(h.percentile(totals, 90), 1) if totals else None,
                      "ttft_ms_p50": round(statistics.median(r["ttft_ms"] for r in answered), 1) if answered else None},
        "ingest": {"replay_s": round(replay_s, 1), "frames_per_s": round(args.frames / replay_s, 2),
                   "order_violations": len(order_violations), "most_questions_a_chunk_waited_for": waited,
                   "acks_while_a_question_ran": during,
                   "longest_pause_ms": round(max((b - a for a, b in zip(ack_times, ack_times[1:])), default=0) * 1e3)},
        "memory": memory,
    }


def memory_figures(args, statuses) -> dict:
    """Slopes of the node's RSS and the cache's kv_bytes over frames received, after warm-up."""
    samples = [(s.frames_received, rss, s.kv_bytes) for _, rss, s in statuses if rss]
    if not samples:
        return {}
    top = max(kv for _, _, kv in samples)
    full_at = next((f for f, _, kv in samples if kv == top), 0)  # budgeted policies: flat once full
    start = max(full_at, args.frames // 4)
    steady = [(f, rss, kv) for f, rss, kv in samples if f >= start]
    per_1000 = 1000.0
    return {"warmup_frames": start, "samples": len(steady),
            "rss_start_mib": round(samples[0][1] / 2**20, 1), "rss_end_mib": round(samples[-1][1] / 2**20, 1),
            "rss_after_warmup_mib": round(steady[0][1] / 2**20, 1) if steady else None,
            "rss_slope_bytes_per_1000_frames": round(h.slope([f for f, _, _ in steady], [r for _, r, _ in steady])
                                                     * per_1000) if len(steady) > 1 else None,
            "kv_bytes_final": samples[-1][2],
            "kv_slope_bytes_per_1000_frames": round(h.slope([f for f, _, _ in steady], [k for _, _, k in steady])
                                                    * per_1000) if len(steady) > 1 else None}


def report(result: dict) -> str:
    f, q, i, m = result["frames"], result["questions"], result["ingest"], result["memory"]
    rows = [
        {"what": "frames published / received / sampled / dropped / rejected",
         "value": f"{f['published']} / {f['received']} / {f['sampled']} / {f['dropped']} / {f['rejected']}"},
        {"what": "frames in memory at the end; chunks encoded / failed",
         "value": f"{f['in_memory']}; {f['chunks_encoded']} / {f['chunks_failed']}"},
        {"what": "questions sent / answered / refused / lost / answered twice",
         "value": f"{q['sent']} / {q['answered']} / {q['refused']} / {q['lost']} / {q['answered_twice']}"},
        {"what": "question latency p50 / p90 (ms), TTFT p50", "value": f"{q['total_ms_p50']} / {q['total_ms_p90']}, "
                                                                       f"{q['ttft_ms_p50']}"},
        {"what": "ingest: frames/s over the replay", "value": f"{i['frames_per_s']} ({i['replay_s']} s)"},
        {"what": "frames taken before a question missing from it", "value": i["order_violations"]},
        {"what": "most questions a due chunk waited for (node's count)", "value": i["most_questions_a_chunk_waited_for"]},
        {"what": "acknowledgements while a question ran", "value": i["acks_while_a_question_ran"]},
        {"what": "node RSS start / after warm-up / end (MiB)",
         "value": f"{m.get('rss_start_mib')} / {m.get('rss_after_warmup_mib')} / {m.get('rss_end_mib')}"},
        {"what": "RSS slope after warm-up (bytes / 1000 frames)", "value": m.get("rss_slope_bytes_per_1000_frames")},
        {"what": "kv_bytes slope after warm-up (bytes / 1000 frames)", "value": m.get("kv_slope_bytes_per_1000_frames")},
        {"what": "node exit after SIGINT; processes left",
         "value": f"{result['processes']['node_exit_after_sigint']}; {len(result['processes']['processes_left'])}"},
    ]
    return h.table(rows, ["what", "value"])


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.client is not None:
        code = client_main(args)
        # the records are written: skip the interpreter's teardown of rclpy and Fast DDS, which once
        # spun a client at full CPU after its last question (docs/reliability.md, the node does the same)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    result = run(args)
    print(report(result))
    print(f"\nwrote {h.write_json(args.json, result)}")
    for failure in result["failures"]:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
