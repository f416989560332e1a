"""Linear probes on frozen vision tokens: does a model's vision encoder see shape and colour?

    python bench/vision_probe.py                                   # every bundled world model
    python bench/vision_probe.py --models /path/to/model --frames 800

A memory is only as right as what its vision tokens encode. For each model: single-object world
frames from held-out seeds (every look the world allows: background, noise, colour jitter, JPEG),
each frame's tokens from the model's own preprocessing and vision tower (frozen), and a
multinomial logistic regression (L2, full-batch L-BFGS) fitted on 75 % of the frames and scored on
the other 25 %:

- ``320x240``: frames of one size, the tokens flattened in order (a fixed grid): what a linear
  read-out of the whole token set can tell;
- ``any size``: frames of every size the world allows, each half's tokens averaged (the grid
  differs between sizes): what the frame head of the vision-first stage reads.

Targets (docs/world-models.md): shape >= 0.95, colour >= 0.98 on the 320x240 probe. Prints a table
and writes bench/results/vision_probe.json.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import add_common_args, table, write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine import load_adapter  # noqa: E402
from streamcache_ros.engine.training.frame_targets import pool_halves, single_frame_tokens  # noqa: E402

MODELS = ["world-qwen2_5_vl", "world-llava_onevision"]
PROBE_SEED = 700_000_000  # no training run, validation, benchmark or test draws these
TARGETS = {"shape": 0.95, "colour": 0.98}
# `moved` needs where an object is within the frame, not only its half: a move shifts it 8-15 % of
# the width a frame, 32 % or more in all, so 8 columns of 12.5 % tell a move's two ends apart
POSITION_BINS = 8


def single_object_frames(count: int, fixed_size: bool, seed: int = PROBE_SEED):
    """``count`` frames with exactly one object in view, and that object's (shape, colour, the
    position bin of its centre: POSITION_BINS equal columns of the frame's width)."""
    frames, labels, index = [], [], 0
    while len(frames) < count:
        rng = np.random.default_rng((seed, index))
        look = world.random_look(rng)
        if fixed_size:
            look = world.Look(**{**look.__dict__, "width": 320, "height": 240})
        stream = world.make_stream(seed + index, 12, look=look, one_object_first=1.0)
        index += 1
        singles = [i for i, views in enumerate(stream.truth) if len(views) == 1]
        for i in rng.choice(singles, size=min(2, len(singles)), replace=False) if singles else []:
            (view,) = stream.truth[int(i)]
            frames.append(stream.frame(int(i)))
            centre = (view.x0 + view.side / 2) / look.width
            labels.append((view.shape, view.colour, min(int(centre * POSITION_BINS), POSITION_BINS - 1)))
    return frames[:count], labels[:count]


@torch.no_grad()
def features(adapter, frames: list[np.ndarray], flatten: bool, batch: int = 64) -> torch.Tensor:
    out = []
    for start in range(0, len(frames), batch):
        tokens, grids = single_frame_tokens(adapter, frames[start:start + batch])
        for t, (rows, cols) in zip(tokens, grids):
            out.append(t.flatten() if flatten else pool_halves(t, rows, cols).flatten())
    return torch.stack(out).float()


def probe(x: torch.Tensor, y: torch.Tensor, classes: int, l2: float = 1e-3, seed: int = 0,
          tolerance: int = 0) -> float:
    """Held-out accuracy of a logistic regression fitted on 75 % of (x, y); with ``tolerance``, a
    class that far from the truth counts as right (ordered classes: position bins)."""
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(0.75 * len(x))
    train, test = order[:cut], order[cut:]
    mean, std = x[train].mean(0), x[train].std(0) + 1e-6
    xs = (x - mean) / std
    weight = torch.zeros(x.shape[1], classes, requires_grad=True)
    bias = torch.zeros(classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1, max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(xs[train] @ weight + bias, y[train]) + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return float(((xs[test] @ weight + bias).argmax(1) - y[test]).abs().le(tolerance).float().mean())


def run_model(name: str, frames: int, device: str) -> dict:
    adapter = load_adapter(name, device=device, dtype="float32")
    adapter.model.eval()
    row = {"model": adapter.model_id}
    for setting, fixed in (("320x240", True), ("any size", False)):
        images, labels = single_object_frames(frames, fixed)
        x = features(adapter, images, flatten=fixed)
        shape = torch.tensor([world.SHAPES.index(s) for s, _, _ in labels])
        colour = torch.tensor([world.COLOUR_NAMES.index(c) for _, c, _ in labels])
        row[f"{setting} shape"] = probe(x, shape, len(world.SHAPES))
        row[f"{setting} colour"] = probe(x, colour, len(world.COLOUR_NAMES))
        row[f"{setting} features"] = int(x.shape[1])
        if fixed:  # the token grid is one layout only at one size
            position = torch.tensor([b for _, _, b in labels])
            row[f"{setting} position"] = probe(x, position, POSITION_BINS)
            row[f"{setting} position within one"] = probe(x, position, POSITION_BINS, tolerance=1)
    tokens, grids = single_frame_tokens(adapter, single_object_frames(1, True)[0])
    row["tokens per frame at 320x240"] = tokens[0].shape[0] / adapter.frames_per_unit
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--frames", type=int, default=1600, help="frames per probe (75 %% fit, 25 %% scored)")
    parser.add_argument("--name", default="vision_probe")
    parser.add_argument("--threads", type=int, default=2)
    add_common_args(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [run_model(name, args.frames, args.device) for name in args.models]
    columns = [("model", "model"), ("320x240 shape", "shape (320x240)"), ("320x240 colour", "colour (320x240)"),
               ("any size shape", "shape (any size)"), ("any size colour", "colour (any size)"),
               ("320x240 position", f"position of {POSITION_BINS} (320x240)"),
               ("320x240 position within one", "position, within one"),
               ("tokens per frame at 320x240", "tokens / frame")]
    print(table(rows, columns))
    path = write_json(args.name, {"frames": args.frames, "split": "75/25", "targets": TARGETS,
                                  "position_bins": POSITION_BINS, "rows": rows},
                      args.out, args.device)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
