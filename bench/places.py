"""Where, measured (docs/places.md): held-out patrol streams through a Session with its archive and
index, the robot's pose fed with every frame, then asked where it last saw each identity, and whether
it saw it in each place.

    python bench/places.py                                   # an hour, Qwen world model
    python bench/places.py --frames 600                      # a quick look
    python bench/places.py --model world-llava_onevision --out bench/reported

The patrol stream (docs/world.md "The patrol world": seeds from 520 000 000, held out) keeps three
identities out of view for the whole stream, so every place has "no" to ask. At the end of the
stream, for every identity:

- ``where_last``: ``when`` (mode last) anywhere; right when the pose of the frame found lies within
  1 m of the robot's true pose at the identity's last sighting, or in the same named place. Beside it,
  what a guess scores: the place the robot spent most frames in.
- ``seen_in_place``: "Did you see a {colour} {shape}?" limited to each named place, yes or no;
  positives (seen there) and negatives (never seen there, kept-out identities included) counted
  apart, with what always-yes and always-no score on the same mix.
- ``when_in_place``: ``when`` (mode last) limited to each place the identity was seen in: right
  within 2 s of its last sighting there.
- ``place_cost``: each ``when`` limited to a place against the same question with none, and one
  plain ask on the working memory, in ms and as ratios.
- ``pose_bytes``: the bytes the archive's poses take, per hour of stream.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time
from collections import Counter

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import table, write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine import Place, Pose, PoseTrack, build_session  # noqa: E402

SEED = 520_000_000
KEPT_OUT = 3
WHERE_TOLERANCE_M = 1.0
WHEN_TOLERANCE_S = 2.0
POSE_PHASE_S = 0.13  # odometry stamped off the frames, as a robot's is: each frame's pose is interpolated
YES_NO = ["yes", "no"]


def feed(session, stream, track: PoseTrack) -> float:
    """Every frame into the session with the robot's pose around its stamp (4 Hz); the ms per frame."""
    started = time.perf_counter()
    for i in range(len(stream)):
        stamp = stream.stamp(i)
        for t in (stamp - 1 + POSE_PHASE_S + k / 4 for k in range(4)):
            if t > (track.newest_stamp if track.newest_stamp is not None else -1e9):
                x, y, yaw = stream.pose_at(t - stream.stamp(0))
                track.add(t, Pose.planar(x, y, yaw, world.MAP_FRAME))
        x, y, yaw = stream.pose_at(stamp + POSE_PHASE_S - stream.stamp(0))
        track.add(stamp + POSE_PHASE_S, Pose.planar(x, y, yaw, world.MAP_FRAME))
        session.add_frame(stream.frame(i), stamp)
    session.flush()
    return (time.perf_counter() - started) * 1e3 / len(stream)


def timed(call):
    started = time.perf_counter()
    result = call()
    return result, (time.perf_counter() - started) * 1e3


def probe(identity) -> str:
    return world.SEEN_PROBE.format(colour=identity[1], shape=identity[0])


def run_stream(model: str, seed: int, frames: int, folder: pathlib.Path, places_count: int) -> dict:
    absent = world.kept_out(seed, KEPT_OUT)
    places = world.patrol_map(seed, places_count)
    stream = world.make_long_patrol_stream(seed, frames, absent=absent, places=places)
    session = build_session({"model_path": model, "policy": "fifo", "archive_path": str(folder / f"archive-{seed}"),
                             "archive_max_bytes": 64 << 30})
    session.memory.poses = track = PoseTrack(tolerance=0.5)
    ms_per_frame = feed(session, stream, track)
    n = len(stream)
    visits = Counter(stream.place_at(i) for i in range(n) if stream.place_at(i) is not None)
    busiest = visits.most_common(1)[0][0]
    identities = [(s, c) for s in world.SHAPES for c in world.COLOUR_NAMES]
    records = []
    _, ask_ms = timed(lambda: session.ask("How many objects are in view now?", ["0", "1", "2"]))
    for identity in identities:
        last = stream.last_seen(identity, n)
        found, plain_ms = timed(lambda: session.when(probe(identity), "last"))
        if last is not None:
            tx, ty, _ = stream.pose(last)
            pose = found.pose
            near = pose is not None and bool(np.hypot(pose.x - tx, pose.y - ty) <= WHERE_TOLERANCE_M)
            same_place = pose is not None and stream.place_at(last) is not None and any(
                p.name == stream.place_at(last) and np.hypot(pose.x - p.x, pose.y - p.y) <= p.radius for p in places)
            records.append({"kind": "where_last", "identity": identity, "found": found.found,
                            "right": bool(found.found and (near or same_place)), "within_1m": bool(found.found and near),
                            "guess_right": stream.place_at(last) == busiest, "ms": plain_ms,
                            "error_m": None if pose is None else float(np.hypot(pose.x - tx, pose.y - ty))})
        else:
            records.append({"kind": "where_never_seen", "identity": identity, "right": not found.found, "ms": plain_ms})
        for place in places:
            asked = Place(place.x, place.y, place.radius, place.name, world.MAP_FRAME)
            seen_there = stream.last_seen(identity, n, place.name)
            try:
                answer, ask_place_ms = timed(lambda: session.ask(probe(identity), YES_NO, where=asked))
            except Exception as err:  # noqa: BLE001 - a refusal is recorded, never the end of the run
                records.append({"kind": "seen_in_place", "identity": identity, "place": place.name, "refused": str(err),
                                "truth_yes": seen_there is not None, "right": False})
                continue
            records.append({"kind": "seen_in_place", "identity": identity, "place": place.name,
                            "truth_yes": seen_there is not None, "said_yes": answer.text == "yes",
                            "right": (answer.text == "yes") == (seen_there is not None), "ms": ask_place_ms,
                            "frames_in_place": answer.frames_in_place, "frames_in_window": answer.frames_in_window,
                            "complete": answer.search_complete})
            if seen_there is not None:
                found_there, place_ms = timed(lambda: session.when(probe(identity), "last", where=asked))
                records.append({"kind": "when_in_place", "identity": identity, "place": place.name,
                                "found": found_there.found, "ms": place_ms, "plain_ms": plain_ms,
                                "right": bool(found_there.found and abs(found_there.stamp - stream.stamp(seen_there))
                                              <= WHEN_TOLERANCE_S)})
    posed, pose_bytes = session.memory.archive.pose_counts()
    status = session.status()
    session.close_archive()
    return {"seed": seed, "frames": n, "places": [p.name for p in places], "kept_out": list(absent),
            "busiest_place": busiest, "ms_per_frame": ms_per_frame, "ask_ms": ask_ms, "records": records,
            "frames_posed": posed, "frames_without_pose": track.frames_without, "pose_bytes": pose_bytes,
            "archive_bytes": status.archive.bytes if status.archive else 0}


def share(values) -> float | None:
    values = list(values)
    return float(np.mean(values)) if values else None


def summarise(streams: list[dict]) -> dict:
    records = [r for s in streams for r in s["records"]]
    of = lambda kind: [r for r in records if r["kind"] == kind]  # noqa: E731
    where, in_place, when_in = of("where_last"), of("seen_in_place"), of("when_in_place")
    negatives = [r for r in in_place if not r["truth_yes"]]
    positives = [r for r in in_place if r["truth_yes"]]
    yes_share = len(positives) / len(in_place) if in_place else None
    right = share(r["right"] for r in in_place)
    place_ms = [r["ms"] for r in when_in]
    plain_ms = [r["plain_ms"] for r in when_in]
    ask_ms = share(s["ask_ms"] for s in streams)
    hours = sum(s["frames"] for s in streams) / 3600
    return {
        "where_last": {"n": len(where), "right": share(r["right"] for r in where),
                       "within_1m": share(r["within_1m"] for r in where),
                       "guess_busiest_place": share(r["guess_right"] for r in where),
                       "median_error_m": float(np.median([r["error_m"] for r in where if r["error_m"] is not None]))
                       if any(r["error_m"] is not None for r in where) else None,
                       "target": 0.9},
        "where_never_seen": {"n": len(of("where_never_seen")), "right": share(r["right"] for r in of("where_never_seen"))},
        "seen_in_place": {"n": len(in_place), "right": right, "negatives": len(negatives),
                          "negatives_right": share(r["right"] for r in negatives), "positives": len(positives),
                          "positives_right": share(r["right"] for r in positives),
                          "always_yes": yes_share, "always_no": None if yes_share is None else 1 - yes_share,
                          "margin_over_better_baseline": None if right is None else right - max(yes_share, 1 - yes_share),
                          # the mix leans to "no" (most identities are at one place): each side weighed alike too
                          "balanced": None if not positives or not negatives else
                          (share(r["right"] for r in positives) + share(r["right"] for r in negatives)) / 2,
                          "refused": sum("refused" in r for r in in_place),
                          "incomplete": sum(not r.get("complete", True) for r in in_place),
                          "negatives_target": 0.95},
        "when_in_place": {"n": len(when_in), "right": share(r["right"] for r in when_in), "target": 0.85},
        "place_cost": {"when_in_place_ms": float(np.median(place_ms)) if place_ms else None,
                       "when_anywhere_ms": float(np.median(plain_ms)) if plain_ms else None,
                       "ask_ms": ask_ms,
                       "place_over_anywhere": float(np.median(np.asarray(place_ms) / np.asarray(plain_ms)))
                       if place_ms else None,
                       "place_in_asks": float(np.median(place_ms) / ask_ms) if place_ms and ask_ms else None},
        "pose_bytes": {"per_hour": sum(s["pose_bytes"] for s in streams) / hours,
                       "per_frame": sum(s["pose_bytes"] for s in streams) / max(1, sum(s["frames_posed"] for s in streams)),
                       "share_of_archive": sum(s["pose_bytes"] for s in streams) / max(1, sum(s["archive_bytes"]
                                                                                             for s in streams)),
                       "frames_without_pose": sum(s["frames_without_pose"] for s in streams)},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="world-qwen2_5_vl")
    parser.add_argument("--frames", type=int, default=3600)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--places", type=int, default=6)
    parser.add_argument("--out", type=pathlib.Path, default=None, help="where the JSON goes (default bench/results)")
    parser.add_argument("--name", default="")
    args = parser.parse_args(argv)
    streams = []
    with tempfile.TemporaryDirectory() as folder:
        for k in range(args.streams):
            seed = SEED + 1_000 * k + args.frames
            streams.append(run_stream(args.model, seed, args.frames, pathlib.Path(folder), args.places))
            print(f"stream {seed}: {args.frames} frames, {streams[-1]['ms_per_frame']:.1f} ms a frame", flush=True)
    summary = summarise(streams)
    rows = [{"what": k, **{m: (f"{v:.3f}" if isinstance(v, float) else v) for m, v in s.items()
                           if m in ("n", "right", "balanced", "negatives_right", "positives_right", "always_yes", "always_no",
                                    "guess_busiest_place", "median_error_m")}} for k, s in summary.items()
            if k not in ("place_cost", "pose_bytes")]
    print(table(rows, [(c, c) for c in ("what", "n", "right", "balanced", "negatives_right", "positives_right", "always_yes",
                                          "always_no", "guess_busiest_place", "median_error_m")]))
    print("place cost:", summary["place_cost"])
    print("pose bytes:", summary["pose_bytes"])
    name = args.name or f"places-{args.model}-{args.frames}"
    path = write_json(name, {"model": args.model, "frames": args.frames, "streams": args.streams,
                             "summary": summary, "runs": streams}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
