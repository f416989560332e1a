"""What an archived chunk keeps: embeddings or frames (docs/archive.md "What a chunk keeps").

    python bench/archive_content.py --out bench/reported

Side by side, in one run, on this CPU:

- **The bundled world models**, each content kind over the same held-out stream of ``--frames``
  frames: the archive's bytes a frame (and an hour at 1 fps, from them), and the time to answer one
  windowed question over 8 archived chunks (a replay: read, for frames the vision encoder, prefill,
  ask), against one ask on the working memory.
- **7B shapes** (Qwen2.5-VL-7B at 448x448, LLaVA-OneVision-7B at 384x384; and Qwen2.5-VL-3B):
  the embeddings' bytes an hour from their configs' shapes (computed), a frame's JPEG at the model's
  input size measured on shape-world frames (a real camera's frames compress less: not measured
  here), and the vision tower's time a frame at its real widths with random weights, measured with a
  few of its blocks and scaled to all of them (labelled so); how many days a 256 GB disk holds at
  1 fps and one camera, each way. The answers with frames against embeddings on the hour's
  questions come from bench/archive_recall.py --archive-content frames.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import table, write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine import build_session  # noqa: E402
from streamcache_ros.engine.recall.archive.thumbnails import encode_at  # noqa: E402

SEED = 550_000_000  # held out: no training run or other benchmark draws it
HOUR, DISK = 3600, 256e9
# (hidden, visual tokens a frame, input side) of the models a robot would run
REAL = {"Qwen2.5-VL-7B": (3584, 128, 448), "Qwen2.5-VL-3B": (2048, 128, 448), "LLaVA-OneVision-7B": (3584, 196, 384)}


def world_model(model: str, frames: int) -> list[dict]:
    stream = world.make_stream(SEED, frames)
    out = []
    for content in ("embeddings", "frames"):
        with tempfile.TemporaryDirectory() as folder:
            session = build_session({"model_path": model, "policy": "fifo", "budget_tokens": 48, "archive_path": folder,
                                     "archive_content": content, "retrieval_model_path": "off"})
            for i in range(frames):
                session.add_frame(stream.frame(i), stream.stamp(i))
            session.flush()
            store = session.memory.archive.store
            payload, thumbs = store.reader.execute(
                "SELECT SUM(length(embeds) + length(positions) + COALESCE(length(frames), 0)), "
                "SUM(COALESCE(length(thumbnails), 0)) FROM chunks").fetchone()
            window = (stream.stamp(0), stream.stamp(63))  # 8 archived chunks, long gone from the working memory
            replay = []
            for _ in range(5):
                started = time.perf_counter()
                answer = session.ask("How many objects are in view now?", ["0", "1", "2"], since=window[0],
                                     until=window[1])
                replay.append((time.perf_counter() - started) * 1e3)
                assert answer.recalled_chunks == 8, answer
            unit = []
            for _ in range(5):
                started = time.perf_counter()
                session.ask("How many objects are in view now?", ["0", "1", "2"], since=stream.stamp(frames - 2),
                            until=stream.stamp(frames - 1))
                unit.append((time.perf_counter() - started) * 1e3)
            session.close_archive()
        per_frame = payload / frames
        out.append({"model": model, "content": content, "payload_bytes_per_frame": round(per_frame, 1),
                    "thumbnail_bytes_per_frame": round(thumbs / frames, 1),
                    "payload_mib_per_hour": round(per_frame * HOUR / 2**20, 2),
                    "replay_8_chunks_ms": round(statistics.median(replay), 1),
                    "one_ask_ms": round(statistics.median(unit), 2),
                    "replay_in_asks": round(statistics.median(replay) / statistics.median(unit), 2)})
    return out


def jpeg_bytes(side: int, frames: int = 64) -> float:
    """The median JPEG (as the archive keeps a frame) of shape-world frames at ``side`` x ``side``."""
    sizes = []
    for s in range(frames // 8):
        stream = world.make_stream(SEED + 100 + s, 16, look=world.random_look(np.random.default_rng((SEED, s))))
        sizes += [len(encode_at(stream.frame(i), side, side)) for i in range(0, 16, 2)]
    return float(np.median(sizes))


@torch.inference_mode()
def tower_ms_per_frame(name: str, blocks: int) -> tuple[float, int]:
    """(ms a frame of the vision tower at its real widths, with ``blocks`` of its blocks, scaled to
    all of them; all its blocks), random weights, float32 on this CPU."""
    if name.startswith("Qwen"):
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig  # noqa: PLC0415
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import \
            Qwen2_5_VisionTransformerPretrainedModel  # noqa: PLC0415

        full = 32
        config = Qwen2_5_VLVisionConfig(depth=blocks, hidden_size=1280, intermediate_size=3420, num_heads=16,
                                        out_hidden_size=REAL[name][0], patch_size=14, spatial_merge_size=2,
                                        temporal_patch_size=2, window_size=112, fullatt_block_indexes=[blocks - 1])
        tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(config).eval()
        grid = torch.tensor([[1, 32, 32]])  # two 448x448 frames: one temporal patch of 32x32
        pixels = torch.randn(32 * 32, 3 * 2 * 14 * 14)
        run, frames = (lambda: tower(pixels, grid_thw=grid)), 2
    else:
        from transformers import SiglipVisionConfig, SiglipVisionModel  # noqa: PLC0415

        full = 26
        config = SiglipVisionConfig(hidden_size=1152, intermediate_size=4304, num_hidden_layers=blocks,
                                    num_attention_heads=16, image_size=384, patch_size=14)
        tower = SiglipVisionModel(config).eval()
        pixels = torch.randn(1, 3, 384, 384)
        run, frames = (lambda: tower(pixel_values=pixels)), 1
    run()
    times = []
    for _ in range(3):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times) / frames * full / blocks, full


def real_shapes(blocks: int) -> list[dict]:
    out = []
    jpegs = {side: jpeg_bytes(side) for side in {v[2] for v in REAL.values()}}
    for name, (hidden, tokens, side) in REAL.items():
        embeds = tokens * hidden * 2
        jpeg = jpegs[side]
        ms, full = tower_ms_per_frame(name, blocks)
        out.append({"model": name, "input": f"{side}x{side}", "embeds_bytes_per_frame": embeds,
                    "embeds_gib_per_hour": round(embeds * HOUR / 2**30, 2),
                    "days_on_256_gb_embeds": round(DISK / (embeds * HOUR * 24), 1),
                    "jpeg_bytes_per_frame": round(jpeg), "frames_gib_per_hour": round(jpeg * HOUR / 2**30, 3),
                    "days_on_256_gb_frames": round(DISK / (jpeg * HOUR * 24), 1),
                    "embeds_over_jpeg": round(embeds / jpeg, 1),
                    "vision_ms_per_frame_cpu": round(ms, 1),
                    "source": f"embeddings computed from the config; JPEG measured on shape-world frames (a real "
                              f"camera's compress less); the tower timed with {blocks} of its {full} blocks, scaled"})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=480)
    parser.add_argument("--blocks", type=int, default=2, help="vision-tower blocks built to time one (then scaled)")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    worlds = [row for model in ("world-qwen2_5_vl", "world-llava_onevision") for row in world_model(model, args.frames)]
    print(table(worlds, [(k, k) for k in worlds[0]]))
    reals = real_shapes(args.blocks)
    print(table(reals, [(k, k) for k in reals[0] if k != "source"]))
    path = write_json("archive_content", {"frames": args.frames, "seed": SEED, "world_models": worlds,
                                          "real_shapes": reals}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
