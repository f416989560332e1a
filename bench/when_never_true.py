"""A ``when`` that is never true, over a long archive, while a live camera streams at 2 Hz: the frames
the node drops meanwhile (target 0), with the index and without it (docs/archive.md "Questions never
stop the cameras").

    python bench/when_never_true.py                          # an hour archived, 40 live frames
    python bench/when_never_true.py --archived 600 --live 20 # a quick look

Real processes on a ROS domain of their own (bench/node_harness.py). An archive of ``--archived``
frames of a held-out world stream (the first from seed 510 000 000 that leaves an identity unseen) is written once by the engine with the bundled
world model and its index, as a node that ran that long leaves it; each configuration starts
streamcache_node on a copy of it: ``index`` (retrieval_model_path auto: retrieve, then verify) and
``walk`` (retrieval_model_path '': every archived chunk replayed in time order). A bag of ``--live``
frames (1 s apart) plays at twice its rate, not in lock step, as a camera publishes, while a client
asks "Did you see a {colour} {shape}?", mode ``first``, over the longest window in which that identity
is never in view (every identity shows up somewhere in an hour), one after another until the bag
ends. Recorded: the frames sampled and dropped (memory_status), the
``when`` replies (found, found_by, recalled chunks) and their wall time.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import node_harness as h  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.tools import bagfile  # noqa: E402

NS = "/never_true"
CAM = "/never_true/cam"
SEED = 510_000_000
S = 1_000_000_000
LOOK = world.Look(320, 240, (40, 50, 60), 4, 10, False, "rgb8")
MODEL = "world-qwen2_5_vl"


def write_archive(folder: pathlib.Path, frames: int) -> tuple[str, tuple[float, float], float]:
    """The archive of ``frames`` frames; a question never true over the longest window in which one
    identity is never in view (over an hour every identity shows up somewhere: the longest gap of
    one is the longest never-true window), that window's stamps; the seconds it took."""
    from streamcache_ros.engine import build_session  # noqa: PLC0415

    stream = world.make_long_stream(SEED, frames, look=LOOK)
    session = build_session({"model_path": MODEL, "archive_path": str(folder), "camera_topics": [CAM]})
    started = time.perf_counter()
    for i in range(frames):
        session.add_frame(stream.frame(i), stream.stamp(i) + bagfile.DEFAULT_START_NS / S, camera=CAM)
    session.flush()
    session.close_archive()
    best = (0, None, 0, 0)
    for shape in world.SHAPES:
        for colour in world.COLOUR_NAMES:
            seen = [-1] + stream.identity_frames((shape, colour), frames) + [frames]
            gap, first = max((b - a - 1, a + 1) for a, b in zip(seen, seen[1:]))
            if gap > best[0]:
                best = (gap, (shape, colour), first, first + gap - 1)
    _, (shape, colour), first, last = best
    offset = bagfile.DEFAULT_START_NS / S
    return (world.SEEN_PROBE.format(shape=shape, colour=colour), (stream.stamp(first) + offset, stream.stamp(last) + offset),
            time.perf_counter() - started)


def run(config: str, archive: pathlib.Path, live_bag: pathlib.Path, question: str, window: tuple[float, float],
        live: int, work: pathlib.Path) -> dict:
    from streamcache_ros.client import StreamCacheClient  # noqa: PLC0415

    domain = h.new_domain()
    env = h.child_env(domain)
    copy = work / f"archive-{config}"
    shutil.copytree(archive, copy)
    params = {"model_path": MODEL, "camera_topics": f"['{CAM}']", "archive_path": str(copy), "sample_fps": 1.0,
              "retrieval_model_path": "auto" if config == "index" else "''"}
    node = h.start(h.node_command(NS, params), env, work / f"node-{config}.log")
    monitor = h.Monitor(domain, NS, node.pid)
    replies, times = [], []
    client = None
    try:
        client = StreamCacheClient(NS, timeout=h.GUARD_S, domain_id=domain)  # waits for the node
        before = monitor.latest()
        player = h.start([sys.executable, "-m", "streamcache_ros.tools.replay", str(live_bag), "--rate", "2",
                          "--quiet"], env, work / f"replay-{config}.log")
        while player.poll() is None:
            started = time.perf_counter()
            replies.append(client.when(question, "first", since=window[0], until=window[1], timeout=h.GUARD_S))
            times.append((time.perf_counter() - started) * 1e3)
        deadline = time.monotonic() + 60  # the last frames through the queue, and a status after them
        after = monitor.latest()
        while after.frames_sampled - before.frames_sampled < live and time.monotonic() < deadline:
            after = monitor.latest()
    finally:
        if client is not None:
            client.close()
        monitor.close()
        h.stop(node)
    return {"config": config, "whens": len(replies), "when_ms_median": round(statistics.median(times), 1) if times else None,
            "when_ms_max": round(max(times), 1) if times else None,
            "found": sum(r.found for r in replies), "found_by": sorted({r.found_by for r in replies}),
            "recalled_chunks_max": max((r.recalled_chunks for r in replies), default=0),
            "frames_in_window": replies[0].frames_in_window if replies else 0,
            "frames_sampled": after.frames_sampled - before.frames_sampled,
            "frames_dropped": after.frames_dropped - before.frames_dropped, "live_frames": live}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archived", type=int, default=3600)
    parser.add_argument("--live", type=int, default=40)
    parser.add_argument("--configs", nargs="+", default=["index", "walk"], choices=["index", "walk"])
    parser.add_argument("--json", type=pathlib.Path, default=h.RESULTS / "when_never_true.json")
    args = parser.parse_args(argv)
    work = pathlib.Path(tempfile.mkdtemp(prefix="never-true-"))
    try:
        archive = work / "archive"
        question, window, write_s = write_archive(archive, args.archived)
        live_bag = bagfile.make_world_bag(work / "live", SEED + 7, args.live, look=LOOK, topic=CAM,
                                          start_ns=bagfile.DEFAULT_START_NS + (args.archived + 100) * S)
        rows = [run(config, archive, live_bag, question, window, args.live, work) for config in args.configs]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(h.table(rows, ["config", "whens", "when_ms_median", "when_ms_max", "found", "found_by", "recalled_chunks_max",
                         "frames_in_window", "frames_sampled", "frames_dropped"]))
    path = h.write_json(args.json, {"machine": h.machine(), "model": MODEL, "archived_frames": args.archived,
                                    "question": question, "window_s": [round(w, 1) for w in window],
                                    "window_frames": int(window[1] - window[0]) + 1, "archive_write_s": round(write_s, 1), "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
