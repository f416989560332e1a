"""Draws docs/figures/overview.png, the README's picture of what streamcache_ros does.

    python docs/figures/overview.py        (needs matplotlib, in requirements.txt)
"""
from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = pathlib.Path(__file__).with_name("overview.png")
ROS = "#dbe9f6"      # the ROS side
ENGINE = "#e6f2dc"   # the engine, no ROS
CACHE = "#fbe7c6"    # the cache policies
EDGE = "#4a4a4a"


def box(ax, x, y, w, h, title, lines, colour):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                facecolor=colour, edgecolor=EDGE, linewidth=1.2))
    ax.text(x + w / 2, y + h - 0.28, title, ha="center", va="top", fontsize=11, fontweight="bold")
    ax.text(x + w / 2, y + h - 0.72, "\n".join(lines), ha="center", va="top", fontsize=8.6,
            linespacing=1.45)


def arrow(ax, start, end, text="", offset=(0.0, 0.16), style="-|>", colour=EDGE):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=14, linewidth=1.3,
                                 color=colour, shrinkA=2, shrinkB=2))
    if text:
        mx, my = (start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1]
        ax.text(mx, my, text, ha="center", va="bottom", fontsize=8.2, style="italic")


def main() -> None:
    fig, ax = plt.subplots(figsize=(12.5, 5.6), dpi=120)
    ax.set_xlim(0, 16.2)
    ax.set_ylim(0, 7.2)
    ax.axis("off")

    # the ingest path, left to right
    box(ax, 0.2, 4.2, 2.5, 2.3, "Cameras", ["sensor_msgs/Image", "CompressedImage", "(live, or a rosbag2", "replayed)"], ROS)
    box(ax, 3.5, 4.2, 3.0, 2.3, "streamcache_node", ["check every frame", "sample at sample_fps", "by message stamp", "convert to RGB"], ROS)
    box(ax, 7.3, 4.2, 3.2, 2.3, "Session + adapter", ["chunks of chunk_frames", "vision encoder", "(torch or onnxruntime)", "prefill, no recompute"], ENGINE)
    box(ax, 11.3, 3.3, 4.7, 3.2, "KV cache policy", ["the VLM's keys and values", "at a fixed size", "", "full: everything (baseline)", "fifo: the newest tokens",
                                                      "hermes: per-layer choice", "h2svc: per-head banks"], CACHE)
    arrow(ax, (2.7, 5.35), (3.5, 5.35), "frames")
    arrow(ax, (6.5, 5.35), (7.3, 5.35), "RGB")
    arrow(ax, (10.5, 5.35), (11.3, 5.35), "K, V")

    # the question path
    box(ax, 0.2, 0.5, 4.3, 2.6, "Robot: BT, script, CLI", ["Ask service / action:", "question, options, camera", "", "answer, option_index,", "frames and stamps used"], ROS)
    box(ax, 5.3, 0.5, 5.2, 2.6, "Answer from the cache", ["the question is prefilled after the cache", "greedy decoding, streamed as feedback",
                                                         "no frame is encoded again", "question tokens removed afterwards:", "the memory is as it was"], ENGINE)
    arrow(ax, (4.5, 2.1), (5.3, 2.1), "ask")
    arrow(ax, (5.3, 1.3), (4.5, 1.3), "answer", offset=(0.0, -0.42))
    arrow(ax, (10.5, 1.8), (12.6, 3.3), "attend", offset=(-0.2, 0.0))

    # status out
    ax.text(3.5 + 3.0 / 2, 3.75, "memory_status · /diagnostics", ha="center", va="center", fontsize=8.6,
            bbox=dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor=EDGE, linewidth=0.8))
    arrow(ax, (5.0, 4.2), (5.0, 3.98))

    ax.text(8.1, 7.0, "streamcache_ros: a long visual memory for a robot, at a fixed memory size", ha="center",
            va="center", fontsize=12.5, fontweight="bold")
    for y, colour, label in ((2.2, ROS, "ROS 2 node"), (1.6, ENGINE, "engine (no ROS)"), (1.0, CACHE, "cache policy")):
        ax.add_patch(FancyBboxPatch((13.6, y), 0.3, 0.3, boxstyle="round,pad=0.02", facecolor=colour, edgecolor=EDGE))
        ax.text(14.05, y + 0.15, label, va="center", fontsize=8.6)
    fig.savefig(OUT, bbox_inches="tight", facecolor="white")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
