"""The README's picture of the archive: long-memory accuracy against stream length, 32 frames to a day.

    python bench/archive_figure.py                  # from bench/reported/archive_recall-world-qwen2_5_vl-*.json
    python bench/archive_figure.py --model world-llava_onevision

Reads the runs bench/archive_recall.py wrote (the hour's streams and the day's, pooled per mark:
each mark's questions from every run that asked there) and plots, per bounded policy, the
long-memory accuracy with the archive (solid) and without it (dashed: the same memory, the archive
detached), with the full cache at 128 frames as the reference the targets are set against. Writes
bench/figures/archive-<model>.png; prints the table it plotted.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from accuracy import wilson  # noqa: E402
from common import ROOT, table  # noqa: E402

COLOURS = {"fifo": "tab:red", "uniform": "tab:green", "hermes": "tab:blue", "h2svc": "tab:purple"}


def pooled(paths: list[pathlib.Path]) -> tuple[dict, dict]:
    """{(policy, archive): {length: [correct...]}} over every run, and the full cache's at 128."""
    cells, full = defaultdict(lambda: defaultdict(list)), []
    for path in paths:
        for r in json.loads(path.read_text())["records"]:
            if r["policy"] == "full":
                full.append(r["correct"])
            else:
                cells[(r["policy"], r["archive"])][r["length"]].append(r["correct"])
    return cells, full


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="world-qwen2_5_vl")
    parser.add_argument("--reported", type=pathlib.Path, default=ROOT / "bench" / "reported")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    paths = sorted(args.reported.glob(f"archive_recall-{args.model}-*.json"))
    if not paths:
        print(f"no bench/reported/archive_recall-{args.model}-*.json: run bench/archive_recall.py first", file=sys.stderr)
        return 1
    cells, full = pooled(paths)
    rows = []
    for (policy, archive), marks in sorted(cells.items()):
        for length, hits in sorted(marks.items()):
            low, high = wilson(sum(hits), len(hits))
            rows.append({"config": f"{policy}{' + archive' if archive else ''}", "frames": length, "n": len(hits),
                         "accuracy": round(sum(hits) / len(hits), 2), "95%": f"{low:.2f}-{high:.2f}"})
    print(f"from {', '.join(p.name for p in paths)}")
    print(table(rows, [(k, k) for k in ("config", "frames", "n", "accuracy", "95%")]))
    reference = sum(full) / len(full) if full else None

    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(9, 4))
    for (policy, archive), marks in sorted(cells.items()):
        lengths = sorted(marks)
        ax.plot(lengths, [sum(marks[n]) / len(marks[n]) for n in lengths], marker="o" if archive else "x",
                linestyle="-" if archive else "--", color=COLOURS.get(policy, "grey"),
                label=f"{policy}{' + archive' if archive else ' alone'}")
    if reference is not None:
        ax.axhline(reference, color="black", linewidth=1, label=f"full cache at 128 frames ({reference:.2f})")
        ax.axhspan(reference - 0.05, reference, color="black", alpha=0.07, label="target: within 0.05")
    ax.set_xscale("log")
    ax.set_xlabel("frames in the stream (1 fps: 3 600 = an hour, 86 400 = a day)")
    ax.set_ylabel("long-memory accuracy")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower left")
    ax.set_title(f"{args.model}: bounded memory at 1/8 of the bytes, with and without the archive")
    fig.tight_layout()
    out = args.out or ROOT / "bench" / "figures" / f"archive-{args.model}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
