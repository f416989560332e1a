"""Temporal attention distance (TAD) of every KV head, from the head maps `streamcache-profile` wrote
into the bundled models' folders: do the trained models' heads specialise the way the H2SVC paper
says (some looking at the newest frames, others far back), or do they look like random weights?

    python bench/tad_figure.py [--models world-qwen2_5_vl tiny-qwen2_5_vl ...]

Writes bench/reported/tad.json (per model: each head's TAD_V2V / TAD_T2V, the bank it was given,
the spread over heads, and what uniform attention would give) and bench/figures/tad.png.
Reading the figure: docs/h2svc.md, "SAP on the trained models".
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import machine  # noqa: E402

BANKS = ("instantaneous", "short-term", "episodic")


def uniform_tad(units: int) -> tuple[float, float]:
    """TAD under attention spread evenly over the causal past, in stream units: a frame at unit t
    looks t/2 units back on average (V2V, averaged over t); the question, after the last unit,
    looks (units + 1)/2 back (T2V)."""
    v2v = float(np.mean([t / 2 for t in range(units)]))
    return v2v, (units + 1) / 2


def summarise(head_map: dict) -> dict:
    v2v, t2v = np.asarray(head_map["tad_v2v"]), np.asarray(head_map["tad_t2v"])
    units = int(np.mean(head_map["profile"]["units_per_video"]))
    flat_v2v, flat_t2v = uniform_tad(units)
    return {
        "model_id": head_map["model_id"], "units_per_video": units, "videos": head_map["profile"]["videos"],
        "tad_v2v": v2v.tolist(), "tad_t2v": t2v.tolist(), "bank_id": head_map["bank_id"],
        "uniform_attention": {"tad_v2v": flat_v2v, "tad_t2v": flat_t2v},
        # spread over heads relative to the uniform value: 0 = every head alike
        "relative_spread": {"tad_v2v": float(v2v.std() / flat_v2v), "tad_t2v": float(t2v.std() / flat_t2v)},
        "range": {"tad_v2v": [float(v2v.min()), float(v2v.max())], "tad_t2v": [float(t2v.min()), float(t2v.max())]},
    }


def plot(summaries: list[dict], path: pathlib.Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(summaries), figsize=(4.2 * len(summaries), 3.8), squeeze=False,
                             sharex=True, sharey=True)  # one scale: the spreads compare by eye
    colours = ("tab:red", "tab:orange", "tab:blue")
    for ax, s in zip(axes[0], summaries):
        v2v, t2v, banks = (np.asarray(s[k]).ravel() for k in ("tad_v2v", "tad_t2v", "bank_id"))
        for bank, colour in enumerate(colours):
            chosen = banks == bank
            ax.scatter(v2v[chosen], t2v[chosen], c=colour, label=BANKS[bank], s=36)
        ax.axvline(s["uniform_attention"]["tad_v2v"], color="grey", lw=0.8, ls="--")
        ax.axhline(s["uniform_attention"]["tad_t2v"], color="grey", lw=0.8, ls="--")
        ax.set_title(f"{s['model_id']} ({s['units_per_video']} units)", fontsize=9)
        ax.set_xlabel("TAD_V2V (units back)")
        ax.set_ylabel("TAD_T2V (units back)")
    axes[0][0].legend(fontsize=7, title="bank (dashed: uniform attention)", title_fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    from streamcache_ros.engine.cache.sap import HEAD_MAP_FILE  # noqa: PLC0415
    from streamcache_ros.engine.adapters.models import BUNDLED_DIR  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["world-qwen2_5_vl", "world-llava_onevision",
                                                         "world-wide-qwen2_5_vl", "world-wide-llava_onevision",
                                                         "tiny-qwen2_5_vl", "tiny-llava_onevision"])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "reported" / "tad.json")
    parser.add_argument("--figure", type=pathlib.Path, default=ROOT / "bench" / "figures" / "tad.png")
    args = parser.parse_args()
    summaries = []
    for name in args.models:
        file = BUNDLED_DIR / name / HEAD_MAP_FILE
        if not file.is_file():
            print(f"{name}: no head map at {file} (streamcache-profile --model {name} --input synthetic "
                  f"--output {file})", file=sys.stderr)
            return 2
        summaries.append(summarise(json.loads(file.read_text())))
    for s in summaries:
        print(f"{s['model_id']}: TAD_V2V {s['range']['tad_v2v'][0]:.1f}-{s['range']['tad_v2v'][1]:.1f} "
              f"(uniform {s['uniform_attention']['tad_v2v']:.1f}, spread {s['relative_spread']['tad_v2v']:.3f}), "
              f"TAD_T2V {s['range']['tad_t2v'][0]:.1f}-{s['range']['tad_t2v'][1]:.1f} "
              f"(uniform {s['uniform_attention']['tad_t2v']:.1f}, spread {s['relative_spread']['tad_t2v']:.3f})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine("cpu"), "models": summaries}, indent=1) + "\n")
    plot(summaries, args.figure)
    print(f"wrote {args.out} and {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
