"""Free text against options on held-out shape-world streams (docs/interfaces.md "Free-text answers").

    python bench/free_text.py                                   # the bundled world models
    python bench/free_text.py --models world-qwen2_5_vl <v3 folder>
    # v3, from before v4 was bundled:
    #   git archive 338cb84^ streamcache_ros/models/world-qwen2_5_vl | tar -x -C data/models-v3

Every world question whose precondition holds (world.OPTION_KINDS) is asked twice of the same
memory (full cache, the node's defaults: `sample_fps` 1.0, `chunk_frames` 8): without its options,
then with them. Per model and kind:

- ``option``: the share of option questions whose `option_index` is the true option;
- ``free``: the share of free-text answers that are the true option's words (case and end
  punctuation aside);
- ``right_kind``: the share of free-text answers that are a word of the kind the question asks for
  (engine/questions/answer_kinds.py, against the bundled world models' vocabulary, whatever the model's own
  folder declares, so that models without the declaration are judged alike);
- ``free_over_option``: free / option. The targets: free >= 0.9 of option, right kind >= 0.95.

Streams are seeded from 500 000 000 (bench/accuracy.py's held-out seeds; training draws from
100 000 000). JSON with every answer to bench/results/free_text.json (``--name``).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import ROOT, table, write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine import QuestionError, Session, SessionConfig, load_adapter, make_policy  # noqa: E402
from streamcache_ros.engine.adapters import read_model_settings  # noqa: E402
from streamcache_ros.engine.questions.answer_kinds import AnswerVocabulary, question_kind  # noqa: E402
from streamcache_ros.engine.adapters.models import resolve_model_path  # noqa: E402

ACCURACY_SEED = 500_000_000
MODELS = ("world-qwen2_5_vl", "world-llava_onevision")
TARGET_RATIO, TARGET_KIND = 0.9, 0.95


def world_vocabulary() -> AnswerVocabulary:
    return AnswerVocabulary.from_settings(read_model_settings(resolve_model_path("world-qwen2_5_vl")))


def run_model(model: str, streams: int, frames: int, points: list[int], vocabulary: AnswerVocabulary) -> list[dict]:
    adapter = load_adapter(model, device="cpu", dtype="float32")
    records = []
    for k in range(streams):
        seed = ACCURACY_SEED + k
        stream = world.make_stream(seed, frames, question_points=points)
        session = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=8))
        for i in range(frames):
            session.add_frame(stream.frame(i), stamp=stream.stamp(i))
            n = i + 1
            if n not in points:
                continue
            for q in stream.questions(n, np.random.default_rng((seed, n, 3)), world.OPTION_KINDS):
                expected = question_kind(q.text)
                try:
                    free = session.ask(q.text)
                    text, refused = free.text, ""
                except QuestionError as err:  # a world question refused would be a fault of the rules
                    text, refused = "", str(err)
                chosen = session.ask(q.text, q.options)
                said = vocabulary.answer_kind(text)
                records.append({"model": model, "seed": seed, "length": n, "kind": q.kind, "question": q.text,
                                "truth": q.answer, "free": text, "refused": refused, "expected_kind": expected,
                                "answer_kind": said, "option": chosen.text, "option_index": chosen.option_index,
                                "free_correct": " ".join(text.lower().split()).strip(".!") == q.answer,
                                "option_correct": chosen.option_index == q.answer_index,
                                "right_kind": said == expected})
    return records


def summary(records: list[dict]) -> dict:
    n = len(records)
    if not n:
        return {"n": 0}
    free = sum(r["free_correct"] for r in records) / n
    option = sum(r["option_correct"] for r in records) / n
    return {"n": n, "free": round(free, 3), "option": round(option, 3),
            "free_over_option": round(free / option, 3) if option else None,
            "right_kind": round(sum(r["right_kind"] for r in records) / n, 3),
            "refused": sum(bool(r["refused"]) for r in records)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="bundled names or model folders")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--points", nargs="+", type=int, default=[32, 64], help="frames after which questions are asked")
    parser.add_argument("--name", default="free_text")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    vocabulary = world_vocabulary()
    started = time.perf_counter()
    records, results = [], {}
    for model in args.models:
        mine = run_model(model, args.streams, args.frames, args.points, vocabulary)
        records += mine
        by_kind = defaultdict(list)
        for r in mine:
            by_kind[r["kind"]].append(r)
        results[model] = {"all": summary(mine), "kinds": {kind: summary(rs) for kind, rs in by_kind.items()}}
        s = results[model]["all"]
        s["targets_met"] = bool(s["free_over_option"] is not None and s["free_over_option"] >= TARGET_RATIO
                                and s["right_kind"] >= TARGET_KIND)
        print(f"{model}: {s}", flush=True)
    rows = [{"model": model, "kind": kind, **cell} for model, result in results.items()
            for kind, cell in [("all", result["all"]), *result["kinds"].items()]]
    print(table(rows, [("model", "model"), ("kind", "kind"), ("n", "n"), ("option", "option"), ("free", "free"),
                       ("free_over_option", "free/option"), ("right_kind", "right kind"), ("refused", "refused")]))
    path = write_json(args.name, {"models": args.models, "streams": args.streams,
                                  "frames": args.frames, "points": args.points, "seed": ACCURACY_SEED,
                                  "targets": {"free_over_option": TARGET_RATIO, "right_kind": TARGET_KIND},
                                  "seconds": round(time.perf_counter() - started, 1), "results": results,
                                  "records": records}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
