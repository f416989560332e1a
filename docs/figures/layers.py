"""Draws docs/figures/layers.png, the picture of the code's layers in docs/architecture.md.

    python docs/figures/layers.py        (needs matplotlib, in requirements.txt)
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from overview import CACHE, EDGE, ENGINE, ROS, arrow, box, plt  # noqa: E402

OUT = pathlib.Path(__file__).with_name("layers.png")


def main() -> None:
    fig, ax = plt.subplots(figsize=(12.5, 7.4), dpi=120)
    ax.set_xlim(0, 16.2)
    ax.set_ylim(0, 9.6)
    ax.axis("off")
    box(ax, 0.3, 7.6, 10.0, 1.8, "node/  (rclpy; node.py wires its parts and owns the lifecycle)",
        ["parts given the Session, publishers, logger, clock: Cameras, Questions,",
         "MemoryServices, TimeQuestions, StatusReports, RuntimeTuning"], ROS)
    box(ax, 10.7, 7.6, 5.2, 1.8, "client/, tools/",
        ["StreamCacheClient, streamcache-ask,", "replay, bags, demo, launching"], ROS)
    box(ax, 0.3, 5.7, 15.6, 1.5, "the engine's face: __init__.py, parameters.py, status.py, errors.py",
        ["build_session(params); every parameter declared once (default, range, choices, fallback, old names); "
         "the engine's own dataclasses the node reads; the errors it translates"], ENGINE)
    box(ax, 0.3, 3.2, 4.1, 2.1, "session.py",
        ["the orchestrator: locks, frame", "queues per camera; ask, when,", "watch, status, tune, snapshots"], ENGINE)
    box(ax, 4.7, 3.2, 3.6, 2.1, "ingest.py",
        ["how a chunk runs:", "encode, prefill, compress,", "book; ingest health"], ENGINE)
    box(ax, 8.6, 3.2, 3.6, 2.1, "answering.py",
        ["how a question runs:", "decode, or options scored", "(scoring.py); P(yes) rows"], ENGINE)
    box(ax, 12.5, 3.2, 3.4, 2.1, "ledger.py",
        ["what is in memory: units,", "cameras, stamps, windows,", "counts, evidence, timeline"], ENGINE)
    box(ax, 0.3, 1.1, 3.9, 1.7, "checks.py, layout.py",
        ["what may come in; how a stream", "becomes tokens (shared with training)"], ENGINE)
    box(ax, 4.5, 1.1, 3.4, 1.7, "when.py",
        ["the when search:", "plain logic over an oracle"], ENGINE)
    box(ax, 8.2, 1.1, 3.6, 1.7, "adapters/",
        ["one file per model family:", "prompts, vision, decoder loop"], ENGINE)
    box(ax, 12.1, 1.1, 3.8, 1.7, "cache/  (torch only)",
        ["policies (full, fifo, uniform, hermes,", "h2svc), KVStore, rows, positions"], CACHE)
    arrow(ax, (5.3, 7.6), (5.3, 7.2))
    arrow(ax, (8.1, 5.7), (8.1, 5.3))
    # the session calls each of the three: one line under their text
    ax.plot([4.4, 12.45], [3.45, 3.45], color=EDGE, linewidth=1.3)
    for x in (4.7, 8.6, 12.5):
        arrow(ax, (x - 0.3, 3.45), (x, 3.45))
    arrow(ax, (6.5, 3.2), (10.0, 2.8))
    arrow(ax, (10.4, 3.2), (10.0, 2.8))
    arrow(ax, (11.8, 1.95), (12.1, 1.95))
    arrow(ax, (2.3, 3.2), (2.3, 2.8))
    arrow(ax, (3.4, 3.2), (6.2, 2.8))
    ax.text(8.1, 0.45, "each layer imports only those below it; nothing under the engine imports ROS; "
                       "the node imports only the engine's face", ha="center", fontsize=9, style="italic",
            color=EDGE)
    fig.tight_layout()
    fig.savefig(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
