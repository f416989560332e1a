"""How well the archive's index finds the moment: precision@4 and recall@16 on held-out hour streams,
the index's bytes per hour, and the time to rank a day (docs/archive.md "The index").

    python bench/index_precision.py                          # 3 held-out hours, the bundled world-retrieval
    python bench/index_precision.py --streams 1 --frames 600 # a quick look
    python bench/index_precision.py --retrieval /path/to/siglip --out bench/reported

For every identity in view somewhere in a held-out stream (seeds from 510 000 000, as
bench/archive_recall.py: no training run draws them), the question "Did you see a {colour}
{shape}?" ranks the stream's units; a unit is relevant when the identity is in view in it. Units are
frames, and chunks of 8 frames (a chunk's score: its best frame), which is what a ``when`` replays.
recall@16 is out of min(16, relevant units). Beside them, in the same run: chance (the share of
relevant units: what a ranking that knows nothing scores), and the false yes at the index's threshold
on hard negatives (frames where only the asked colour, or only the asked shape, is in view) and on
identities never in view. The keys the archive ranked by before (the VLM's evidence-layer keys)
held the identity in 0.34-0.41 of their 4 best units (docs/archive.md "Recall"): that figure is the
baseline this is measured against.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import ROOT, table, write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine.adapters.models import resolve_retrieval_path  # noqa: E402
from streamcache_ros.engine.recall.archive import ArchiveStore, EncodedChunk  # noqa: E402
from streamcache_ros.engine.recall.index import (RetrievalEncoder, precision_at, rank_frames, recall_at,  # noqa: E402
                                                 sightings)

SEED = 510_000_000
CHUNK = 8
DAY_FRAMES = 86_400


def stream_records(encoder: RetrievalEncoder, seed: int, frames: int) -> tuple[list[dict], float]:
    stream = world.make_long_stream(seed, frames, absent=world.kept_out(seed))  # three never shown: "no" to ask
    started = time.perf_counter()
    vectors = np.concatenate([encoder.embed_frames([stream.frame(i) for i in range(s, min(s + 256, frames))])
                              for s in range(0, frames, 256)])
    embed_ms = (time.perf_counter() - started) * 1e3 / frames
    present = [{v.identity for v in stream.truth[i]} for i in range(frames)]
    colours = [{v.colour for v in stream.truth[i]} for i in range(frames)]
    shapes = [{v.shape for v in stream.truth[i]} for i in range(frames)]
    chunks = np.arange(frames) // CHUNK
    records = []
    for shape in world.SHAPES:
        for colour in world.COLOUR_NAMES:
            identity = (shape, colour)
            p = rank_frames(vectors, encoder.embed_text(world.SEEN_PROBE.format(shape=shape, colour=colour)),
                            encoder.probability)
            relevant = np.array([identity in ids for ids in present])
            said = p >= encoder.settings.threshold
            hard = np.array([identity not in ids and ((colour in c) != (shape in s))
                             for ids, c, s in zip(present, colours, shapes)])
            # a chunk (what a when verifies) where only the asked colour or shape is in view: does
            # the index propose it (a sighting, the run rule applied)?
            starts = np.arange(0, frames, CHUNK)
            sighted = np.logical_or.reduceat(sightings(p, encoder.settings.threshold, encoder.settings.min_run), starts)
            chunk_hard = np.logical_or.reduceat(hard, starts) & ~np.logical_or.reduceat(relevant, starts)
            record = {"seed": seed, "identity": f"{colour} {shape}", "frames_in_view": int(relevant.sum()),
                      # "was it ever in view?", by the index alone: a sighting anywhere in the stream
                      "sighted_anywhere": bool(sighted.any()),
                      "hard_negative_chunks": int(chunk_hard.sum()),
                      "hard_negative_chunks_sighted": int((sighted & chunk_hard).sum()),
                      "hard_negative_frames": int(hard.sum()),
                      "hard_negative_false_yes": int(said[hard].sum()),
                      "false_yes_frames": int(said[~relevant].sum()), "negative_frames": int((~relevant).sum())}
            if relevant.any():
                chunk_p = np.maximum.reduceat(p, np.arange(0, frames, CHUNK))
                chunk_relevant = np.logical_or.reduceat(relevant, np.arange(0, frames, CHUNK))
                record.update({
                    "frame_p@4": precision_at(p, relevant, 4), "frame_r@16": recall_at(p, relevant, 16),
                    "chunk_p@4": precision_at(chunk_p, chunk_relevant, 4),
                    "chunk_r@16": recall_at(chunk_p, chunk_relevant, 16),
                    "frame_chance": float(relevant.mean()), "chunk_chance": float(chunk_relevant.mean()),
                    "frame_recall_at_threshold": float(said[relevant].mean()),
                    "last_frame_error_s": _edge_error(p, relevant, encoder.settings.threshold, True, 1),
                    "first_frame_error_s": _edge_error(p, relevant, encoder.settings.threshold, False, 1),
                    "last_run_error_s": _edge_error(p, relevant, encoder.settings.threshold, True,
                                                    encoder.settings.min_run),
                    "first_run_error_s": _edge_error(p, relevant, encoder.settings.threshold, False,
                                                     encoder.settings.min_run)})
            else:
                record["never_in_view_any_yes"] = bool(said.any())
                record["never_in_view_sighted"] = bool(sighted.any())
            records.append(record)
    del chunks
    return records, embed_ms


def _edge_error(p: np.ndarray, relevant: np.ndarray, threshold: float, last: bool, min_run: int) -> float | None:
    """Seconds between the newest (oldest) sighting the index finds and the truth: what a ``when``
    answers when its verifier confirms the index's first candidate."""
    above = np.flatnonzero(sightings(p, threshold, min_run))
    truth = np.flatnonzero(relevant)
    if not len(above):
        return None
    return float(abs((above[-1] - truth[-1]) if last else (above[0] - truth[0])))


def index_size_and_day_ranking(encoder: RetrievalEncoder, folder: pathlib.Path) -> dict:
    """The SQLite bytes the index adds per hour (an hour of chunks with and without vectors), and the
    time to read and rank a day's frames from the archive (the path a ``when`` takes)."""
    dim = encoder.dim
    rng = np.random.default_rng(0)

    def fill(path, frames: int, with_vectors: bool) -> ArchiveStore:
        store = ArchiveStore.open(path, {"model_id": "bench", "config_hash": "0"}, max_bytes=1 << 40)
        store.use_index(encoder.model_id)
        for start in range(0, frames, CHUNK):
            stamps = [float(s) for s in range(start, start + CHUNK)]
            vectors = rng.normal(size=(CHUNK, dim)).astype(np.float32) if with_vectors else None
            store.append(EncodedChunk("cam", stamps, [(i, i + 1) for i in range(0, CHUNK, 2)], 1, torch.zeros(4, 8),
                                      torch.zeros(3, 4), vectors))
        return store

    sizes = {}
    for with_vectors in (False, True):
        store = fill(folder / f"hour-{with_vectors}", 3600, with_vectors)
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        sizes[with_vectors] = store.stats()["file_bytes"]
        store.close()
    day = fill(folder / "day", DAY_FRAMES, True)
    query = encoder.embed_text("Did you see a red circle?")
    started = time.perf_counter()
    day.frame_index()  # the first ranking reads every row's vectors from disk into RAM
    first_read_ms = (time.perf_counter() - started) * 1e3
    read_ms, rank_ms = [], []
    for _ in range(5):
        started = time.perf_counter()
        stamps, _, vectors, _ = day.frame_index()
        read = time.perf_counter()
        rank_frames(vectors, query, encoder.probability)
        read_ms.append((read - started) * 1e3)
        rank_ms.append((time.perf_counter() - read) * 1e3)
    day.close()
    return {"dim": dim, "vector_bytes_per_hour": 3600 * dim * 2,
            "file_bytes_per_hour_without_index": sizes[False], "file_bytes_per_hour_with_index": sizes[True],
            "index_file_bytes_per_hour": sizes[True] - sizes[False],
            "day_frames": int(len(stamps)), "day_first_read_ms": round(first_read_ms, 1),
            "day_read_ms": round(float(np.median(read_ms)), 1),
            "day_rank_ms": round(float(np.median(rank_ms)), 2)}


def summarise(records: list[dict]) -> dict:
    seen = [r for r in records if r["frames_in_view"]]
    never = [r for r in records if not r["frames_in_view"]]

    def mean_sd(key):
        values = np.array([r[key] for r in seen if r.get(key) is not None], dtype=float)
        return {"mean": round(float(values.mean()), 3), "sd": round(float(values.std()), 3), "n": int(len(values))}

    hard_frames = sum(r["hard_negative_frames"] for r in records)
    within = [r for r in seen if r["last_frame_error_s"] is not None]
    return {
        **{key: mean_sd(key) for key in ("frame_p@4", "frame_r@16", "chunk_p@4", "chunk_r@16", "frame_chance",
                                         "chunk_chance", "frame_recall_at_threshold")},
        "hard_negative_false_yes": round(sum(r["hard_negative_false_yes"] for r in records) / max(hard_frames, 1), 4),
        "hard_negative_frames": hard_frames,
        "hard_negative_chunk_false_yes": round(sum(r["hard_negative_chunks_sighted"] for r in records)
                                               / max(sum(r["hard_negative_chunks"] for r in records), 1), 4),
        "hard_negative_chunks": sum(r["hard_negative_chunks"] for r in records),
        "false_yes_all_negatives": round(sum(r["false_yes_frames"] for r in records)
                                         / max(sum(r["negative_frames"] for r in records), 1), 4),
        "never_in_view_any_yes": round(float(np.mean([r["never_in_view_any_yes"] for r in never])), 3) if never else None,
        "never_in_view_sighted": round(float(np.mean([r["never_in_view_sighted"] for r in never])), 3) if never else None,
        "never_in_view_n": len(never),
        # "was it ever in view?" answered by the index's sightings, against always-yes and always-no
        "ever_in_view_accuracy": round(float(np.mean([r["sighted_anywhere"] == bool(r["frames_in_view"])
                                                       for r in records])), 3),
        "ever_in_view_always_yes": round(len(seen) / len(records), 3),
        "ever_in_view_always_no": round(len(never) / len(records), 3),
        "last_within_2s_unverified": round(float(np.mean([r["last_frame_error_s"] <= 2 for r in within])), 3) if within else None,
        "first_within_2s_unverified": round(float(np.mean([r["first_frame_error_s"] <= 2 for r in within])), 3) if within else None,
        **{f"{edge}_within_2s_unverified_runs": round(float(np.mean(
            [r[f"{edge}_run_error_s"] is not None and r[f"{edge}_run_error_s"] <= 2 for r in seen])), 3)
           for edge in ("last", "first")},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--retrieval", default="world-retrieval", help="retrieval_model_path (a folder or bundled name)")
    parser.add_argument("--frames", type=int, default=3600)
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--name", default="index_precision")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    encoder = RetrievalEncoder.load(resolve_retrieval_path(args.retrieval, "world-"))
    started = time.perf_counter()
    records, embed_ms = [], []
    for s in range(args.streams):
        found, ms = stream_records(encoder, SEED + s, args.frames)
        records += found
        embed_ms.append(ms)
        print(f"stream {s + 1}/{args.streams}: {time.perf_counter() - started:.0f} s", flush=True)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="index-bench-"))
    try:
        size = index_size_and_day_ranking(encoder, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = summarise(records)
    summary["embed_ms_per_frame"] = round(float(np.median(embed_ms)), 3)
    print(table([{"measure": k, "value": v if not isinstance(v, dict) else f"{v['mean']:.3f} ± {v['sd']:.3f} (n {v['n']})"}
                 for k, v in {**summary, **size}.items()], [("measure", "measure"), ("value", "value")]))
    path = write_json(args.name, {"retrieval": args.retrieval, "frames": args.frames, "streams": args.streams,
                                  "seeds_from": SEED, "baseline_keys_p@4": "0.34-0.41 (docs/archive.md \"Recall\")",
                                  "summary": summary, "size_and_speed": size, "records": records,
                                  "wall_s": round(time.perf_counter() - started, 1)}, args.out)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
