"""Node throughput: frames per second streamcache_node sustains from a bag replay, for each policy,
alone and while a client asks questions back to back; the question latency meanwhile.

    python bench/node_throughput.py                   # full, fifo, uniform, hermes, h2svc; 1200 frames each phase
    python bench/node_throughput.py --policies fifo --frames 80 --json /tmp/t.json

Real processes on a ROS domain of their own: the node (tiny Qwen2.5-VL unless --model), a lock-step
replay (every frame sampled: sample_fps = the bag's rate; nothing dropped, so the rate is what the
node takes in, limited by encoding, prefill and compression), and a client in this process. Phase 1
replays the bag alone; phase 2 replays a second bag (the next frames of the fixed world stream,
docs/world.md, with later stamps) while the client asks one question after another. Frames per second are counted from the node's frame
acknowledgements (first to last).

Frames kept during answers (docs/performance.md, "Frames kept during answers"): a live 10 fps camera
(a bag replayed at its own rate, not in lock step) sampled at ``sample_fps`` 2 while a client asks
``--answer-tokens`` (64) token questions back to back. A frame sampled while the ingest thread waits
for an answer waits in its camera's queue and is encoded after it; the node counts those
(``frames_waited``) and the frames it had to drop. Run with ``frame_queue_size`` 1 (one slot per
camera: the node before the queue) and 16 (the default).

Standing questions (docs/interfaces.md "Standing questions"): the same live camera at ``sample_fps``
2 with ``--watch-questions`` (two) asked over every chunk and no client: the frames dropped (the node
must keep up: none), the events published (one per question per chunk), and the standing
questions' time per chunk from the latency diagnostic beside the chunk's own. Prints tables; writes
bench/results/node_throughput.json.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import node_harness as h  # noqa: E402

NS = "/throughput"
CAM = "/throughput/cam"
POLICIES = ("full", "fifo", "uniform", "hermes", "h2svc")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--frames", type=int, default=1200, help="frames per phase (all are sampled)")
    p.add_argument("--fps", type=float, default=2.0, help="bag rate = sample_fps")
    p.add_argument("--model", default="tiny-qwen2_5_vl")
    p.add_argument("--budget-units", type=int, default=48, help="budget_tokens in stream units (fifo, uniform, hermes)")
    p.add_argument("--chunk-frames", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--answer-seconds", type=float, default=30.0, help="length of the answers phase's live camera")
    p.add_argument("--answer-tokens", type=int, default=64, help="answer length in the answers phase")
    p.add_argument("--queue-sizes", type=int, nargs="+", default=[1, 16], help="frame_queue_size values compared")
    p.add_argument("--phases", nargs="+", default=["throughput", "answers", "watch"],
                   choices=["throughput", "answers", "watch"])
    p.add_argument("--watch-questions", nargs="+", default=["Did you see a red circle?", "Did you see a blue square?"])
    p.add_argument("--watch-policy", default="hermes")
    p.add_argument("--json", type=pathlib.Path, default=h.RESULTS / "node_throughput.json")
    return p.parse_args(argv)


def ack_rate(acks: list[tuple[float, int]]) -> float:
    if len(acks) < 2:
        return float("nan")
    return (len(acks) - 1) / (acks[-1][0] - acks[0][0])


def measure(policy: str, args, bags, tokens_per_unit: int, work: pathlib.Path) -> dict:
    from streamcache_ros.client.client import StreamCacheClient  # noqa: PLC0415

    params = {"camera_topics": f"['{CAM}']", "policy": policy, "budget_tokens": args.budget_units * tokens_per_unit,
              "sample_fps": args.fps, "chunk_frames": args.chunk_frames, "max_new_tokens": args.max_new_tokens,
              "model_path": args.model, f"qos_overrides.{CAM}.subscription.reliability": "reliable"}
    domain = h.new_domain()
    env = h.child_env(domain)
    node = h.start(h.node_command(NS, params), env, work / f"node-{policy}.log")
    monitor = h.Monitor(domain, NS, node.pid)
    try:
        monitor.wait_for(lambda: monitor.statuses, 300, "the node's first memory_status")
        replay = h.start(h.replay_command(bags[0], NS, "--wait", "120"), env, work / f"replay1-{policy}.log")
        if replay.wait(timeout=h.GUARD_S * 3) != 0:
            raise RuntimeError(f"replay failed: see {work}/replay1-{policy}.log")
        alone = ack_rate(monitor.acks)
        first_ack = len(monitor.acks)
        latencies, ttfts, answered = [], [], 0
        with StreamCacheClient(NS, timeout=120, domain_id=domain) as client:
            replay = h.start(h.replay_command(bags[1], NS, "--wait", "120"), env, work / f"replay2-{policy}.log")
            done = threading.Event()
            threading.Thread(target=lambda: (replay.wait(), done.set()), daemon=True).start()
            monitor.wait_for(lambda: len(monitor.acks) > first_ack, 120, "the second replay's first frame")
            while not done.is_set():
                sent = time.monotonic()
                r = client.ask("What is on the table?", max_new_tokens=args.max_new_tokens, timeout=h.GUARD_S)
                if r.success:
                    answered += 1
                    latencies.append((time.monotonic() - sent) * 1e3)
                    ttfts.append(r.ttft_ms)
            if replay.returncode != 0:
                raise RuntimeError(f"replay failed: see {work}/replay2-{policy}.log")
        with_questions = ack_rate(monitor.acks[first_ack:])
        final = monitor.latest()
    finally:
        h.stop(node)
        monitor.close()
    return {"policy": policy, "frames per phase": args.frames,
            "ingest fps alone": round(alone, 2), "ingest fps with questions": round(with_questions, 2),
            "questions": answered,
            "latency p50 ms": round(statistics.median(latencies)) if latencies else None,
            "latency p90 ms": round(h.percentile(latencies, 90)) if latencies else None,
            "TTFT p50 ms": round(statistics.median(ttfts)) if ttfts else None,
            "frames in memory": final.frames_in_memory, "KV MiB": round(final.kv_bytes / 2**20, 2),
            "chunk ms (last)": round(final.encode_ms + final.prefill_ms + final.compress_ms)}


CAMERA_FPS, ANSWER_SAMPLE_FPS = 10.0, 2.0


def measure_answers(queue_size: int, args, bag, work: pathlib.Path) -> dict:
    """The answers phase with ``frame_queue_size`` = queue_size (see the module's docstring)."""
    from streamcache_ros.client.client import StreamCacheClient  # noqa: PLC0415

    params = {"camera_topics": f"['{CAM}']", "policy": "fifo", "budget_tokens": 480, "sample_fps": ANSWER_SAMPLE_FPS,
              "chunk_frames": args.chunk_frames, "max_new_tokens": args.answer_tokens, "model_path": args.model,
              "frame_queue_size": queue_size}
    domain = h.new_domain()
    env = h.child_env(domain)
    node = h.start(h.node_command(NS, params), env, work / f"node-answers-{queue_size}.log")
    monitor = h.Monitor(domain, NS, node.pid)
    answered, answer_ms = 0, []
    try:
        monitor.wait_for(lambda: monitor.statuses, 300, "the node's first memory_status")
        with StreamCacheClient(NS, timeout=120, domain_id=domain) as client:
            live = [sys.executable, "-m", "streamcache_ros.tools.replay", str(bag), "--rate", "1.0", "--quiet",
                    "--wait", "120"]  # a live camera: its own rate, no waiting for the node
            replay = h.start(live, env, work / f"replay-answers-{queue_size}.log")
            while replay.poll() is None:
                sent = time.monotonic()
                r = client.ask("Describe what you saw in detail.", max_new_tokens=args.answer_tokens, timeout=h.GUARD_S)
                if r.success:
                    answered += 1
                    answer_ms.append((time.monotonic() - sent) * 1e3)
            if replay.returncode != 0:
                raise RuntimeError(f"replay failed: see {work}/replay-answers-{queue_size}.log")
            time.sleep(3.0)  # the queued frames are encoded
            final = monitor.latest()
    finally:
        h.stop(node)
        monitor.close()
    return {"frame_queue_size": queue_size, "camera fps": CAMERA_FPS, "sample_fps": ANSWER_SAMPLE_FPS,
            "answer tokens": args.answer_tokens, "questions": answered,
            "answer ms p50": round(statistics.median(answer_ms)) if answer_ms else None,
            "frames received": final.frames_received, "frames sampled": final.frames_sampled,
            "frames kept during answers (waited)": final.frames_waited, "frames dropped": final.frames_dropped,
            "most frames waiting": final.most_frames_waiting, "chunks encoded": final.chunks_encoded}


def measure_watch(args, bag, work: pathlib.Path) -> dict:
    """The standing-questions phase (see the module's docstring)."""
    from streamcache_ros_interfaces.msg import WatchEvent  # noqa: PLC0415

    questions = "[" + ", ".join(f"'{q}'" for q in args.watch_questions) + "]"
    params = {"camera_topics": f"['{CAM}']", "policy": args.watch_policy, "sample_fps": ANSWER_SAMPLE_FPS,
              "chunk_frames": args.chunk_frames, "model_path": args.model, "watch_questions": questions}
    domain = h.new_domain()
    env = h.child_env(domain)
    node = h.start(h.node_command(NS, params), env, work / "node-watch.log")
    monitor = h.Monitor(domain, NS, node.pid)
    events, latency = [], []
    monitor.node.create_subscription(WatchEvent, f"{NS}/watch_events", events.append, 200)
    try:
        monitor.wait_for(lambda: monitor.statuses, 300, "the node's first memory_status")
        live = [sys.executable, "-m", "streamcache_ros.tools.replay", str(bag), "--rate", "1.0", "--quiet",
                "--wait", "120"]
        replay = h.start(live, env, work / "replay-watch.log")
        while replay.poll() is None:
            time.sleep(0.5)
            if monitor.latency:
                latency.append(dict(monitor.latency))
        if replay.returncode != 0:
            raise RuntimeError(f"replay failed: see {work}/replay-watch.log")
        time.sleep(3.0)  # the last chunk and its questions
        final = monitor.latest()
    finally:
        h.stop(node)
        monitor.close()

    def median_of(key):
        values = [float(d[key]) for d in latency if key in d and float(d.get("Chunks encoded", 0)) > 0]
        return round(statistics.median(values), 1) if values else None

    return {"policy": args.watch_policy, "camera fps": CAMERA_FPS, "sample_fps": ANSWER_SAMPLE_FPS,
            "standing questions": len(args.watch_questions), "frames sampled": final.frames_sampled,
            "frames dropped": final.frames_dropped, "chunks encoded": final.chunks_encoded,
            "events": len(events), "events per chunk": round(len(events) / max(final.chunks_encoded, 1), 2),
            "standing questions ms/chunk p50": median_of("Standing questions (ms, last chunk)"),
            "prefill ms/chunk p50": median_of("Prefill (ms, last chunk)"),
            "encode ms/chunk p50": median_of("Encode (ms, last chunk)"),
            "stream ms per chunk": median_of("Stream time per chunk (ms)")}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from streamcache_ros import world  # noqa: PLC0415
    from streamcache_ros.tools import bagfile  # noqa: PLC0415
    from streamcache_ros.engine import load_adapter  # noqa: PLC0415

    work = pathlib.Path(tempfile.mkdtemp(prefix="streamcache-throughput-"))
    period_ns = int(round(1e9 / args.fps))
    bags = [bagfile.make_bag(work / "bag1", frames=args.frames, fps=args.fps, topic=CAM),
            bagfile.make_bag(work / "bag2", frames=args.frames, fps=args.fps, topic=CAM, first_frame=args.frames,
                             start_ns=bagfile.DEFAULT_START_NS + args.frames * period_ns)]
    adapter = load_adapter(args.model, device="cpu", dtype="float32")
    tokens_per_unit = adapter.preprocess(list(world.world_frames(2))).tokens_per_unit
    rows, answers = [], []
    for policy in args.policies if "throughput" in args.phases else []:
        rows.append(measure(policy, args, bags, tokens_per_unit, work))
        print(f"[node_throughput] {policy}: {rows[-1]}", flush=True)
    if rows:
        print(h.table(rows, list(rows[0])))
    if "answers" in args.phases:
        frames = int(args.answer_seconds * CAMERA_FPS)
        live = bagfile.make_bag(work / "live", frames=frames, fps=CAMERA_FPS, topic=CAM)
        for size in args.queue_sizes:
            answers.append(measure_answers(size, args, live, work))
            print(f"[node_throughput] answers, frame_queue_size {size}: {answers[-1]}", flush=True)
        print(h.table(answers, list(answers[0])))
    watch = None
    if "watch" in args.phases:
        frames = int(args.answer_seconds * CAMERA_FPS)
        live = bagfile.make_bag(work / "live-watch", frames=frames, fps=CAMERA_FPS, topic=CAM)
        watch = measure_watch(args, live, work)
        print(h.table([watch], list(watch)))
    out = h.write_json(args.json, {"machine": h.machine(), "config": {**vars(args), "json": str(args.json)},
                                   "rows": rows, "answers": answers, "watch": watch})
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
