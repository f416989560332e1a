"""Does a world model bind colour to shape, and compare two moments? Held-out streams, full cache.

    python bench/comparisons.py                                   # the bundled world models
    python bench/comparisons.py --models world-qwen2_5_vl world-wide-qwen2_5_vl --streams 60

Per model, over ``--streams`` held-out world streams of ``--frames`` frames (seeds from 500 000 000,
bench/accuracy.py's; no training run draws them), each fed whole to a full-cache Session at the
node's defaults (`sample_fps` 1.0, `chunk_frames` 8), then asked with options:

- ``moved@window`` / ``before_color@window``: the comparison over a short window around one move or
  one recolour (``world.comparison_questions``: the event's frames and up to 3 on either side),
  answered from the window's frames (``since`` / ``until``): the two moments and little else;
- ``moved`` / ``before_color``: the same kinds over the whole stream;
- ``hard_negative_false_yes``: over 8-frame windows at random places (4 a stream), `seen` about an
  identity absent from the window that shares its colour or its shape with one in view
  (``world.ask_seen_hard_negative``), the share answered yes (target <= 0.05);
- ``seen@8``: windowed `seen` over the same windows (target >= 0.95).

Targets (docs/world-models.md "Hard negatives", "Comparisons"): the comparisons >= 0.85 at 32 frames.
Output: bench/results/comparisons.json (``--name``), every answer kept.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import accuracy  # noqa: E402
from common import RESULTS, table, write_json  # noqa: E402
from policy_diagnosis import window_checks  # noqa: E402

from streamcache_ros import world  # noqa: E402

HELD_OUT = 500_000_000
WINDOWS = 4
COMPARED = ("moved", "before_color")


def ask(session, stream, q, window=None):
    since, until = (stream.stamp(window[0]), stream.stamp(window[1])) if window else (None, None)
    answer = session.ask(q.text, q.options, since=since, until=until)
    said = q.options[answer.option_index] if answer.option_index >= 0 else ""
    return {"question": q.text, "truth": q.answer, "said": said, "correct": answer.option_index == q.answer_index}


def one_stream(adapter, seed: int, frames: int) -> list[dict]:
    from streamcache_ros.engine import Session, SessionConfig, make_policy  # noqa: PLC0415
    stream = world.make_stream(seed, frames)
    session = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=8))
    for i in range(frames):
        session.add_frame(stream.frame(i), stamp=stream.stamp(i))
    rng = np.random.default_rng((seed, 11))
    out = []
    for q in world.comparison_questions(stream, frames, rng):
        out.append({"kind": f"{q.kind}@window", **ask(session, stream, q, q.window)})
    for q in stream.questions(frames, rng, COMPARED):
        out.append({"kind": q.kind, **ask(session, stream, q)})
    out += window_checks(session, stream, frames, WINDOWS, rng)  # hard negatives and seen@8, as the diagnosis asks
    return [{"seed": seed, **r} for r in out]


def summarise(records: list[dict]) -> dict:
    groups = defaultdict(list)
    for r in records:
        groups[r["kind"]].append(r)
    out = {}
    for kind, rows in sorted(groups.items()):
        if kind == "seen_hard":  # the share answered yes, which is wrong here
            hits = sum(r["said_yes"] for r in rows)
            out["hard_negative_false_yes"] = {"n": len(rows), "rate": hits / len(rows),
                                              "ci95": accuracy.wilson(hits, len(rows))}
        else:
            hits = sum(r["correct"] for r in rows)
            out[kind] = {"n": len(rows), "accuracy": hits / len(rows), "ci95": accuracy.wilson(hits, len(rows))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["world-qwen2_5_vl", "world-llava_onevision"])
    parser.add_argument("--streams", type=int, default=60)
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--name", default="comparisons")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()

    started = time.perf_counter()
    results, rows = {}, []
    for name in args.models:
        adapter = accuracy.load(name)
        records = []
        for k in range(args.streams):
            records += one_stream(adapter, HELD_OUT + k, args.frames)
        summary = summarise(records)
        results[pathlib.Path(name).name] = {"summary": summary, "records": records}
        row = {"model": pathlib.Path(name).name}
        for kind, cell in summary.items():
            value = cell.get("accuracy", cell.get("rate"))
            row[kind] = f"{value:.2f} ({cell['n']})"
        rows.append(row)
        print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)
    kinds = ["moved@window", "before_color@window", "moved", "before_color", "hard_negative_false_yes", "seen@8"]
    print(table(rows, [("model", "model"), *[(k, k) for k in kinds]]))
    path = write_json(args.name, {"frames": args.frames, "streams": args.streams, "first_seed": HELD_OUT,
                                  "seconds": round(time.perf_counter() - started), "models": results}, args.out)
    print(path)


if __name__ == "__main__":
    main()
