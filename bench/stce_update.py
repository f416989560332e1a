"""H2SVC's per-eviction update alone: one STCE step (link the new frame, evict the lowest-scoring
interior frame, rescore its two neighbours and the old tail) at the real sizes.

A 7B model with 28 layers x 4 KV heads split 10/40/50 has 56 episodic heads; each holds N_e = 64
frames, one frame vector (the mean Value, D = 128) per frame. The step is vectorised over the heads
(stce.py), so one ``TrajectoryBank.insert`` at capacity is one eviction in every episodic head at
once. The paper's claim is under 0.1 ms per eviction.

    python bench/stce_update.py [--heads 56] [--capacity 64] [--dim 128] [--steps 2000]
"""
from __future__ import annotations

import argparse
import statistics
import time

import common
import torch

from streamcache_ros.engine.cache.stce import TrajectoryBank


@torch.inference_mode()
def measure(heads: int, capacity: int, dim: int, steps: int, warmup: int, device: torch.device, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    # a random walk: consecutive frames are near each other, as in a video, so curvatures vary
    walk = torch.randn(capacity + warmup + steps, heads, dim, generator=gen).cumsum(dim=0).to(device)
    bank = TrajectoryBank(heads, capacity, device)
    for t in range(capacity):  # fill: no eviction yet
        bank.insert(t, walk[t])
    times, evaluations = [], []
    for i in range(warmup + steps):
        t = capacity + i
        common.synchronize(device)
        start = time.perf_counter()
        evicted = bank.insert(t, walk[t])
        common.synchronize(device)
        elapsed = (time.perf_counter() - start) * 1e3
        if i >= warmup:
            times.append(elapsed)
            evaluations.append(int(bank.last_evaluations.max()))
        if bool((evicted < 0).any()):
            raise RuntimeError(f"step {t}: a head at capacity did not evict")
    times.sort()
    return {"heads": heads, "capacity": capacity, "dim": dim, "steps": steps,
            "median_ms": statistics.median(times), "p90_ms": times[int(0.9 * (len(times) - 1))],
            "min_ms": times[0], "median_ms_per_head": statistics.median(times) / heads,
            "scores_per_step": max(evaluations), "evictions": bank.evictions}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(parser)
    parser.add_argument("--heads", type=int, nargs="+", default=[56, 1],
                        help="episodic heads updated together (56: a 7B model; 1: one head alone)")
    parser.add_argument("--capacity", type=int, default=64, help="N_e frames per head")
    parser.add_argument("--dim", type=int, default=128, help="frame vector size (head_dim)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (the step is small: 1 is steadier)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    rows = [measure(h, args.capacity, args.dim, args.steps, args.warmup, device, args.seed) for h in args.heads]
    label = "GPU" if device.type == "cuda" else "CPU"
    print(common.table(rows, [("heads", "episodic heads"), ("capacity", "N_e"), ("dim", "D"),
                              ("median_ms", f"ms per step ({label}, median)"), ("p90_ms", "p90 ms"),
                              ("median_ms_per_head", "ms per head"), ("scores_per_step", "scores computed")]))
    path = common.write_json("stce_update", {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                             args.out, args.device)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
