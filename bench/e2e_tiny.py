"""End to end on the bundled tiny models: every policy side by side, in one run.

Streams the synthetic clip through a Session per (model, policy) and, when the stream reaches 16, 64,
256 and 1024 frames, records the per-chunk ingest time (encode + prefill + compress) of the chunks
since the last checkpoint, the time to first token and the decode rate of a question, and the KV bytes
held. Reports each as a ratio to the ``full`` cache at the same length (this machine is noisy:
ratios from one run, not absolute numbers, are what to read).

    python bench/e2e_tiny.py [--lengths 16 64 256 1024] [--policies full fifo hermes h2svc]
"""
from __future__ import annotations

import argparse
import statistics
import time

import common  # noqa: F401  (sys.path, env)
import numpy as np

from streamcache_ros import clip
from streamcache_ros.engine.cache import POLICIES
from streamcache_ros.engine.factory import build_session

MODELS = ["tiny-qwen2_5_vl", "tiny-llava_onevision"]
QUESTION = "What happened in the video?"
# fifo/hermes keep this many stream units per layer: about H2SVC's mean over heads
# (0.1·4 + 0.4·16 + 0.5·64 = 38.8 units, h2svc_spec §7), so the bounded policies hold similar memory.
BUDGET_UNITS = 40
ASK_REPEATS = 3


def run(model: str, policy: str, lengths: list[int], chunk_frames: int, new_tokens: int) -> list[dict]:
    probe = build_session({"model_path": model, "policy": "full", "device": "cpu", "dtype": "float32"})
    per_unit = probe.adapter.preprocess([clip.frame(0)]).tokens_per_unit
    params = {"model_path": model, "policy": policy, "device": "cpu", "dtype": "float32",
              "chunk_frames": chunk_frames, "max_new_tokens": new_tokens, "budget_tokens": BUDGET_UNITS * per_unit}
    session = build_session(params)
    for i in range(chunk_frames):  # warm-up: the first chunk pays for lazy initialisation
        session.add_frame(clip.frame(i), stamp=float(i))
    session.ask(QUESTION, max_new_tokens=2)
    session.reset()
    rows, chunk_ms = [], []
    frames_seen = 0
    for length in sorted(lengths):
        chunk_ms.clear()
        while frames_seen < length:
            report = session.add_frame(clip.frame(frames_seen), stamp=float(frames_seen))
            frames_seen += 1
            if report is not None:
                chunk_ms.append(report.encode_ms + report.prefill_ms + report.compress_ms)
        session.flush()
        # the median of a few questions: answering leaves the cache as it was, so they are alike
        answers = [session.ask(QUESTION, max_new_tokens=new_tokens) for _ in range(ASK_REPEATS)]
        answer = answers[-1]
        rates = [(a.answer_tokens - 1) / ((a.total_ms - a.ttft_ms) / 1e3) for a in answers
                 if a.answer_tokens > 1 and a.total_ms > a.ttft_ms]
        stats = session.status().cache
        rows.append({
            "model": model, "policy": policy, "frames": length,
            "chunk_ms": statistics.median(chunk_ms) if chunk_ms else None,
            "ttft_ms": statistics.median(a.ttft_ms for a in answers),
            "decode_tok_s": statistics.median(rates) if rates else None,
            "kv_bytes": stats.kv_bytes, "kv_tokens": stats.kv_tokens,
            "frames_in_memory": answer.frames_in_memory,
        })
    return rows


def add_ratios(rows: list[dict]) -> None:
    full = {(r["model"], r["frames"]): r for r in rows if r["policy"] == "full"}
    for r in rows:
        base = full.get((r["model"], r["frames"]))
        for key in ("chunk_ms", "ttft_ms", "decode_tok_s", "kv_bytes"):
            if base and base.get(key) and r.get(key) is not None:
                r[f"{key}_vs_full"] = r[key] / base[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--policies", nargs="+", default=[p for p in ("full", "fifo", "hermes", "h2svc") if p in POLICIES])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--chunk-frames", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    np.random.seed(0)
    rows = []
    started = time.perf_counter()
    for model in args.models:
        for policy in args.policies:
            rows += run(model, policy, args.lengths, args.chunk_frames, args.new_tokens)
    add_ratios(rows)
    print(common.table(rows, [("model", "model"), ("policy", "policy"), ("frames", "frames"),
                              ("chunk_ms", "chunk ms"), ("chunk_ms_vs_full", "chunk ×full"),
                              ("ttft_ms", "TTFT ms"), ("ttft_ms_vs_full", "TTFT ×full"),
                              ("decode_tok_s", "decode tok/s"), ("decode_tok_s_vs_full", "decode ×full"),
                              ("kv_bytes", "KV bytes"), ("kv_bytes_vs_full", "KV ×full")]))
    path = common.write_json("e2e_tiny", {"args": vars(args), "budget_units": BUDGET_UNITS, "rows": rows,
                                          "seconds": time.perf_counter() - started})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
