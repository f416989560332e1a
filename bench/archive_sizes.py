"""What the archive keeps per chunk, chosen by measurement: embeddings to prefill again, or KV.

    python bench/archive_sizes.py --out bench/reported

Bytes per hour at 1 fps for the 7B shapes (Qwen2.5-VL-7B at 448x448, LLaVA-OneVision-7B at 384x384),
computed from their configs' shapes (this machine holds no 7B weights: labelled as computed), for
fp16 embeddings, fp16 KV of every layer and int8 KV; and, measured on this CPU with the bundled world
models, the time to bring one 8-frame chunk back each way: read its embeddings from the archive and
prefill them, or read a KV blob of the chunk's size and lay it out as tensors (what a KV archive
would do before the question could attend to it). docs/archive.md "Embeddings, not KV" reads it.
"""
from __future__ import annotations

import argparse
import pathlib
import sqlite3
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import table, write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine import Session, SessionConfig  # noqa: E402
from streamcache_ros.engine.recall.archive import Archive, ArchiveSettings  # noqa: E402
from streamcache_ros.engine.cache import make_policy  # noqa: E402
from streamcache_ros.engine.factory import build_session  # noqa: E402

FRAMES_PER_HOUR = 3600
# (layers, KV heads, head dim, hidden size, visual tokens per frame) from the models' configs
SHAPES_7B = {
    "Qwen2.5-VL-7B (448x448)": (28, 4, 128, 3584, (448 // 14) ** 2 // 4 // 2),  # 2x2 merge, 2 frames a patch
    "LLaVA-OneVision-7B (384x384)": (28, 4, 128, 3584, 196),  # 27x27 SigLIP patches pooled to 14x14
}


def computed_sizes() -> list[dict]:
    rows = []
    for name, (layers, kv_heads, head_dim, hidden, per_frame) in SHAPES_7B.items():
        tokens = per_frame * FRAMES_PER_HOUR
        kv16 = 2 * layers * kv_heads * head_dim * 2
        rows.append({"model": name, "tokens_per_frame": per_frame, "embeds_fp16_bytes_per_token": hidden * 2,
                     "kv_fp16_bytes_per_token": kv16, "kv_over_embeds": round(kv16 / (hidden * 2), 2),
                     "embeds_fp16_gib_per_hour": round(tokens * hidden * 2 / 2**30, 2),
                     "kv_fp16_gib_per_hour": round(tokens * kv16 / 2**30, 2),
                     "kv_int8_gib_per_hour": round(tokens * kv16 / 2 / 2**30, 2), "source": "computed from config shapes"})
    return rows


def measured_recall(model: str, repeats: int) -> dict:
    """One chunk back by replay (embeddings read, then prefilled) against a KV blob of the same chunk
    read and laid out, on the bundled ``model``, this CPU."""
    session = build_session({"model_path": model, "policy": "full"})
    adapter = session.adapter
    geometry = session.policy.geometry
    with tempfile.TemporaryDirectory() as folder:
        identity = {"model_id": adapter.model_id, "config_hash": adapter.config_hash}
        session.attach_archive(Archive.open(ArchiveSettings(folder, buffer_bytes=0), identity))
        stream = world.make_stream(510_999_000, 64)
        for i in range(64):
            session.add_frame(stream.frame(i), stream.stamp(i))
        archive = session.memory.archive
        rows = archive.rows()
        tokens = rows[-1].tokens_per_unit * len(rows[-1].unit_frames)
        kv_bytes = 2 * geometry.num_layers * geometry.num_kv_heads * geometry.head_dim * tokens * 2
        blob_db = sqlite3.connect(pathlib.Path(folder) / "kv.sqlite")
        blob_db.execute("CREATE TABLE kv (id INTEGER PRIMARY KEY, data BLOB)")
        with blob_db:
            blob_db.executemany("INSERT INTO kv (data) VALUES (?)", [(np.random.bytes(kv_bytes),) for _ in rows])
        replay, load_kv = [], []
        for r in range(repeats):
            row = rows[r % len(rows)]
            row.chunk = None
            started = time.perf_counter()
            scratch = Session(adapter, make_policy("full"), SessionConfig())
            archive.load([row])
            scratch.ledger.note_camera(row.camera)
            scratch.chunks.run_encoded(row.chunk, [])
            replay.append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            (data,) = blob_db.execute("SELECT data FROM kv WHERE id = ?", (row.chunk_id,)).fetchone()
            kv = torch.frombuffer(bytearray(data), dtype=torch.float16).view(2, geometry.num_layers, geometry.num_kv_heads,
                                                                              tokens, geometry.head_dim)
            [kv[:, layer].to(geometry.dtype).clone() for layer in range(geometry.num_layers)]
            load_kv.append((time.perf_counter() - started) * 1e3)
        session.close_archive()
    return {"model": model, "chunk_tokens": tokens, "embeds_bytes": rows[-1].bytes, "kv_fp16_bytes": kv_bytes,
            "replay_ms": round(float(np.median(replay)), 2), "kv_load_ms": round(float(np.median(load_kv)), 2),
            "repeats": repeats}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    sizes = computed_sizes()
    print(table(sizes, [(k, k) for k in ("model", "tokens_per_frame", "kv_over_embeds", "embeds_fp16_gib_per_hour",
                                         "kv_fp16_gib_per_hour", "kv_int8_gib_per_hour")]))
    measured = [measured_recall(m, args.repeats) for m in ("world-qwen2_5_vl", "world-llava_onevision")]
    print(table(measured, [(k, k) for k in ("model", "chunk_tokens", "embeds_bytes", "kv_fp16_bytes", "replay_ms",
                                            "kv_load_ms")]))
    path = write_json("archive_sizes", {"computed_7b": sizes, "measured_world": measured}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
