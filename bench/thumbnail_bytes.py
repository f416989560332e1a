"""What the archive's thumbnails cost, beside the embeddings they sit with: every frame, or a key frame.

    python bench/thumbnail_bytes.py --out bench/reported

Measured on this CPU: the JPEG bytes of a frame's thumbnail (thumbnails.encode) at several longest
sides, over shape-world frames of several looks (sizes up to 1280x720, the noisiest the world draws:
noise is what JPEG pays for), and the time to make one; per hour at 1 fps for every frame and for
one key frame a chunk. Then the bundled world models' archive through a Session (embeddings and
thumbnails as written in the chunk's row), and the 7B shapes' embeddings per hour (computed from the
configs' shapes, as bench/archive_sizes.py does: labelled computed) beside the thumbnails per hour.
docs/show.md "Bytes" reads it.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from archive_sizes import FRAMES_PER_HOUR, computed_sizes  # noqa: E402
from common import table, write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine.factory import build_session  # noqa: E402
from streamcache_ros.engine.recall.archive.thumbnails import DEFAULT_THUMBNAIL_PX, encode  # noqa: E402

SIDES = (96, 128, 160, 224, 320)
TEXTURED = "640x480 1/f texture (stand-in for a camera)"
CHUNK_FRAMES = 8  # the default chunk_frames: a key frame a chunk is 1/8 of every frame
MIB = 1 << 20


def looks() -> dict[str, world.Look]:
    base = dict(background=(60, 70, 50), colour_jitter=10, jitter_per_frame=True, encoding="rgb8")
    return {"320x240 clean": world.Look(320, 240, noise=0, **base),
            "640x480 noise 4": world.Look(640, 480, noise=4, **base),
            "1280x720 noise 8 (worst)": world.Look(1280, 720, noise=8, **base)}


def textured(count: int, height: int = 480, width: int = 640) -> list[np.ndarray]:
    """Frames of 1/f noise, the spectrum of natural scenes: detail at every scale survives the
    downscale, unlike the world's flat shapes and pixel noise; a stand-in for a real camera (no
    camera images ship with the repository), not a measurement of one."""
    rng = np.random.default_rng(7_000_003)
    fy, fx = np.meshgrid(np.fft.fftfreq(height), np.fft.fftfreq(width), indexing="ij")
    falloff = 1.0 / np.maximum(np.hypot(fy, fx), 1.0 / max(height, width))
    frames = []
    for _ in range(count):
        spectrum = falloff[..., None] * np.exp(2j * np.pi * rng.random((height, width, 3)))
        image = np.real(np.fft.ifft2(spectrum, axes=(0, 1)))
        image = (image - image.mean()) / (image.std() + 1e-9) * 48 + 128
        frames.append(np.clip(image, 0, 255).astype(np.uint8))
    return frames


def measured_sides(frames_per_look: int) -> list[dict]:
    rows = []
    sources = {name: [world.make_stream(7_000_001, frames_per_look, look=look).frame(i) for i in range(frames_per_look)]
               for name, look in looks().items()}
    sources[TEXTURED] = textured(frames_per_look)
    for name, frames in sources.items():
        for side in SIDES:
            sizes, took = [], []
            for frame in frames:
                started = time.perf_counter()
                sizes.append(len(encode(frame, side)))
                took.append((time.perf_counter() - started) * 1e3)
            per_frame = float(np.mean(sizes))
            rows.append({"look": name, "longest_px": side, "bytes_per_frame": round(per_frame),
                         "every_frame_mib_per_hour": round(per_frame * FRAMES_PER_HOUR / MIB, 2),
                         "key_frame_mib_per_hour": round(per_frame * FRAMES_PER_HOUR / CHUNK_FRAMES / MIB, 2),
                         "encode_ms": round(float(np.median(took)), 3), "source": "measured"})
    return rows


def measured_world(model: str, frames: int) -> dict:
    """The archive a bundled model writes (default thumbnails), per chunk and per hour at 1 fps."""
    with tempfile.TemporaryDirectory() as folder:
        session = build_session({"model_path": model, "policy": "full", "archive_path": folder})
        stream = world.make_stream(7_000_002, frames)  # the look drawn as training drew them
        for i in range(frames):
            session.add_frame(stream.frame(i), stream.stamp(i))
        store = session.memory.archive.store
        chunks, total, thumbs = store.db.execute(
            "SELECT COUNT(*), SUM(bytes), SUM(LENGTH(thumbnails)) FROM chunks").fetchone()
        (sizes,) = store.db.execute("SELECT thumbnail_sizes FROM chunks LIMIT 1").fetchone()
        session.close_archive()
    per_frame_payload = (total - thumbs) / (chunks * CHUNK_FRAMES)
    per_frame_thumb = thumbs / (chunks * CHUNK_FRAMES)
    return {"model": model, "look": f"{stream.look.width}x{stream.look.height} noise {stream.look.noise}",
            "longest_px": DEFAULT_THUMBNAIL_PX, "chunks": chunks, "frames_per_chunk": len(json.loads(sizes)),
            "embeddings_etc_bytes_per_chunk": round((total - thumbs) / chunks),
            "thumbnail_bytes_per_chunk": round(thumbs / chunks),
            "embeddings_etc_mib_per_hour": round(per_frame_payload * FRAMES_PER_HOUR / MIB, 2),
            "thumbnails_every_frame_mib_per_hour": round(per_frame_thumb * FRAMES_PER_HOUR / MIB, 2),
            "thumbnails_key_frame_mib_per_hour": round(per_frame_thumb * FRAMES_PER_HOUR / CHUNK_FRAMES / MIB, 2),
            "source": "measured (archive written through a Session)"}


def beside_7b(sides: list[dict]) -> list[dict]:
    """The 7B shapes' embeddings per hour (computed) beside the thumbnails per hour measured at the
    default side on a world look and on the textured stand-in for a camera."""
    rows = []
    for shape in computed_sizes():
        embeds = shape["embeds_fp16_gib_per_hour"] * 1024
        for side in sides:
            if side["longest_px"] != DEFAULT_THUMBNAIL_PX or side["look"] not in ("640x480 noise 4", TEXTURED):
                continue
            every = side["every_frame_mib_per_hour"]
            rows.append({"model": shape["model"], "embeds_fp16_mib_per_hour": round(embeds),
                         "embeds_source": "computed from config shapes", "thumbnail_look": side["look"],
                         "longest_px": DEFAULT_THUMBNAIL_PX, "thumbnails_every_frame_mib_per_hour": every,
                         "thumbnails_share_of_embeds": round(every / embeds, 4),
                         "thumbnails_source": "measured on " + ("textured frames" if side["look"] == TEXTURED
                                                                 else "world frames")})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=24, help="frames a look is measured over")
    parser.add_argument("--model-frames", type=int, default=64, help="frames through each bundled model")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    sides = measured_sides(args.frames)
    print(table(sides, [(k, k) for k in ("look", "longest_px", "bytes_per_frame", "every_frame_mib_per_hour",
                                         "key_frame_mib_per_hour", "encode_ms")]))
    bundled = [measured_world(m, args.model_frames) for m in ("world-qwen2_5_vl", "world-llava_onevision")]
    print(table(bundled, [(k, k) for k in ("model", "look", "embeddings_etc_bytes_per_chunk",
                                           "thumbnail_bytes_per_chunk", "embeddings_etc_mib_per_hour",
                                           "thumbnails_every_frame_mib_per_hour",
                                           "thumbnails_key_frame_mib_per_hour")]))
    big = beside_7b(sides)
    print(table(big, [(k, k) for k in ("model", "embeds_fp16_mib_per_hour", "thumbnail_look",
                                       "thumbnails_every_frame_mib_per_hour", "thumbnails_share_of_embeds")]))
    path = write_json("thumbnail_bytes", {"frames_per_hour": FRAMES_PER_HOUR, "default_longest_px": DEFAULT_THUMBNAIL_PX,
                                          "sides": sides, "bundled_models": bundled, "beside_7b": big}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
