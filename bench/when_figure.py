"""The README's picture of `when`: the timeline's P(yes) against the truth, per policy.

    python bench/when_figure.py                          # world-qwen2_5_vl, a 128-frame held-out stream
    python bench/when_figure.py --model world-llava_onevision --frames 256 --identities 3

One held-out world stream fed to a Session per policy (the bounded ones at 1/8 of the full cache's
bytes at 512 frames, as bench/accuracy.py sets them); for a few identities the stream shows,
`when(..., "timeline")` for `Did you see a {colour} {shape}?`, plotted against the frames where the
identity was in view (shaded), with each policy's `last` and `first` answers marked. Writes
bench/figures/when-timeline-<model>.png and bench/results/when-timeline-<model>.json.
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import add_common_args, write_json  # noqa: E402

import accuracy  # noqa: E402
from streamcache_ros import world  # noqa: E402

SEED = accuracy.ACCURACY_SEED + 8_500_000
COLOURS = {"full": "black", "fifo": "tab:red", "uniform": "tab:green", "hermes": "tab:blue", "h2svc": "tab:purple"}


def spans(frames: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of frame indices, as (first, last)."""
    out = []
    for f in frames:
        if out and f == out[-1][1] + 1:
            out[-1] = (out[-1][0], f)
        else:
            out.append((f, f))
    return out


def main(argv=None) -> int:
    from streamcache_ros.engine.adapters.models import DEFAULT_MODEL, resolve_model_path  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--frames", type=int, default=128)
    parser.add_argument("--identities", type=int, default=3)
    parser.add_argument("--policies", nargs="+", default=list(accuracy.POLICIES))
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--figure", type=pathlib.Path, default=None)
    add_common_args(parser)
    args = parser.parse_args(argv)
    adapter = accuracy.load(args.model)
    folder = pathlib.Path(resolve_model_path(args.model))
    head_map = str(folder / "h2svc_head_map.json") if (folder / "h2svc_head_map.json").is_file() else ""
    stream = world.make_stream(args.seed, args.frames)
    shown = sorted({v.identity for f in stream.truth for v in f}, key=lambda i: stream.identity_frames(i, len(stream))[0])
    identities = shown[:args.identities]
    g = accuracy.geometry_for(adapter, stream.look, head_map)
    full_longest = g.prefix + math.ceil(max(accuracy.LENGTHS) / g.frames_per_unit) * g.tokens_per_unit
    policies = [p for p in args.policies if p != "h2svc" or head_map]
    results = {}
    for policy in policies:
        knobs = accuracy.policy_knobs(policy, full_longest / 8 if policy != "full" else full_longest, g)
        session = accuracy.make_session(adapter, policy, knobs, head_map)
        for i in range(len(stream)):
            session.add_frame(stream.frame(i), stamp=stream.stamp(i))
        session.flush()
        per = {}
        for shape, colour in identities:
            question = world.SEEN_PROBE.format(colour=colour, shape=shape)
            timeline = session.when(question, "timeline")
            last, first = session.when(question, "last"), session.when(question, "first")
            per[question] = {"stamps": timeline.timeline_stamps, "p_yes": timeline.timeline_yes_probability,
                             "last": last.stamp if last.found else None, "first": first.stamp if first.found else None,
                             "windows": timeline.questions_asked}
        results[policy] = {"knobs": knobs, "frames_in_memory": session.status().frames_in_memory, "identities": per}
        print(f"[when_figure] {policy}: {results[policy]['frames_in_memory']} frames in memory", flush=True)
    truth = {world.SEEN_PROBE.format(colour=c, shape=s): stream.identity_frames((s, c), len(stream))
             for s, c in identities}
    name = f"when-timeline-{pathlib.Path(args.model).name}"
    path = write_json(name, {"model": args.model, "seed": args.seed, "frames": args.frames, "truth_frames": truth,
                             "policies": results}, args.out, args.device)
    plot(results, truth, stream, args.figure or accuracy.FIGURES / f"{name}.png", args.model)
    print(f"wrote {path}")
    return 0


def plot(results: dict, truth: dict, stream, path: pathlib.Path, model: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    questions = list(truth)
    fig, axes = plt.subplots(len(questions), 1, figsize=(11, 2.3 * len(questions)), sharex=True, squeeze=False)
    for ax, question in zip(axes[:, 0], questions):
        for first, last in spans(truth[question]):
            ax.axvspan(stream.stamp(first) - 0.5, stream.stamp(last) + 0.5, color="gold", alpha=0.35, lw=0)
        for policy, result in results.items():
            r = result["identities"][question]
            ax.step(r["stamps"], r["p_yes"], where="mid", color=COLOURS.get(policy), lw=1.4, label=policy)
            if r["last"] is not None:
                ax.plot([r["last"]], [1.04], marker="v", color=COLOURS.get(policy), ms=6)
        ax.axhline(0.5, color="grey", lw=0.6, ls=":")
        ax.set_ylim(-0.02, 1.1)
        ax.set_ylabel("P(yes)")
        ax.set_title(f"{question}  (shaded: in view; triangles: each policy's 'last')", fontsize=9)
    axes[0, 0].legend(ncol=len(results), fontsize=8, loc="upper left")
    axes[-1, 0].set_xlabel("stream time (s)")
    fig.suptitle(f"{model}: when's timeline against the truth, bounded policies at 1/8 of the full cache's bytes",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
