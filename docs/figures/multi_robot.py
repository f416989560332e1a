"""Draws docs/figures/multi_robot.png, docs/deployment.md's picture of two robots on one ROS domain.

    python docs/figures/multi_robot.py        (needs matplotlib, in requirements.txt)
"""
from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = pathlib.Path(__file__).with_name("multi_robot.png")
ROBOT = "#dbe9f6"      # a robot's computer
OPERATOR = "#e6f2dc"   # the operator's station
DDS = "#f2f2f2"        # the one ROS domain
SECURE = "#fbe7c6"     # what SROS2 confines
EDGE = "#4a4a4a"


def region(ax, x, y, w, h, colour, title, dashed=False):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.15", facecolor=colour,
                                edgecolor=EDGE, linewidth=1.2, linestyle="--" if dashed else "-"))
    ax.text(x + 0.15, y + h - 0.12, title, ha="left", va="top", fontsize=10.5, fontweight="bold")


def box(ax, x, y, w, h, title, lines, colour="white", size=8.2):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.1", facecolor=colour,
                                edgecolor=EDGE, linewidth=1.0))
    ax.text(x + w / 2, y + h - 0.12, title, ha="center", va="top", fontsize=size + 0.8, fontweight="bold")
    ax.text(x + w / 2, y + h - 0.45, "\n".join(lines), ha="center", va="top", fontsize=size, linespacing=1.4,
            family="monospace")


def arrow(ax, start, end, text="", offset=(0.0, 0.08), both=False):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>" if both else "-|>", mutation_scale=13,
                                 linewidth=1.2, color=EDGE, shrinkA=2, shrinkB=2))
    if text:
        mx, my = (start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1]
        ax.text(mx, my, text, ha="center", va="bottom", fontsize=7.8, style="italic")


def robot(ax, y, name):
    """One robot's computer at height ``y``: its camera, its node in namespace /<name>, its enclave."""
    region(ax, 0.2, y, 6.6, 3.4, ROBOT, f"{name}: its own computer")
    box(ax, 0.45, y + 0.35, 1.55, 2.4, "camera", [f"/{name}/", "camera/", "image_raw"])
    box(ax, 2.45, y + 0.2, 4.15, 2.75, f"/{name}/streamcache_node",
        [f"(enclave /{name}/streamcache_node)", "ask, ask_action, when", "add/remove_watch_question",
         "memory_status, watch_events", f"/diagnostics '/{name}/...'"])
    ax.add_patch(FancyBboxPatch((2.6, y + 0.3), 3.85, 0.4, boxstyle="round,pad=0.01", facecolor=SECURE,
                                edgecolor=EDGE, linewidth=0.8))
    ax.text(4.52, y + 0.5, "save_memory, load_memory", ha="center", va="center", fontsize=8.0, family="monospace")
    arrow(ax, (2.0, y + 1.55), (2.45, y + 1.55))
    ax.text(1.22, y + 0.18, "frames stay here", ha="center", va="center", fontsize=7.4, style="italic")
    arrow(ax, (6.6, y + 1.55), (7.2, y + 1.55), both=True)


def main() -> None:
    fig, ax = plt.subplots(figsize=(13.0, 7.6), dpi=120)
    ax.set_xlim(0, 16.4)
    ax.set_ylim(0, 9.6)
    ax.axis("off")
    ax.text(8.2, 9.35, "Two robots on one ROS domain: a namespace each, DDS between machines", ha="center",
            va="center", fontsize=12.5, fontweight="bold")

    robot(ax, 5.0, "robot_a")
    robot(ax, 0.9, "robot_b")

    # the fabric: DDS on one ROS_DOMAIN_ID, no other transport between machines
    region(ax, 7.2, 0.5, 1.8, 8.3, DDS, "", dashed=True)
    ax.text(8.1, 8.55, "DDS\none\nROS_DOMAIN_ID", ha="center", va="top", fontsize=9.0, fontweight="bold",
            linespacing=1.3)
    ax.text(8.1, 0.65, "SROS2:\na certificate\nper participant,\npermissions\nper enclave", ha="center",
            va="bottom", fontsize=7.8, linespacing=1.3)

    # the operator's station
    region(ax, 9.4, 0.5, 6.8, 8.3, OPERATOR, "operator station (or a fleet server)")
    box(ax, 9.7, 5.85, 6.2, 2.45, "clients name the robot", [
        "streamcache-ask --namespace /robot_a \\", "  'Is the door open?'",
        "StreamCacheClient('/robot_b')", "no namespace, two robots: refused,", "both named"])
    box(ax, 9.7, 3.2, 6.2, 2.35, "rqt_robot_monitor", [
        "Robots/robot_a/StreamCache/Cameras", "                      .../Memory", "                      .../Latency",
        "Robots/robot_b/StreamCache/...", "one diagnostic_aggregator:",
        "config/diagnostic_aggregator_robots.yaml"])
    ax.add_patch(FancyBboxPatch((9.7, 0.75), 6.2, 2.15, boxstyle="round,pad=0.02,rounding_size=0.1",
                                facecolor=SECURE, edgecolor=EDGE, linewidth=1.0))
    ax.text(12.8, 2.78, "enclave /operator/console", ha="center", va="top", fontsize=9.0, fontweight="bold")
    ax.text(12.8, 2.4, "\n".join(["the only enclave allowed to request", "/robot_a/save_memory, /robot_a/load_memory,",
                                   "/robot_b/save_memory, /robot_b/load_memory;", "a BT's enclave: ask, when, watch only"]),
            ha="center", va="top", fontsize=8.0, linespacing=1.4)

    arrow(ax, (9.0, 7.05), (9.7, 7.05), both=True)
    arrow(ax, (9.0, 4.35), (9.7, 4.35))
    arrow(ax, (9.0, 1.8), (9.7, 1.8), both=True)
    for y, text in ((7.15, "ask, when,\nwatch"), (4.45, "/diagnostics"), (1.9, "save, load")):
        ax.text(8.1, y + 0.05, text, ha="center", va="bottom", fontsize=7.8, style="italic")
    for y in (6.55, 2.45):
        ax.text(8.1, y + 0.05, "services,\ntopics", ha="center", va="bottom", fontsize=7.8, style="italic")

    fig.savefig(OUT, bbox_inches="tight", facecolor="white")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
