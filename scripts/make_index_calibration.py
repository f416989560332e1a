"""Make the index's calibration set: shape-world frames whose truth is known, shipped with the node
(docs/archive.md "Calibrating the index").

    python scripts/make_index_calibration.py     # writes streamcache_ros/models/retrieval/shape-world-calibration.npz

and calibrates the bundled world-retrieval on it, keeping the result in its streamcache_retrieval.json
(so a node need not compute it at every start; the node computes it again whenever the encoder,
its scale and bias, or the set differ from what it was computed for).

Frames from held-out world streams over the whole range the world allows (size, aspect,
background, noise, jitter, encoding; up to 480 px wide, to ship small), seeds from 720 000 000 (no training run or benchmark draws
them), each kept as a JPEG (an encoding the world sends), with which of the 18 identities it shows.
Any dual encoder is calibrated on it when the node loads it (engine/recall/index/calibration.py).
"""
from __future__ import annotations

import argparse
import io
import pathlib
import sys

import numpy as np
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine.adapters.models import RETRIEVAL_DIR, WORLD_RETRIEVAL  # noqa: E402
from streamcache_ros.engine.recall.index import RetrievalEncoder  # noqa: E402
from streamcache_ros.engine.recall.index.calibration import CALIBRATION_FILE  # noqa: E402

SEED = 720_000_000
MAX_WIDTH = 480  # frames kept small: the set ships with the node
IDENTITIES = [(s, c) for s in world.SHAPES for c in world.COLOUR_NAMES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--per-stream", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "streamcache_ros" / "models" / "retrieval" / CALIBRATION_FILE))
    args = parser.parse_args()
    jpegs, truth = [], []
    for s in range(args.streams):
        rng = np.random.default_rng(SEED + s)
        look = world.random_look(rng)
        while look.width > MAX_WIDTH:  # every other part of the world's range; the encoder resizes anyway
            look = world.random_look(rng)
        stream = world.make_stream(SEED + s, 64, look=look)
        for index in sorted(rng.choice(64, args.per_stream, replace=False).tolist()):
            out = io.BytesIO()
            Image.fromarray(stream.frame(index)).save(out, format="JPEG", quality=92)
            jpegs.append(np.frombuffer(out.getvalue(), np.uint8))
            shown = {v.identity for v in stream.truth[index]}
            truth.append([identity in shown for identity in IDENTITIES])
    sizes = np.array([len(j) for j in jpegs], np.int64)
    texts = np.array([world.SEEN_PROBE.format(shape=s, colour=c) for s, c in IDENTITIES])
    np.savez_compressed(args.out, jpegs=np.concatenate(jpegs), sizes=sizes, truth=np.array(truth, bool), texts=texts,
                        seeds_from=np.array(SEED))
    shown = np.array(truth, bool)
    print(f"wrote {args.out}: {len(jpegs)} frames, {sizes.sum() / 1e6:.2f} MB, each identity shown in "
          f"{shown.sum(axis=0).min()}..{shown.sum(axis=0).max()} frames, {(~shown.any(axis=1)).sum()} empty")
    bundled = RETRIEVAL_DIR / WORLD_RETRIEVAL
    encoder = RetrievalEncoder.load(str(bundled))
    encoder.settings.calibration = None
    encoder.calibrate(args.out, shape_world=True)
    encoder.save_settings(bundled)
    print(encoder.describe())


if __name__ == "__main__":
    main()
