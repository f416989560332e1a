"""`when` with encoders other than the bundled one (docs/archive.md "Calibrating the index"): how
often a present identity is answered "not found" without a flag, found wrongly, and what the
verifications cost.

    python bench/index_encoders.py                       # seven encoders, 6 held-out streams of 600 frames
    python bench/index_encoders.py --frames 240 --streams 1 --encoders bundled clip   # a quick look

Each encoder indexes the same held-out world streams (seeds from 540 000 000; three identities kept
out of each on purpose) in a session of the bundled Qwen world model with the archive (HERMES, the
node's defaults). The encoders: the bundled world-retrieval; a tiny random CLIP and a tiny random
SigLIP of real classes and configs; the bundled one with its bias set far off (-20) and with its
temperature set far off (scale / 20); an encoder trained here on half the identities
(bench/encoders/world-retrieval-half, scripts/train_retrieval_model.py --half-identities); and no
index at all (every `when` walks). Each is calibrated as the node calibrates it. Asked, over the whole stream and over windows of 120 frames:
`when` last for identities in view there (right within 2 s) and for identities absent there (right:
not found), half each.

Recorded per encoder: whether it is trusted and its calibration; for present identities the share
found right, found wrong (another moment), "not found" with search_complete true (silent: the
failure this guards against), "not found" flagged (search_complete false); for absent ones the
false "found"; chunks replayed and questions asked. Writes bench/results/index_encoders.json.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import time
from collections import Counter

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import ROOT, table, write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine import build_session  # noqa: E402
from streamcache_ros.engine.adapters.models import RETRIEVAL_DIR, WORLD_RETRIEVAL  # noqa: E402
from streamcache_ros.engine.recall.index import RetrievalEncoder  # noqa: E402
from streamcache_ros.tools.other_encoders import shifted_encoder, tiny_dual_encoder  # noqa: E402

SEED = 540_000_000
KEPT_OUT = 3
WINDOW = 120
ENCODERS = ("bundled", "clip", "siglip", "bias-off", "temperature-off", "half-identities", "none")


def encoder_folder(name: str, work: pathlib.Path) -> pathlib.Path | str:
    if name == "none":  # no index: every `when` walks
        return "off"
    if name == "bundled":
        return RETRIEVAL_DIR / WORLD_RETRIEVAL
    if name in ("clip", "siglip"):
        return tiny_dual_encoder(name, work / name)
    if name == "bias-off":
        return shifted_encoder(work / name, bias=-20.0)
    if name == "temperature-off":
        bundled = RetrievalEncoder.load(str(RETRIEVAL_DIR / WORLD_RETRIEVAL))
        return shifted_encoder(work / name, scale=bundled.settings.scale / 20)
    return ROOT / "bench" / "encoders" / "world-retrieval-half"


def held_out(seed: int, frames: int):
    return world.make_stream(seed, frames, look=world.random_look(np.random.default_rng((seed, 0))),
                             absent=world.kept_out(seed, KEPT_OUT))


def questions(stream, rng) -> list[tuple[str, tuple, int, int]]:
    """(kind, identity, first, last frame of the window): present and absent, half each, over the
    whole stream and over windows of WINDOW frames."""
    everything = [(s, c) for s in world.SHAPES for c in world.COLOUR_NAMES]
    n, out = len(stream), []
    spans = [(0, n - 1)] + [(first, first + WINDOW - 1) for first in range(0, n - WINDOW + 1, WINDOW)]
    for first, last in spans:
        inside = sorted({v.identity for f in stream.truth[first:last + 1] for v in f})
        outside = [i for i in everything if i not in inside]
        take = min(len(inside), len(outside), 3 if (first, last) == (0, n - 1) else 1)
        for i in rng.choice(len(inside), take, replace=False):
            out.append(("present", inside[int(i)], first, last))
        for i in rng.choice(len(outside), take, replace=False):
            out.append(("absent", outside[int(i)], first, last))
    return out


def run(name: str, folder: pathlib.Path, streams, work: pathlib.Path) -> tuple[dict, list[dict]]:
    records, calibration = [], {}
    for s, stream in enumerate(streams):
        session = build_session({"model_path": "world-qwen2_5_vl", "archive_path": str(work / f"archive-{name}-{s}"),
                                 "retrieval_model_path": str(folder)})
        for i in range(len(stream)):
            session.add_frame(stream.frame(i), stream.stamp(i))
        session.flush()
        index = session.status().index
        calibration = {"identity": "", "trusted": False, "description": "no index: the walk"} if index is None else {
            "identity": index.identity, "trusted": index.trusted, "description": index.description,
            "recall": index.recall, "false_yes": index.false_yes}
        for kind, identity, first, last in questions(stream, np.random.default_rng((stream.seed, 5))):
            started = time.perf_counter()
            found = session.when(world.SEEN_PROBE.format(shape=identity[0], colour=identity[1]), "last",
                                 since=stream.stamp(first), until=stream.stamp(last))
            ms = (time.perf_counter() - started) * 1e3
            frames = [i for i in range(first, last + 1) if identity in {v.identity for v in stream.truth[i]}]
            records.append({"encoder": name, "stream": s, "kind": kind, "window": last - first + 1,
                            "found": found.found, "right": (found.found and abs(found.stamp - stream.stamp(frames[-1])) <= 2)
                            if frames else not found.found, "complete": found.search_complete,
                            "found_by": found.found_by, "candidates": found.index_candidates,
                            "replayed": found.recalled_chunks, "asked": found.questions_asked, "ms": ms})
        session.close_archive()
    return calibration, records


def summarise(records: list[dict]) -> dict:
    present = [r for r in records if r["kind"] == "present"]
    absent = [r for r in records if r["kind"] == "absent"]
    mean = lambda rows, key: round(float(np.mean([key(r) for r in rows])), 3) if rows else None  # noqa: E731
    return {"present": len(present), "absent": len(absent),
            "found_right": mean(present, lambda r: r["right"]),
            "found_wrong_moment": mean(present, lambda r: r["found"] and not r["right"]),
            "not_found_silent": mean(present, lambda r: not r["found"] and r["complete"]),
            "not_found_flagged": mean(present, lambda r: not r["found"] and not r["complete"]),
            "false_found": mean(absent, lambda r: r["found"]),
            "absent_flagged": mean(absent, lambda r: not r["found"] and not r["complete"]),
            "always_found_would_score": round(len(present) / max(len(records), 1), 3),
            "never_found_would_score": round(len(absent) / max(len(records), 1), 3),
            "accuracy": mean(records, lambda r: r["right"]),
            "replayed_median": float(np.median([r["replayed"] for r in records])) if records else None,
            "replayed_mean": mean(records, lambda r: r["replayed"]),
            "replayed_max": max((r["replayed"] for r in records), default=0),
            "found_by": dict(sorted(Counter(r["found_by"] for r in records).items()))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoders", nargs="+", default=list(ENCODERS), choices=ENCODERS)
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    work = pathlib.Path(tempfile.mkdtemp(prefix="index-encoders-"))
    streams = [held_out(SEED + s, args.frames) for s in range(args.streams)]
    started, results, records = time.perf_counter(), {}, []
    try:
        for name in args.encoders:
            calibration, got = run(name, encoder_folder(name, work), streams, work)
            results[name] = {"calibration": calibration, **summarise(got)}
            records += got
            print(f"{name}: done, {time.perf_counter() - started:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [{"encoder": name, "trusted": r["calibration"]["trusted"], **{k: r[k] for k in (
        "found_right", "found_wrong_moment", "not_found_silent", "not_found_flagged", "false_found", "accuracy",
        "replayed_median", "replayed_max")}} for name, r in results.items()]
    print(table(rows, [(k, k) for k in rows[0]]))
    path = write_json("index_encoders", {"frames": args.frames, "streams": args.streams, "seeds_from": SEED,
                                         "kept_out": KEPT_OUT, "window": WINDOW, "results": results,
                                         "records": records, "wall_s": round(time.perf_counter() - started, 1)},
                      args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
