"""Where each policy's memory went: a retention map over one shape-world stream.

    python bench/retention_map.py                          # the bundled model, 256 frames
    python bench/retention_map.py --model world-llava_onevision --frames 512 --seed 3

One world stream (docs/world.md) goes through one session per policy, the bounded ones holding the
same KV bytes at the end (``--fraction`` of the full cache's; the knobs of bench/accuracy.py). After
every chunk the memory timeline (docs/interfaces.md "The memory timeline") says, for each frame still in
memory, the share of its tokens kept (mean over layers). The map puts the frames' stamps across and
the stream time at which the memory was looked at down: a row is what the memory held at that moment,
from white (gone) to dark (every token kept). One panel per policy, and for H2SVC one per bank of
heads. The strip above each panel marks the frames with an object in view.

Writes bench/figures/retention_map.png and bench/reported/retention_map.json (per panel and moment:
the frames held, the oldest, the mean share kept; and the last moment's shares frame by frame).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from accuracy import geometry_for, make_session, policy_knobs  # noqa: E402
from common import ROOT, machine, table  # noqa: E402

from streamcache_ros import world  # noqa: E402

POLICIES = ("full", "fifo", "uniform", "hermes", "h2svc")
FIGURE = ROOT / "bench" / "figures" / "retention_map.png"
REPORTED = ROOT / "bench" / "reported"


def record(model: str, seed: int, frames: int, fraction: float, size: tuple[int, int]):
    """{panel: [frames looked at, frames] kept shares (NaN: not yet seen)} after every chunk, and
    the knobs each policy ran with."""
    from streamcache_ros.engine import load_adapter  # noqa: PLC0415
    from streamcache_ros.engine.adapters.models import resolve_model_path  # noqa: PLC0415

    adapter = load_adapter(model, device="cpu", dtype="float32")
    folder = pathlib.Path(resolve_model_path(model))
    head_map = str(folder / "h2svc_head_map.json") if (folder / "h2svc_head_map.json").is_file() else ""
    drawn = world.random_look(np.random.default_rng((seed, 0)))
    look = world.Look(**{**drawn.__dict__, "width": size[0], "height": size[1]})
    stream = world.make_stream(seed, frames, look=look)
    g = geometry_for(adapter, look, head_map)
    full_bytes_tokens = g.prefix + math.ceil(frames / g.frames_per_unit) * g.tokens_per_unit
    policies = [p for p in POLICIES if p != "h2svc" or head_map]
    knobs = {p: policy_knobs(p, fraction * full_bytes_tokens, g) for p in policies}
    sessions = {p: make_session(adapter, p, knobs[p], head_map) for p in policies}
    maps: dict[str, list[np.ndarray]] = {}
    looked: list[float] = []
    for i in range(frames):
        for session in sessions.values():
            session.add_frame(stream.frame(i), stamp=stream.stamp(i))
        if (i + 1) % 8 and i + 1 != frames:
            continue
        looked.append(stream.stamp(i))
        for policy, session in sessions.items():
            session.flush()
            timeline = session.memory_timeline()
            row = {name: np.full(frames, np.nan) for name in [policy] + [f"{policy}: {b}" for b in timeline.bank_names]}
            row[policy][: i + 1] = 0.0
            for name in timeline.bank_names:
                row[f"{policy}: {name}"][: i + 1] = 0.0
            for f in timeline.frames:
                index = int(round(f.stamp - stream.stamp(0)))
                row[policy][index] = f.kept
                for name, share in zip(timeline.bank_names, f.bank_kept):
                    row[f"{policy}: {name}"][index] = share
            for name, values in row.items():
                maps.setdefault(name, []).append(values)
        kv = {p: s.status().cache.kv_bytes for p, s in sessions.items()}
    in_view = [len(stream.truth[i]) > 0 for i in range(frames)]
    return {name: np.stack(rows) for name, rows in maps.items()}, looked, knobs, kv, in_view, stream


def draw(maps: dict, looked: list[float], kv: dict, in_view: list[bool], path: pathlib.Path, title: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    names = list(maps)
    columns = min(4, len(names))
    rows = math.ceil(len(names) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.6 * rows), squeeze=False,
                             gridspec_kw={"hspace": 0.45})
    frames = len(in_view)
    cmap = plt.get_cmap("Blues").copy()
    cmap.set_bad("#f4f4f4")
    image = None
    for k, name in enumerate(names):
        ax = axes[k // columns][k % columns]
        strip = ax.inset_axes([0, 1.02, 1, 0.05])
        strip.imshow(np.asarray(in_view, float)[None], aspect="auto", cmap="Greys", vmin=0, vmax=1.5,
                     extent=(0, frames, 0, 1))
        strip.set_axis_off()
        image = ax.imshow(maps[name], aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest",
                          extent=(0, frames, looked[-1] + 4, looked[0] - 4))
        policy = name.split(":")[0]
        label = name if ":" in name else f"{name} ({kv[policy] / 1024:.0f} KiB)"
        ax.set_title(label, fontsize=9, pad=12)
        ax.set_xlabel("frame stamp (s)", fontsize=8)
        if k % columns == 0:
            ax.set_ylabel("stream time when looked (s)", fontsize=8)
        ax.tick_params(labelsize=7)
    for k in range(len(names), rows * columns):
        axes[k // columns][k % columns].set_axis_off()
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="share of the frame's tokens kept")
    fig.suptitle(title + "\n(the grey strip above each panel: frames with an object in view)", fontsize=10,
                 y=1.0 + 0.04 / rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")


def summary(grid: np.ndarray) -> dict:
    """Per moment looked at: frames held, the oldest held, the mean share kept of those; and the last
    moment's shares, frame by frame (0: gone)."""
    held = np.nan_to_num(grid) > 0
    return {"frames_held": held.sum(axis=1).tolist(),
            "oldest_held": [int(np.argmax(row)) if row.any() else None for row in held],
            "mean_kept": [round(float(np.nanmean(np.where(h, g, np.nan))), 3) if h.any() else None
                          for h, g in zip(held, grid)],
            "last": [round(float(x), 2) for x in np.nan_to_num(grid[-1])]}


def main(argv=None) -> int:
    from streamcache_ros.engine.adapters.models import DEFAULT_MODEL  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--frames", type=int, default=256)
    parser.add_argument("--size", default="320x240", help="frame size WxH")
    parser.add_argument("--fraction", type=float, default=1 / 4,
                        help="bounded policies' bytes / the full cache's at the end of the stream")
    parser.add_argument("--figure", type=pathlib.Path, default=FIGURE)
    parser.add_argument("--out", type=pathlib.Path, default=REPORTED)
    args = parser.parse_args(argv)
    size = tuple(int(x) for x in args.size.lower().split("x"))
    maps, looked, knobs, kv, in_view, stream = record(args.model, args.seed, args.frames, args.fraction, size)
    title = (f"{pathlib.Path(args.model).name}: what each policy keeps of world stream {args.seed} "
             f"({args.frames} frames at 1 fps; bounded at 1/{round(1 / args.fraction)} of the full cache's bytes)")
    draw(maps, looked, kv, in_view, args.figure, title)
    panels = {name: summary(grid) for name, grid in maps.items()}
    print(table([{"panel": name, "held": p["frames_held"][-1], "oldest": p["oldest_held"][-1],
                  "kept": p["mean_kept"][-1]} for name, p in panels.items()],
                [("panel", "policy (bank)"), ("held", "frames held at the end"), ("oldest", "oldest held (s)"),
                 ("kept", "mean share of their tokens kept")]))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "retention_map.json"
    path.write_text(json.dumps({"machine": machine("cpu"), "model": args.model, "seed": args.seed,
                                "frames": args.frames, "size": args.size, "fraction": args.fraction,
                                "knobs": knobs, "kv_bytes": kv, "looked_at": looked,
                                "panels": panels}) + "\n")
    print(f"wrote {args.figure} and {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
