"""A streams checkpoint made small enough to travel (to a lent GPU machine, say): the model, the
frame head and the schedule's state, without the optimizer's moments (two thirds of the file).
The trainer resumes from it with Adam started again and a short warm-up (docs/world-models.md).

    python scripts/slim_checkpoint.py data/train-qwen2_5_vl/checkpoint.pt slim/checkpoint.pt --minutes 90 --threads 1

--minutes and --threads are the run's that wrote the checkpoint; they give its progress through the
schedule where the checkpoint does not say it.
"""
from __future__ import annotations

import argparse
import pathlib

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=pathlib.Path)
    parser.add_argument("target", type=pathlib.Path)
    parser.add_argument("--minutes", type=float, required=True, help="the streams stage's --minutes")
    parser.add_argument("--threads", type=int, required=True, help="the run's --threads")
    args = parser.parse_args()
    saved = torch.load(args.source, weights_only=False, map_location="cpu")
    state = dict(saved["state"])
    state.setdefault("progress", min(1.0, state["used"] / (args.minutes * 60 * args.threads)))
    args.target.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": saved["model"], "head": saved["head"], "state": state}, args.target)
    print(f"{args.target}: step {state['step']}, progress {state['progress']:.3f}, "
          f"{args.target.stat().st_size / 2**20:.1f} MiB (from {args.source.stat().st_size / 2**20:.1f})")


if __name__ == "__main__":
    main()
