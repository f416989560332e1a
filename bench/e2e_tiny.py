"""End to end on the bundled tiny models: every policy side by side, in one run.

One Session per policy, all fed the same frames (the fixed shape-world stream, docs/world.md) in lock
step (chunk by chunk, policy after policy), so that a change in the machine's load hits every policy
alike. When the stream reaches 16, 64, 256 and 1024 frames, each session answers the same question
a few times (again taking turns), and the run records the per-chunk ingest time (encode + prefill +
compress) of the chunks since the last checkpoint, the time to first token, the decode rate and the
KV bytes held: medians, and each as a ratio to the ``full`` cache at the same length. Read the
ratios: the models are tiny and random, so the absolute times are the overheads of this machine, not
of a 7B model.

    python bench/e2e_tiny.py [--lengths 16 64 256 1024] [--policies full fifo uniform hermes h2svc] [--device cuda]
"""
from __future__ import annotations

import argparse
import time

import common
import torch

from streamcache_ros import world
from streamcache_ros.engine.cache import POLICIES
from streamcache_ros.engine.factory import build_session

MODELS = ["tiny-qwen2_5_vl", "tiny-llava_onevision"]
QUESTION = "What happened in the video?"
# fifo/uniform/hermes keep this many stream units per layer: about H2SVC's mean over heads with its
# defaults (0.1·4 + 0.4·16 + 0.5·64 = 38.8 units, docs/h2svc.md §7), so the bounded policies hold
# similar memory.
BUDGET_UNITS = 40
RATIO_KEYS = ("chunk_ms", "compress_ms", "ttft_ms", "decode_tok_s", "kv_bytes")


def make_sessions(model: str, policies: list[str], args) -> dict:
    base = {"model_path": model, "device": args.device, "dtype": args.dtype, "attention": args.attention,
            "chunk_frames": args.chunk_frames, "max_new_tokens": args.new_tokens}
    probe = build_session({**base, "policy": "full"})
    per_unit = probe.adapter.preprocess([world.world_frame(0)]).tokens_per_unit
    budget = BUDGET_UNITS * per_unit
    sessions = {p: probe if p == "full" else build_session({**base, "policy": p, "budget_tokens": budget})
                for p in policies}
    for session in sessions.values():  # warm-up: the first chunk and question pay for lazy initialisation
        for i in range(args.chunk_frames):
            session.add_frame(world.world_frame(i), stamp=float(i))
        session.ask(QUESTION, max_new_tokens=2)
        session.reset()
    return sessions


def run(model: str, policies: list[str], args) -> list[dict]:
    sessions = make_sessions(model, policies, args)
    chunk_ms = {p: [] for p in policies}
    compress_ms = {p: [] for p in policies}
    rows, frames_seen = [], 0
    for length in sorted(args.lengths):
        for p in policies:
            chunk_ms[p].clear()
            compress_ms[p].clear()
        while frames_seen < length:
            batch = [(world.world_frame(frames_seen + i), float(frames_seen + i))
                     for i in range(min(args.chunk_frames, length - frames_seen))]
            frames_seen += len(batch)
            for p, session in sessions.items():
                for frame, stamp in batch:
                    report = session.add_frame(frame, stamp=stamp)
                    if report is not None:
                        chunk_ms[p].append(report.encode_ms + report.prefill_ms + report.compress_ms)
                        compress_ms[p].append(report.compress_ms)
        for session in sessions.values():
            session.flush()
        answers = {p: [] for p in policies}
        for _ in range(args.repeats):  # answering leaves the cache as it was: the repeats are alike
            for p, session in sessions.items():
                answers[p].append(session.ask(QUESTION, max_new_tokens=args.new_tokens))
        for p, session in sessions.items():
            rates = [(a.answer_tokens - 1) / ((a.total_ms - a.ttft_ms) / 1e3) for a in answers[p]
                     if a.answer_tokens > 1 and a.total_ms > a.ttft_ms]
            stats = session.status().cache
            rows.append({"model": model, "policy": p, "frames": length,
                         "chunk_ms": common.median(chunk_ms[p]), "compress_ms": common.median(compress_ms[p]),
                         "chunks": len(chunk_ms[p]),
                         "ttft_ms": common.median(a.ttft_ms for a in answers[p]),
                         "decode_tok_s": common.median(rates),
                         "answer_tokens": common.median(a.answer_tokens for a in answers[p]),
                         "kv_bytes": stats.kv_bytes, "kv_tokens": stats.kv_tokens,
                         "frames_in_memory": answers[p][-1].frames_in_memory})
    return rows


def add_ratios(rows: list[dict]) -> None:
    full = {(r["model"], r["frames"]): r for r in rows if r["policy"] == "full"}
    for r in rows:
        base = full.get((r["model"], r["frames"]))
        for key in RATIO_KEYS:
            if base and base.get(key) and r.get(key) is not None:
                r[f"{key}_vs_full"] = r[key] / base[key]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(parser)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--policies", nargs="+",
                        default=[p for p in ("full", "fifo", "uniform", "hermes", "h2svc") if p in POLICIES])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--chunk-frames", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=9, help="questions per checkpoint and policy (median)")
    parser.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bf16/fp16 on CUDA")
    parser.add_argument("--attention", default="auto", help="auto (flash-attn on CUDA when importable) | sdpa | flash")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (tiny models: 1 is steadier)")
    args = parser.parse_args(argv)
    if "full" not in args.policies:
        args.policies = ["full", *args.policies]  # the ratios are to it
    if torch.device(args.device).type == "cpu":
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    rows = []
    for model in args.models:
        rows += run(model, args.policies, args)
    add_ratios(rows)
    print(common.table(rows, [("model", "model"), ("policy", "policy"), ("frames", "frames"),
                              ("chunk_ms_vs_full", "ingest/chunk ×full"), ("compress_ms", "compress ms"),
                              ("ttft_ms_vs_full", "TTFT ×full"), ("decode_tok_s_vs_full", "decode tok/s ×full"),
                              ("kv_bytes_vs_full", "KV ×full"), ("frames_in_memory", "frames held"),
                              ("chunk_ms", "ingest ms"), ("ttft_ms", "TTFT ms"), ("decode_tok_s", "tok/s")]))
    path = common.write_json("e2e_tiny", {"args": {k: str(v) if not isinstance(v, (int, float, list)) else v
                                                   for k, v in vars(args).items()},
                                          "budget_units": BUDGET_UNITS, "rows": rows,
                                          "seconds": time.perf_counter() - started}, args.out, args.device)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
