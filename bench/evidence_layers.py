"""Which layers' attention should define an answer's evidence: chosen on the world's training seeds.

    python bench/evidence_layers.py                                   # the bundled model, 40 streams
    python bench/evidence_layers.py --model world-qwen2_5_vl --streams 60 --write-model-file

The evidence of an answer is the frames its tokens attended to most, summed over heads and over a
set of layers (docs/interfaces.md "Time windows and evidence"). Which layers is a property of the
model, so it is chosen here on streams the accuracy benchmark never scores: world streams of the
training seeds (from 100 000 000; the benchmark's lie from 500 000 000, docs/world-models.md).
Every ``last_seen`` question (`When did you last see the {colour} {shape}?`, docs/world.md) whose
precondition holds is asked with the full cache, measuring every layer's attention mass at once;
then every contiguous range of layers is scored by how often its strongest frame lies within ±2 s
of the last frame the identity was in view, the benchmark's own rule. The best range wins (ties:
the fewest layers, then the earliest). Printed as a table; JSON to bench/reported/; with
``--write-model-file`` the choice also goes to the model's folder as ``evidence_layers.json``, which
the node reads when its ``evidence_layers`` parameter is empty.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import ROOT, free_text_unchecked, machine, table  # noqa: E402

from streamcache_ros import world  # noqa: E402

TRAINING_SEED = 100_000_000  # the trainer's stream seeds (docs/world-models.md); never scored
TOLERANCE_S = 2.0  # docs/world.md: last_seen is right within ±2 s
REPORTED = ROOT / "bench" / "reported"


def wilson(hits: int, n: int, z: float = 1.96) -> list[float]:
    if n == 0:
        return [0.0, 0.0]
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    return [round(max(0.0, centre - half), 3), round(min(1.0, centre + half), 3)]


def layer_ranges(num_layers: int) -> list[tuple[int, int]]:
    """Every contiguous range of layers (first, last)."""
    return [(a, b) for a in range(num_layers) for b in range(a, num_layers)]


def ask_stream(adapter, seed: int, frames: int, per_kind: int, size: tuple[int, int] | None) -> list[dict]:
    """One training-seed stream through a full-cache session; every last_seen question asked after
    half the stream and at its end. One record per question: the truth, and for every range of
    layers the stamp of its strongest frame (as the session ranks evidence)."""
    from streamcache_ros.engine import Session, SessionConfig, make_policy  # noqa: PLC0415

    layers = list(range(adapter.geometry().num_layers))
    points = [frames // 2, frames]
    look = None
    if size is not None:
        drawn = world.random_look(np.random.default_rng((seed, 0)))
        look = world.Look(**{**drawn.__dict__, "width": size[0], "height": size[1]})
    stream = world.make_stream(seed, frames, question_points=points, look=look)
    session = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=8, max_new_tokens=4,
                                                                  evidence_layers=tuple(layers)))
    records = []
    for i in range(frames):
        session.add_frame(stream.frame(i), stamp=stream.stamp(i))
        if i + 1 not in points or not stream.is_still(i + 1):
            continue
        for q in stream.questions(i + 1, np.random.default_rng((seed, i + 1, 5)), ("last_seen",), per_kind):
            session.ask(q.text)
            mass = session.last_attention_mass
            top = {f"{a}-{b}": session.rank_evidence(mass, k=1, layers=list(range(a, b + 1)))[0][0].stamp
                   for a, b in layer_ranges(len(layers))}
            records.append({"seed": seed, "after_frames": i + 1, "question": q.text,
                            "truth": stream.stamp(q.answer_frame),
                            "newest": stream.stamp(i),  # the recency baseline's answer
                            "top": top})
    return records


def score(records: list[dict], first: int, last: int) -> dict:
    key = f"{first}-{last}"
    hits = sum(abs(r["top"][key] - r["truth"]) <= TOLERANCE_S for r in records)
    return {"layers": list(range(first, last + 1)), "hits": hits, "n": len(records),
            "hit_rate": hits / len(records) if records else None, "ci95": wilson(hits, len(records))}


def choose(records: list[dict], num_layers: int) -> tuple[dict, list[dict], list[dict]]:
    singles = [score(records, layer, layer) for layer in range(num_layers)]
    ranges = [score(records, a, b) for a, b in layer_ranges(num_layers)]
    best = max(ranges, key=lambda s: (s["hits"], -len(s["layers"]), -s["layers"][0]))
    return best, singles, ranges


def main(argv=None) -> int:
    from streamcache_ros.engine import load_adapter  # noqa: PLC0415
    from streamcache_ros.engine.factory import EVIDENCE_LAYERS_FILE  # noqa: PLC0415
    from streamcache_ros.engine.adapters.models import DEFAULT_MODEL, resolve_model_path  # noqa: PLC0415
    from streamcache_ros.engine.session import default_evidence_layers  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--streams", type=int, default=40, help="training-seed streams")
    parser.add_argument("--frames", type=int, default=64,
                        help="frames per stream (questions after half of them and at the end)")
    parser.add_argument("--per-kind", type=int, default=3, help="last_seen questions per point at most")
    parser.add_argument("--size", default="", help="WxH for every stream (default: each seed's own, as drawn)")
    parser.add_argument("--write-model-file", action="store_true",
                        help=f"also write the choice to the model folder's {EVIDENCE_LAYERS_FILE}")
    parser.add_argument("--out", type=pathlib.Path, default=REPORTED)
    args = parser.parse_args(argv)
    size = tuple(int(x) for x in args.size.lower().split("x")) if args.size else None
    # it asks "When did you last see ...?" without options for the attention, which the world model refuses
    adapter = free_text_unchecked(load_adapter(args.model, device="cpu", dtype="float32"))
    num_layers = adapter.geometry().num_layers
    started, records = time.perf_counter(), []
    for i in range(args.streams):
        records += ask_stream(adapter, TRAINING_SEED + i, args.frames, args.per_kind, size)
    best, singles, ranges = choose(records, num_layers)
    middle = default_evidence_layers(num_layers)
    default = score(records, middle[0], middle[-1])
    recency = sum(abs(r["newest"] - r["truth"]) <= TOLERANCE_S for r in records)
    rows = [{"layers": " ".join(map(str, s["layers"])), "hit rate": f"{s['hit_rate']:.3f}",
             "95% CI": f"[{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]", "n": s["n"]}
            for s in singles + [default, best]]
    print(table(rows, [("layers", "layers"), ("hit rate", "hit rate"), ("95% CI", "95% CI"), ("n", "n")]))
    print(f"rows: each layer alone, then the default (the middle half), then the best contiguous range; "
          f"the newest frame before the question (recency) scores {recency / max(len(records), 1):.3f}")
    print(f"chosen: layers {best['layers']} ({best['hits']}/{best['n']} within ±{TOLERANCE_S:g} s)")
    name = pathlib.Path(args.model).name
    out = {"machine": machine("cpu"), "model": args.model, "seeds": [TRAINING_SEED, TRAINING_SEED + args.streams - 1],
           "frames": args.frames, "size": args.size or "each seed's own", "questions": len(records),
           "tolerance_s": TOLERANCE_S, "chosen": best, "default_middle_half": default, "per_layer": singles,
           "ranges": ranges, "recency_baseline": {"hits": recency, "n": len(records)},
           "seconds": round(time.perf_counter() - started)}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"evidence_layers-{name}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    if args.write_model_file:
        target = pathlib.Path(resolve_model_path(args.model)) / EVIDENCE_LAYERS_FILE
        target.write_text(json.dumps({"layers": best["layers"], "hit_rate": best["hit_rate"], "n": best["n"],
                                      "chosen_by": "bench/evidence_layers.py", "seeds": out["seeds"]}, indent=1) + "\n")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
