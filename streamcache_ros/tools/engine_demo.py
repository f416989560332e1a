"""The main job, engine only: replay the bundled synthetic clip through a session, ask, print.

    streamcache-demo [--policy fifo] [--model tiny-qwen2_5_vl] [--frames 120]
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from .. import clip  # noqa: E402
from ..engine import StreamCacheError  # noqa: E402
from ..engine.factory import ENGINE_DEFAULTS, build_session  # noqa: E402

QUESTIONS = [("What is on the table?", []),
             ("Which shape moved to the left?", ["the red circle", "the green square", "the white circle"])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay the bundled clip through a session and ask questions.")
    parser.add_argument("--model", default=ENGINE_DEFAULTS["model_path"])
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--sample-fps", type=float, default=1.0)
    args = parser.parse_args(argv)
    try:
        session = build_session({"model_path": args.model, "policy": args.policy, "budget_tokens": args.budget,
                                 "chunk_frames": 8, "sample_fps": args.sample_fps, "max_new_tokens": 16})
    except StreamCacheError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"model {session.adapter.model_id} ({session.adapter.family}), policy {session.policy.name}, "
          f"budget {args.budget} tokens per layer")
    for i, frame in enumerate(clip.clip(args.frames)):
        report = session.add_frame(frame, stamp=i / args.sample_fps, camera="/camera/image_raw")
        if report is not None and report.chunk_id % 3 == 0:
            stats = session.status().cache
            print(f"chunk {report.chunk_id:3d}: {report.frames} frames, {report.tokens} tokens, "
                  f"encode {report.encode_ms:.1f} ms, prefill {report.prefill_ms:.1f} ms, "
                  f"compress {report.compress_ms:.1f} ms | cache {stats.kv_tokens} tokens, {stats.kv_bytes / 1024:.0f} KiB")
    for question, options in QUESTIONS:
        answer = session.ask(question, options)
        chosen = f" -> option {answer.option_index}" if options else ""
        print(f"Q: {question}\nA: {answer.text!r}{chosen}  (ttft {answer.ttft_ms:.1f} ms, "
              f"{answer.frames_in_memory} frames in memory, stamps {answer.oldest_stamp:.0f}-{answer.newest_stamp:.0f} s)")
    status = session.status()
    print(f"memory: {status.frames_in_memory} frames, {status.cache.kv_tokens} KV tokens, "
          f"{status.cache.kv_bytes} bytes, layers {status.cache.layer_tokens}")
    print("note: the bundled tiny model has random weights: its answers are meaningless (see README).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
