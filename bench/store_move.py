"""Eviction in place, by runs against by index: FIFO's and uniform's compression per chunk at a 7B
model's shapes, the kept slots moved by slice copies of their runs (``KVStore._move``, the default)
and, in the same run, by index_select alone (``store.MIN_RUN`` past any run: the path before runs),
and as before both changes (index_select, and the units a chunk evicted found through the whole
``stats()`` accounting rather than ``CacheStorage.held_units``).

The streams are bench/cache_cost.py's (random K/V of the real shapes, a chunk of 16 frames, budget
6000); the four variants take turns a chunk each (lock step), so a change in the machine's load
hits them alike. Per checkpoint, medians over the chunks since the last one: store ms, compress ms
(everything the policy does to get back to budget) and move ms (``KVStore.keep`` alone, summed
over the layers: the part the two paths differ in). docs/performance.md, "FIFO's compression
without the copy".

    python bench/store_move.py [--models llava_onevision-7b] [--checkpoints 256 1024 2048]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import cache_cost
import common
import torch

from streamcache_ros.engine.cache import store as store_module
from streamcache_ros.engine.cache.storage import CacheStorage

# per path: store.MIN_RUN while a variant runs (None: as it is), and whether the policy finds the
# units a chunk evicted through the whole accounting (stats(), before held_units) as it once did
PATHS = {"runs": (None, False), "index_select": (1 << 62, False), "before": (1 << 62, True)}


class MoveTimer:
    """``KVStore.keep``'s wall time, added to the variant that is running."""

    def __init__(self):
        self.ms = 0.0
        self._keep = store_module.KVStore.keep

    def __enter__(self):
        timer, keep = self, self._keep

        def timed(store, index):
            start = time.perf_counter()
            try:
                return keep(store, index)
            finally:
                timer.ms += (time.perf_counter() - start) * 1e3

        store_module.KVStore.keep = timed
        return self

    def __exit__(self, *exc):
        store_module.KVStore.keep = self._keep
        return False


def on_path(chunks, path: tuple[int | None, bool], timer: MoveTimer):
    """``chunks`` (cache_cost.stream) with ``store.MIN_RUN`` set (and the evicted units found through
    ``stats()`` where the path says so) while each chunk runs, each record with the keep() time of
    its chunk."""
    min_run, by_stats = path
    while True:
        saved, held_units = store_module.MIN_RUN, CacheStorage.held_units
        store_module.MIN_RUN = saved if min_run is None else min_run
        if by_stats:
            CacheStorage.held_units = lambda storage: storage.stats().units
        timer.ms = 0.0
        try:
            record = next(chunks, None)
        finally:
            store_module.MIN_RUN, CacheStorage.held_units = saved, held_units
        if record is None:
            return
        yield {**record, "move_ms": timer.ms}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(parser)
    parser.add_argument("--models", nargs="+", default=["llava_onevision-7b"], choices=list(cache_cost.SHAPES))
    parser.add_argument("--policies", nargs="+", default=["fifo", "uniform"], choices=["fifo", "uniform"])
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--chunk-frames", type=int, default=16)
    parser.add_argument("--fifo-budget", type=int, default=6000, help="budget of fifo and uniform")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (smoke test)")
    parser.add_argument("--name", default="store_move")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.attention = False  # what cache_cost.stream reads
    checkpoints = sorted({c for c in args.checkpoints if c % args.chunk_frames == 0})
    device = torch.device(args.device)
    started = time.perf_counter()
    rows, per_chunk = [], {}
    for name in args.models:
        shape = cache_cost.SHAPES[name]
        if args.tiny:
            shape = cache_cost.shrink(shape, layers=4, head_dim=16, grid=3)
        geo = cache_cost.geometry(shape, device)
        provider = cache_cost.RandomGuidance(shape, device, args.seed)
        variants = {f"{policy}/{path}": (cache_cost.Variant(f"{policy}-{path}", policy,
                                                            {"budget_tokens": args.fifo_budget}), path)
                    for policy in args.policies for path in PATHS}
        print(f"# {name}: {', '.join(variants)} to {checkpoints[-1]} frames", flush=True)
        with MoveTimer() as timer, torch.inference_mode():
            streams = {label: on_path(cache_cost.stream(shape, variant, geo, provider, args, checkpoints[-1]),
                                      PATHS[path], timer)
                       for label, (variant, path) in variants.items()}
            records = cache_cost.lock_step(streams, checkpoints)
        for label, (variant, path) in variants.items():
            mine = records[label]
            per_chunk[f"{name}/{label}"] = mine
            previous = 0
            for frames in checkpoints:
                window = [r for r in mine if previous < r["frames"] <= frames]
                rows.append({"model": name, "policy": variant.policy, "path": path, "frames": frames,
                             "chunks_timed": len(window),
                             **{key: common.median(r[key] for r in window)
                                for key in ("append_ms", "compress_ms", "move_ms")},
                             "held_bytes": window[-1]["held_bytes"] if window else None})
                previous = frames
    print(common.table(rows, [("model", "model"), ("policy", "policy"), ("path", "moved by"), ("frames", "frames"),
                              ("append_ms", "store ms/chunk"), ("compress_ms", "compress ms/chunk"),
                              ("move_ms", "keep() ms/chunk")]))
    payload = {"args": {k: str(v) if not isinstance(v, (int, float, str, list, bool)) else v
                        for k, v in vars(args).items()},
               "shapes": {name: dataclasses.asdict(cache_cost.SHAPES[name]) for name in args.models},
               "rows": rows, "per_chunk": per_chunk, "seconds": time.perf_counter() - started}
    path = common.write_json(args.name, payload, args.out, args.device)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
