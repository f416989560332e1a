"""What `when` costs against one ask on the same memory (docs/interfaces.md "When").

    python bench/when_cost.py                                   # world-qwen2_5_vl, 512 frames, every policy
    python bench/when_cost.py --model world-llava_onevision --frames 128 --repeats 3

One held-out world stream of ``--frames`` frames fed to a Session per policy (the bounded ones at
1/8 of the full cache's bytes, as bench/accuracy.py sets them); then, on that memory, timed in one
run and interleaved: one Ask (a yes/no question, options scored), and `when` in modes last, first
and timeline, each ``--repeats`` times. Reported: medians, the ratio of each `when` to the ask, the
windows each asked, and the goals (a timeline within 4x one ask, last within 2x). Writes
bench/results/when_cost.json; absolute times are this CPU's, under whatever else ran (the JSON says).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import add_common_args, table, write_json  # noqa: E402

import accuracy  # noqa: E402
from streamcache_ros import world  # noqa: E402

GOALS = {"timeline": 4.0, "last": 2.0}
SEED = accuracy.ACCURACY_SEED + 8_000_000


def measure(session, question: str, repeats: int) -> dict:
    times: dict[str, list[float]] = {"ask": [], "last": [], "first": [], "timeline": []}
    asked: dict[str, int] = {}
    for _ in range(repeats):
        started = time.perf_counter()
        session.ask(question, ["yes", "no"], evidence_k=0)
        times["ask"].append((time.perf_counter() - started) * 1e3)
        for mode in ("last", "first", "timeline"):
            started = time.perf_counter()
            found = session.when(question, mode)
            times[mode].append((time.perf_counter() - started) * 1e3)
            asked[mode] = found.questions_asked
    medians = {k: statistics.median(v) for k, v in times.items()}
    row = {"ask ms": round(medians["ask"], 1)}
    for mode in ("last", "first", "timeline"):
        row[f"{mode} ms"] = round(medians[mode], 1)
        row[f"{mode} / ask"] = round(medians[mode] / medians["ask"], 2)
        row[f"{mode} windows"] = asked[mode]
    for mode, goal in GOALS.items():
        row[f"{mode} goal met"] = row[f"{mode} / ask"] <= goal
    return row


def main(argv=None) -> int:
    from streamcache_ros.engine.adapters.models import DEFAULT_MODEL, resolve_model_path  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--frames", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--policies", nargs="+", default=list(accuracy.POLICIES))
    parser.add_argument("--rows-per-pass", type=int, default=64)
    parser.add_argument("--name", default="when_cost")
    parser.add_argument("--note", default="", help="what else ran on the machine, said in the JSON")
    add_common_args(parser)
    args = parser.parse_args(argv)
    adapter = accuracy.load(args.model)
    folder = pathlib.Path(resolve_model_path(args.model))
    head_map = str(folder / "h2svc_head_map.json") if (folder / "h2svc_head_map.json").is_file() else ""
    stream = world.make_stream(SEED, args.frames)
    seen = sorted({v.identity for f in stream.truth for v in f})
    shape, colour = seen[len(seen) // 2] if seen else ("circle", "red")
    question = world.SEEN_PROBE.format(colour=colour, shape=shape)
    g = accuracy.geometry_for(adapter, stream.look, head_map)
    full_longest = g.prefix + -(-args.frames // g.frames_per_unit) * g.tokens_per_unit
    rows = []
    for policy in [p for p in args.policies if p != "h2svc" or head_map]:
        knobs = accuracy.policy_knobs(policy, full_longest / 8, g)
        session = accuracy.make_session(adapter, policy, knobs, head_map)
        session.config.rows_per_pass = args.rows_per_pass
        for i in range(args.frames):
            session.add_frame(stream.frame(i), stamp=stream.stamp(i))
        session.flush()
        status = session.status()
        rows.append({"policy": policy, "frames in memory": status.frames_in_memory,
                     "kv_bytes": status.cache.kv_bytes, **measure(session, question, args.repeats)})
        print(f"[when_cost] {rows[-1]}", flush=True)
    columns = ["policy", "frames in memory", "ask ms", "last ms", "last / ask", "last windows", "timeline ms",
               "timeline / ask", "timeline windows", "first / ask"]
    print(table(rows, [(c, c) for c in columns]))
    truth = [i for i, f in enumerate(stream.truth) if any(v.identity == (shape, colour) for v in f)]
    path = write_json(args.name, {"model": args.model, "frames": args.frames, "question": question,
                                  "truth_frames": truth, "repeats": args.repeats, "rows_per_pass": args.rows_per_pass,
                                  "goals": GOALS, "rows": rows,
                                  "note": args.note},
                      args.out, args.device)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
