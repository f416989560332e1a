"""The main job, engine only: the demo's shape-world stream (docs/world.md, the stream of the demo
bag) through a session, then the world's questions, each answer printed beside the truth.

    streamcache-demo [--policy fifo] [--model world-qwen2_5_vl] [--frames 100]
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from .. import world  # noqa: E402
from ..engine import StreamCacheError  # noqa: E402
from ..engine.factory import ENGINE_DEFAULTS, build_session  # noqa: E402
from .demo import DEMO_FRAMES, DEMO_SEED, demo_look  # noqa: E402

CAMERA = "/camera/image_raw"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay the demo's shape-world stream through a session and "
                                                 "ask the world's questions.")
    parser.add_argument("--model", default=ENGINE_DEFAULTS["model_path"])
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--frames", type=int, default=DEMO_FRAMES,
                        help=f"frames of the stream (1 fps), {world.STABLE_FRAMES}..3600")
    args = parser.parse_args(argv)
    try:
        stream = world.make_stream(DEMO_SEED, args.frames, look=demo_look())
        session = build_session({"model_path": args.model, "policy": args.policy, "budget_tokens": args.budget,
                                 "chunk_frames": 8, "sample_fps": 1.0 / world.FRAME_PERIOD_S, "max_new_tokens": 16})
    except (StreamCacheError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"model {session.adapter.model_id} ({session.adapter.family}), policy {session.policy.name}, "
          f"budget {args.budget} tokens per layer; world seed {DEMO_SEED}, {len(stream)} frames")
    for i in range(len(stream)):
        report = session.add_frame(stream.frame(i), stamp=stream.stamp(i), camera=CAMERA)
        if report is not None and report.chunk_id % 3 == 0:
            stats = session.status().cache
            print(f"chunk {report.chunk_id:3d}: {report.frames} frames, {report.tokens} tokens, "
                  f"encode {report.encode_ms:.1f} ms, prefill {report.prefill_ms:.1f} ms, "
                  f"compress {report.compress_ms:.1f} ms | cache {stats.kv_tokens} tokens, {stats.kv_bytes / 1024:.0f} KiB")
    questions = [q for q in stream.questions(len(stream)) if q.options] if stream.is_still(len(stream)) else []
    right = 0
    for q in questions:
        answer = session.ask(q.text, q.options)
        right += answer.option_index == q.answer_index
        print(f"Q: {q.text}  options {q.options}\nA: {answer.text!r} -> option {answer.option_index}   "
              f"truth: {q.answer!r}  (ttft {answer.ttft_ms:.1f} ms, {answer.frames_in_memory} frames in memory, "
              f"stamps {answer.oldest_stamp:.0f}-{answer.newest_stamp:.0f} s)")
    status = session.status()
    print(f"memory: {status.frames_in_memory} frames, {status.cache.kv_tokens} KV tokens, "
          f"{status.cache.kv_bytes} bytes, layers {status.cache.layer_tokens}")
    if questions:
        print(f"accuracy: {right}/{len(questions)} of the world's questions (chance is about "
              f"{sum(1 / len(q.options) for q in questions):.1f}/{len(questions)}); the tiny-* models have "
              "random weights (README).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
