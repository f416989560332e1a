"""streamcache-profile: H2SVC's offline head profiling (SAP, docs/h2svc.md §2) into a head map file.

    streamcache-profile --model tiny-qwen2_5_vl --input synthetic --output head_map.json
    streamcache-profile --model Qwen/Qwen2.5-VL-7B-Instruct --input ~/clips --output qwen7b_heads.json
    streamcache-profile --model llava-hf/llava-onevision-qwen2-0.5b-ov-hf --input my_bag --topic /camera/image_raw

The unmodified model (full cache, nothing evicted) reads each sample video as
``[system prompt][frames][question]``; every layer's attention is summed per frame and turned into
TAD_V2V / TAD_T2V per head (engine/cache/sap.py), and the head map (scores, banks, model id) is
written as JSON. Point the node's ``h2svc.head_map_path`` at it.

Inputs (--input): ``synthetic`` (shape-world streams, docs/world.md); a folder of image frames (one video, frames in
name order); a folder of such folders or of animated images (one video each); an animated
GIF / PNG / WebP file; or a rosbag2 folder with sensor_msgs/Image or CompressedImage messages
(sampled at --sample-fps by header stamp). Other video files (mp4, ...): extract frames first, e.g.
``ffmpeg -i clip.mp4 -vf fps=1 frames/%05d.png`` (no decoder that works without torchvision is
required by this package). Each source is cut into videos of --units stream units.
"""
from __future__ import annotations

import argparse
import io
import math
import pathlib
import sys
import time
from typing import Iterator

import numpy as np
import torch
from PIL import Image, ImageSequence

from .. import world
from ..engine.adapters import ModelAdapter, load_adapter
from ..engine.cache import PREFIX_UNIT, NewTokens
from ..engine.cache.full import FullCachePolicy
from ..engine.cache.rope import apply_rotary
from ..engine.cache.sap import DEFAULT_RATIOS, HeadMap, TadAccumulator, frame_attention, pool_query_heads
from ..engine.errors import StreamCacheError

WORLD_QUESTION = "Did you see a red circle? What color was the first object you saw?"
DEFAULT_QUESTION = "What happens in the video? Describe the objects, how they move and when the scene changes."
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".webp", ".gif", ".tif", ".tiff"}
IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")


class AttentionRecorder(FullCachePolicy):
    """The full cache (the model as it is) that also sums each new query's attention per frame."""

    def __init__(self, block_rows: int = 256):
        super().__init__()
        self.block_rows = block_rows
        self.accumulator: TadAccumulator | None = None
        self.mode = ""  # "visual", "text" or "" (not recorded)

    def attend(self, layer, q, k, v, new, key_filter=None):
        out = super().attend(layer, q, k, v, new, key_filter)
        if self.mode and self.accumulator is not None:
            store = self.layers[layer]
            cos, sin = self.geometry.rotary.cos_sin(store.positions[:, -q.shape[2]:], q.dtype)
            q_rot = apply_rotary(q, cos, sin)  # the queries exactly as the cache attention saw them
            key_frame = torch.where(store.units >= 0, store.units, torch.full_like(store.units, -1))
            attn = frame_attention(q_rot[0], store.keys[0], key_frame, self.accumulator.num_frames, self.block_rows)
            if self.mode == "visual":
                self.accumulator.add_visual(layer, attn, new.units)
            else:
                self.accumulator.add_text(layer, attn)
        return out


def profile_video(adapter: ModelAdapter, recorder: AttentionRecorder, frames: list[np.ndarray], question: str,
                  chunk_units: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """TAD_V2V and TAD_T2V [layers, query heads] of one video."""
    geometry = adapter.geometry()
    per_chunk = chunk_units * adapter.frames_per_unit
    num_units = math.ceil(len(frames) / adapter.frames_per_unit)
    recorder.reset()
    recorder.accumulator = TadAccumulator(geometry.num_layers, geometry.num_q_heads, num_units)
    recorder.mode = ""
    ids = adapter.prefix_ids
    adapter.forward(adapter.embed_text(ids), adapter.text_tokens(len(ids), PREFIX_UNIT), recorder)
    next_unit = 0
    for start in range(0, len(frames), per_chunk):
        inputs = adapter.preprocess(frames[start:start + per_chunk])
        embeds = adapter.encode(inputs)
        rel = adapter.chunk_rel_positions(inputs)
        units = torch.arange(next_unit, next_unit + inputs.num_units).repeat_interleave(inputs.tokens_per_unit)
        recorder.mode = "visual"
        adapter.forward(embeds[None], NewTokens(rel, units, torch.zeros_like(units)), recorder)
        next_unit += inputs.num_units
    # the question as the chat template has it; only the question's own tokens are measured (docs/h2svc.md §2.3)
    recorder.mode = ""
    newline = adapter.tokenizer("\n", add_special_tokens=False).input_ids
    adapter.forward(adapter.embed_text(newline), adapter.text_tokens(len(newline)), recorder)
    recorder.mode = "text"
    question_ids = adapter.tokenizer(question, add_special_tokens=False).input_ids
    adapter.forward(adapter.embed_text(question_ids), adapter.text_tokens(len(question_ids)), recorder)
    recorder.mode = ""
    if recorder.max_position() >= geometry.max_position_embeddings:
        raise ValueError(f"a video of {num_units} units needs positions up to {recorder.max_position():.0f}, "
                         f"beyond the model's {geometry.max_position_embeddings}: use fewer --units")
    return recorder.accumulator.result()


def profile(adapter: ModelAdapter, videos: list[list[np.ndarray]], question: str = DEFAULT_QUESTION,
            gqa_pooling: str = "mean", ratios=DEFAULT_RATIOS, chunk_units: int = 8, source: str = "",
            log=None) -> HeadMap:
    """SAP over ``videos`` (lists of RGB uint8 frames) -> the head map."""
    if not videos:
        raise ValueError("no videos to profile")
    geometry = adapter.geometry()
    recorder = AttentionRecorder()
    recorder.setup(geometry)
    v2v, t2v = [], []
    for index, frames in enumerate(videos):
        started = time.perf_counter()
        a, b = profile_video(adapter, recorder, frames, question, chunk_units)
        v2v.append(a)
        t2v.append(b)
        if log:
            log(f"video {index + 1}/{len(videos)}: {len(frames)} frames, {time.perf_counter() - started:.1f} s")
    q_v2v, q_t2v = torch.stack(v2v), torch.stack(t2v)  # [videos, L, Hq]
    group = geometry.group_size
    kv_v2v = torch.stack([pool_query_heads(x, group, gqa_pooling) for x in q_v2v])
    kv_t2v = torch.stack([pool_query_heads(x, group, gqa_pooling) for x in q_t2v])
    spread = (lambda x: x.std(dim=0, unbiased=False)) if len(videos) > 1 else (lambda x: torch.zeros_like(x[0]))
    return HeadMap.build(
        adapter.model_id, adapter.config_hash, kv_v2v.mean(dim=0), kv_t2v.mean(dim=0), ratios,
        gqa_pooling=gqa_pooling, tad_v2v_std=spread(kv_v2v).tolist(), tad_t2v_std=spread(kv_t2v).tolist(),
        query_tad_v2v=q_v2v.mean(dim=0).tolist(), query_tad_t2v=q_t2v.mean(dim=0).tolist(),
        profile={"videos": len(videos), "frames_per_video": [len(f) for f in videos],
                 "units_per_video": [math.ceil(len(f) / adapter.frames_per_unit) for f in videos],
                 "question": question, "source": source, "model_family": adapter.family},
    )


# -- inputs ----------------------------------------------------------------------------------------
def _rgb(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def _animated(path: pathlib.Path) -> list[np.ndarray]:
    with Image.open(path) as image:
        return [_rgb(frame) for frame in ImageSequence.Iterator(image)]


def _image_folder(path: pathlib.Path) -> list[np.ndarray]:
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    frames = []
    for file in files:
        with Image.open(file) as image:
            frames.append(_rgb(image))
    return frames


def image_message_to_rgb(msg, msgtype: str) -> np.ndarray:
    """sensor_msgs Image (rgb8, bgr8, mono8, rgba8, bgra8; rows may be padded) or CompressedImage."""
    if msgtype.endswith("CompressedImage"):
        with Image.open(io.BytesIO(bytes(msg.data))) as image:
            return _rgb(image)
    channels = {"rgb8": 3, "bgr8": 3, "mono8": 1, "rgba8": 4, "bgra8": 4}.get(msg.encoding)
    if channels is None:
        raise ValueError(f"image encoding '{msg.encoding}' is not supported (rgb8, bgr8, mono8, rgba8, bgra8)")
    row = msg.width * channels
    data = np.frombuffer(bytes(msg.data), dtype=np.uint8)
    if msg.step < row or data.size != msg.step * msg.height:
        raise ValueError(f"image data is {data.size} bytes, expected step {msg.step} >= {row} times {msg.height} rows")
    pixels = data.reshape(msg.height, msg.step)[:, :row].reshape(msg.height, msg.width, channels)
    if channels == 1:
        return np.repeat(pixels, 3, axis=2)
    if msg.encoding.startswith("bgr"):
        pixels = pixels[..., 2::-1]
    return np.ascontiguousarray(pixels[..., :3])


def _bag(path: pathlib.Path, topic: str, sample_fps: float) -> list[np.ndarray]:
    from rosbags.highlevel import AnyReader  # noqa: PLC0415
    from rosbags.typesys import Stores, get_typestore  # noqa: PLC0415

    with AnyReader([path], default_typestore=get_typestore(Stores.ROS2_HUMBLE)) as reader:
        images = [c for c in reader.connections if c.msgtype in IMAGE_TYPES]
        if topic:
            images = [c for c in images if c.topic == topic]
        if not images:
            found = sorted({c.topic for c in reader.connections if c.msgtype in IMAGE_TYPES}) or ["none"]
            raise ValueError(f"no image topic {topic or ''} in bag '{path}' (image topics: {', '.join(found)})")
        chosen = [c for c in images if c.topic == images[0].topic]
        frames, next_time = [], None
        for conn, log_time, raw in reader.messages(connections=chosen):
            msg = reader.deserialize(raw, conn.msgtype)
            stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9 or log_time * 1e-9
            if next_time is not None and stamp < next_time:
                continue  # sampled at sample_fps, as the node does
            next_time = stamp + 1.0 / sample_fps
            frames.append(image_message_to_rgb(msg, conn.msgtype))
        return frames


PROFILE_SEED = 600_000_000  # world streams no training or benchmark run draws


def read_sources(source: str, topic: str = "", sample_fps: float = 1.0,
                 synthetic_frames: int = 512, frames_per_video: int = 64) -> Iterator[list[np.ndarray]]:
    """Frame sequences (one per source video) from --input. ``synthetic``: shape-world streams
    (docs/world.md), one per video, each of its own size, colours and events."""
    if source == "synthetic":
        for k in range(max(1, -(-synthetic_frames // frames_per_video))):
            stream = world.make_stream(PROFILE_SEED + k, frames_per_video)
            yield [stream.frame(i) for i in range(len(stream))]
        return
    path = pathlib.Path(source).expanduser()
    if not path.exists():
        raise ValueError(f"--input '{source}' does not exist")
    if path.is_file():
        yield _animated(path)
    elif (path / "metadata.yaml").is_file():
        yield _bag(path, topic, sample_fps)
    elif any(p.suffix.lower() in IMAGE_SUFFIXES and p.suffix.lower() != ".gif" for p in path.iterdir()):
        yield _image_folder(path)
    else:
        for entry in sorted(path.iterdir()):
            if entry.is_dir():
                if (entry / "metadata.yaml").is_file():
                    yield _bag(entry, topic, sample_fps)
                else:
                    yield _image_folder(entry)
            elif entry.suffix.lower() in IMAGE_SUFFIXES:
                yield _animated(entry)


def cut_videos(sources: Iterator[list[np.ndarray]], frames_per_video: int, count: int) -> list[list[np.ndarray]]:
    """Consecutive windows of ``frames_per_video`` frames, at most ``count``; a source shorter than
    one window gives one shorter video."""
    videos: list[list[np.ndarray]] = []
    for frames in sources:
        if len(frames) < frames_per_video and frames:
            videos.append(frames)
        for start in range(0, len(frames) - frames_per_video + 1, frames_per_video):
            videos.append(frames[start:start + frames_per_video])
        if len(videos) >= count:
            break
    return videos[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamcache-profile", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--model", default="tiny-qwen2_5_vl", help="bundled model name, local path or hub id")
    parser.add_argument("--input", default="synthetic", help="synthetic | frames folder | animated image | rosbag2")
    parser.add_argument("--output", default="h2svc_head_map.json", help="head map file to write (JSON)")
    parser.add_argument("--videos", type=int, default=16, help="videos to profile (16-32: docs/h2svc.md §2.1)")
    parser.add_argument("--units", type=int, default=32,
                        help="stream units per video, N_v (a unit is 2 frames on Qwen2.5-VL)")
    parser.add_argument("--question", default=None,
                        help=f"(default: '{WORLD_QUESTION}' for synthetic input, else '{DEFAULT_QUESTION}')")
    parser.add_argument("--gqa-pooling", choices=("mean", "max"), default="mean")
    parser.add_argument("--ratios", type=float, nargs=3, default=list(DEFAULT_RATIOS),
                        metavar=("INSTANT", "SHORT", "EPISODIC"))
    parser.add_argument("--resplit", metavar="MAP", default="",
                        help="no profiling: split the scores of this head map by --ratios again, written to --output "
                             "(the ratios the policy uses by default, docs/h2svc.md \"Bank ratios chosen by data\")")
    parser.add_argument("--topic", default="", help="rosbag image topic (default: the first image topic)")
    parser.add_argument("--sample-fps", type=float, default=1.0)
    parser.add_argument("--chunk-units", type=int, default=8, help="units per prefill (same result, less memory)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args(argv)
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    if args.resplit:
        try:
            head_map = HeadMap.load(args.resplit).resplit(args.ratios)
            head_map.save(args.output)
        except (ValueError, OSError) as err:
            print(f"streamcache-profile: {err}", file=sys.stderr)
            return 2
        log(f"{args.output}: {args.resplit} split again by ratios {head_map.ratios} -> split {head_map.split}")
        return 0
    try:
        if args.videos < 1 or args.units < 1 or args.chunk_units < 1 or args.sample_fps <= 0:
            raise ValueError("--videos, --units and --chunk-units must be >= 1 and --sample-fps > 0")
        if args.input != "synthetic" and not pathlib.Path(args.input).expanduser().exists():
            raise ValueError(f"--input '{args.input}' does not exist")
        adapter = load_adapter(args.model, device=args.device, dtype=args.dtype, sample_fps=args.sample_fps)
        per_video = args.units * adapter.frames_per_unit
        sources = read_sources(args.input, args.topic, args.sample_fps, synthetic_frames=per_video * args.videos,
                               frames_per_video=per_video)
        videos = cut_videos(sources, per_video, args.videos)
        if not videos:
            raise ValueError(f"--input '{args.input}' holds no frames")
        question = args.question or (WORLD_QUESTION if args.input == "synthetic" else DEFAULT_QUESTION)
        head_map = profile(adapter, videos, question, args.gqa_pooling, args.ratios, args.chunk_units,
                           source=args.input, log=log)
        head_map.save(args.output)
    except (ValueError, StreamCacheError, OSError) as err:
        print(f"streamcache-profile: {err}", file=sys.stderr)
        return 2
    names = ("instantaneous", "short-term", "episodic")
    log(f"{args.output}: {head_map.num_layers}x{head_map.num_kv_heads} KV heads of {head_map.model_id} -> "
        + ", ".join(f"{n} {c}" for n, c in zip(names, head_map.split)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
