"""H2SVC's prefill against the other policies' on the bundled world models (docs/performance.md,
"H2SVC's prefill").

One held-out world stream (seed 500 000 000, 128 frames) goes frame by frame into one Session per
policy over one model (the vision encoder runs once per chunk for all of them), the sessions taking
turns frame by frame, so a change in the machine's load hits them alike. The policies are set at
bench/accuracy.py's equal bytes (1/8 of the full cache at 512 frames); H2SVC twice: unit by unit
(the default, docs/h2svc.md §3.2) and ``unit_by_unit: false``; where the stores keep their next
offsets from forward to forward (``KVStore.next_offsets``), H2SVC a third time as before that and
the views of ``HeadGroup.kv_rows`` (``h2svc-as-before``: the offsets worked out again on every
call, a group's heads taken by index, copied; the two changes undone in the same run). Per policy:
prefill and compress ms per chunk (the ChunkReport's; median and 10th percentile over the chunks
after the first ``--skip``), and the decoder forwards a chunk takes.

``--profile``: a further H2SVC session (unit by unit) fed the same stream under cProfile (one
thread); the functions where its prefill spends its time go into the JSON, and its prefill split
per forward: the decoder pass, the policy's attention inside it (storing included), and STCE's
arrival after each unit. ``--before JSON``: the rows of an earlier run (the code before a change)
side by side with this one's.

    python bench/h2svc_prefill.py [--models world-qwen2_5_vl world-llava_onevision] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pathlib
import pstats
import time

import accuracy
import common
import torch

from streamcache_ros import world
from streamcache_ros.engine.cache.store import KVStore
from streamcache_ros.engine.adapters.models import resolve_model_path
from streamcache_ros.engine.ingest.prefill import prefill_steps

SEED = accuracy.ACCURACY_SEED
POLICIES = ("fifo", "uniform", "hermes", "h2svc", "h2svc-chunk")  # h2svc-chunk: unit_by_unit false
# the stores of the sessions whose next offsets are worked out on every call (h2svc-as-before)
RECOMPUTED: set[int] = set()
MEMO = "_offsets" in KVStore._adopt.__code__.co_names  # the stores keep their next offsets


def _next_offsets(original):
    def next_offsets(store, clock=None):
        if id(store) in RECOMPUTED:
            store._offsets = {}
        return original(store, clock)
    return next_offsets


if MEMO:
    KVStore.next_offsets = _next_offsets(KVStore.next_offsets)


def sessions_for(adapter, look, head_map_path: str, fraction: float, labels=None) -> dict:
    """One session per policy at the accuracy bench's equal bytes; (session, knobs) by label."""
    g = accuracy.geometry_for(adapter, look, head_map_path)
    full_longest = g.prefix + math.ceil(max(accuracy.LENGTHS) / g.frames_per_unit) * g.tokens_per_unit
    out = {}
    RECOMPUTED.clear()
    for label in labels or POLICIES + (("h2svc-as-before",) if MEMO else ()):
        policy = label.split("-")[0]
        knobs = accuracy.policy_knobs(policy, fraction * full_longest, g)
        if label == "h2svc-chunk":
            knobs = {**knobs, "unit_by_unit": False}
        out[label] = (accuracy.make_session(adapter, policy, knobs, head_map_path), knobs)
        if label == "h2svc-as-before":
            storage = out[label][0].policy.storage
            RECOMPUTED.update(id(store) for store in storage.stores())
            for groups in storage.groups:
                for group in groups:
                    group.span = None
    return out, g


def forwards_per_chunk(session, tokens_per_unit: int, chunk_tokens: int) -> int:
    steps = prefill_steps(chunk_tokens, tokens_per_unit, session.policy.prefill_unit_by_unit,
                          session.config.prefill_block_tokens)
    return sum(len(step) for step in steps)


def profile_h2svc(adapter, stream, frames: int, head_map_path: str, fraction: float, top: int) -> dict:
    """cProfile of an H2SVC session (unit by unit) fed ``frames`` frames: where its add_frame time
    goes (its prefill is most of it), the top functions by own time and by cumulative time."""
    sessions, _ = sessions_for(adapter, stream.look, head_map_path, fraction, ("h2svc",))
    session = sessions["h2svc"][0]
    profiler = cProfile.Profile()
    prefill = []
    for i in range(frames):
        rgb = stream.frame(i)
        profiler.enable()
        report = session.add_frame(rgb, stamp=stream.stamp(i))
        profiler.disable()
        if report is not None:
            prefill.append(report.prefill_ms)
    stats = pstats.Stats(profiler)
    total = stats.total_tt

    def rows(key):
        stats.sort_stats(key)
        out = []
        for func in stats.fcn_list[:top]:
            calls, _, own, cumulative, _ = stats.stats[func]
            out.append({"function": f"{pathlib.Path(func[0]).name}:{func[1]}({func[2]})", "calls": calls,
                        "own_s": round(own, 4), "cumulative_s": round(cumulative, 4),
                        "cumulative_share": round(cumulative / total, 3) if total else None})
        return out

    def cumulative(file: str, name: str) -> tuple[int, float]:
        found = [(v[1], v[3]) for f, v in stats.stats.items() if f[0].endswith(file) and f[2] == name]
        return (sum(c for c, _ in found), sum(t for _, t in found))

    passes, decoder = cumulative("adapters/base.py", "decoder")
    _, attend = cumulative("cache/h2svc.py", "attend")
    units, arrival = cumulative("cache/h2svc.py", "after_prefill")
    _, prefill_s = cumulative("engine/ingest/prefill.py", "prefill_chunk")
    split = {"forwards": passes, "units": units, "prefill_ms_per_chunk": 1e3 * prefill_s / len(prefill),
             "pass_ms": 1e3 * decoder / passes, "attend_ms_per_pass": 1e3 * attend / passes,
             "model_ms_per_pass": 1e3 * (decoder - attend) / passes, "stce_arrival_ms_per_unit": 1e3 * arrival / units}
    print("per forward (under cProfile):", {k: round(v, 3) for k, v in split.items()})
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
    print(text.getvalue())
    return {"seconds": round(total, 3), "chunks": len(prefill), "prefill_ms_mean": sum(prefill) / len(prefill),
            "split": split, "by_own_time": rows("tottime"), "by_cumulative_time": rows("cumulative")}


def run_model(model: str, args) -> tuple[list[dict], dict]:
    adapter = accuracy.load(model)
    folder = pathlib.Path(resolve_model_path(model))
    head_map_path = str(folder / "h2svc_head_map.json")
    stream = world.make_stream(args.seed, args.frames)
    sessions, g = sessions_for(adapter, stream.look, head_map_path, args.fraction)
    per_chunk = {label: [] for label in sessions}
    for i in range(args.frames):
        rgb = stream.frame(i)
        for label, (session, _) in sessions.items():
            report = session.add_frame(rgb, stamp=stream.stamp(i))
            if report is not None:
                per_chunk[label].append({"prefill_ms": report.prefill_ms, "compress_ms": report.compress_ms,
                                         "tokens": report.tokens})
    rows = []
    for label, (session, knobs) in sessions.items():
        chunks = per_chunk[label]
        steady = chunks[args.skip:]
        status = session.status()
        rows.append({"model": model, "policy": label, "knobs": knobs, "chunks": len(chunks),
                     "chunks_timed": len(steady),
                     "forwards_per_chunk": forwards_per_chunk(session, g.tokens_per_unit, chunks[-1]["tokens"]),
                     "prefill_ms": common.median(c["prefill_ms"] for c in steady),
                     "prefill_ms_mean": sum(c["prefill_ms"] for c in steady) / len(steady),
                     "prefill_ms_p10": sorted(c["prefill_ms"] for c in steady)[len(steady) // 10],
                     "compress_ms": common.median(c["compress_ms"] for c in steady),
                     "kv_bytes": status.cache.kv_bytes})
    fifo = next(r["prefill_ms"] for r in rows if r["policy"] == "fifo")
    for row in rows:
        row["prefill_vs_fifo"] = row["prefill_ms"] / fifo
    detail = {"tokens_per_unit": g.tokens_per_unit, "frames_per_unit": g.frames_per_unit, "prefix": g.prefix,
              "bank_fractions": g.bank_fractions, "per_chunk": per_chunk}
    if args.profile:
        detail["profile_h2svc"] = profile_h2svc(adapter, world.make_stream(args.seed, args.frames), args.frames,
                                                head_map_path, args.fraction, args.top)
    return rows, detail


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(parser)
    parser.add_argument("--models", nargs="+", default=["world-qwen2_5_vl", "world-llava_onevision"])
    parser.add_argument("--frames", type=int, default=128)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--fraction", type=float, default=1 / 8, help="of the full cache at 512 frames")
    parser.add_argument("--skip", type=int, default=2, help="chunks left out of the medians (the windows filling)")
    parser.add_argument("--profile", action="store_true", help="also profile an H2SVC session's chunks")
    parser.add_argument("--top", type=int, default=25, help="functions the profile keeps")
    parser.add_argument("--before", type=pathlib.Path, help="a JSON of this script whose rows are 'before'")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--name", default="h2svc_prefill")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    rows, details = [], {}
    for model in args.models:
        model_rows, details[model] = run_model(model, args)
        rows += model_rows
    columns = [("model", "model"), ("policy", "policy"), ("forwards_per_chunk", "forwards/chunk"),
               ("prefill_ms", "prefill ms/chunk"), ("prefill_ms_p10", "p10"), ("prefill_vs_fifo", "x fifo"),
               ("compress_ms", "compress ms/chunk")]
    payload = {"args": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
               "rows": rows, "models": details, "seconds": time.perf_counter() - started}
    if args.before:
        before = json.loads(args.before.read_text())
        payload["before"] = {"machine": before["machine"], "rows": before["rows"],
                             "profile_h2svc": {m: d.get("profile_h2svc") for m, d in before["models"].items()}}
        old = {(r["model"], r["policy"]): r for r in before["rows"]}
        for row in rows:
            was = old.get((row["model"], row["policy"]))
            row["prefill_ms_before"] = was["prefill_ms"] if was else None
            row["prefill_ms_p10_before"] = was.get("prefill_ms_p10") if was else None
            row["compress_ms_before"] = was["compress_ms"] if was else None
        columns[3:3] = [("prefill_ms_before", "prefill ms before")]
        columns += [("compress_ms_before", "compress ms before")]
    print(common.table(rows, columns))
    path = common.write_json(args.name, payload, args.out, args.device)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
