"""Long memory with and without the archive, over held-out streams of an hour (docs/archive.md).

    python bench/archive_recall.py                                  # 4 hour-long streams, Qwen world model
    python bench/archive_recall.py --frames 600 --streams 1         # a quick look
    python bench/archive_recall.py --model world-llava_onevision --out bench/reported

Each held-out world stream (seeds from 510 000 000: no training run draws them) is fed as fast as the
engine takes it through one Session per bounded policy at 1/8 of the full cache's bytes at 512
frames (bench/accuracy.py's equal-bytes knobs), each with an archive. At marks along the stream
every long-memory kind whose precondition holds is asked twice of the *same* memory: once with the
archive (recall on) and once without it (the archive detached for that question: what the bounded
working memory alone answers). The GPU cache is the same for both by construction; the run checks
it. ``last_seen`` / ``first_seen`` go through ``when`` (±2 s). Beside them, in the same run, the
full cache at 128 frames of each stream: the target's reference.

Recorded per mark: accuracy per kind, with and without; a question's cost in ms and as a multiple
of one ask on the working memory; KV bytes, process RSS and archive bytes; per-chunk time.
"""
from __future__ import annotations

import argparse
import contextlib
import pathlib
import shutil
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from accuracy import (LAST_SEEN_TOLERANCE_S, geometry_for, hour_points, load, make_session,  # noqa: E402
                      policy_knobs, wilson)
from common import ROOT, table, write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine.recall.archive import Archive, ArchiveSettings  # noqa: E402

SEED = 510_000_000
OPTION_KINDS = ("first_color", "first_shape", "seen")
WHEN_MODES = {"last_seen": "last", "first_seen": "first"}
KINDS = OPTION_KINDS + tuple(WHEN_MODES)
REFERENCE_FRAMES = 128
EQUAL_BYTES_AT = 512


@contextlib.contextmanager
def set_aside(owner, name: str):
    """``owner.<name>`` set to None for one question, then put back."""
    kept = getattr(owner, name)
    setattr(owner, name, None)
    try:
        yield
    finally:
        setattr(owner, name, kept)


def working_memory_only(session):
    """The archive detached for one question: what the bounded working memory alone answers."""
    return set_aside(session.memory, "archive")


def without_index(session):
    """The index set aside for one question: the archive ranked by the keys, a ``when`` walked."""
    return set_aside(session.memory, "encoder")


def ask(session, q, stream, window: tuple[float, float] | None = None) -> tuple[bool, float, int]:
    """(right, ms, chunks recalled) for one world question (over ``window`` when given)."""
    started = time.perf_counter()
    if q.kind in WHEN_MODES:
        found = session.when(q.probe, WHEN_MODES[q.kind])
        right = found.found and abs(found.stamp - stream.stamp(q.answer_frame)) <= LAST_SEEN_TOLERANCE_S
        return right, (time.perf_counter() - started) * 1e3, found.recalled_chunks
    since, until = window or (None, None)
    answer = session.ask(q.text, q.options, since=since, until=until)
    return answer.option_index == q.answer_index, (time.perf_counter() - started) * 1e3, answer.recalled_chunks


def run_stream(adapter, seed: int, frames: int, policies: tuple[str, ...], fraction: float, folder: pathlib.Path,
               recall_chunks: int, marks: list[int] | None = None, trace_every: int = 0,
               trace: list[dict] | None = None, budget_tokens: int = 0, head_map_path: str = "",
               encoder=None, compare: bool = True) -> list[dict]:
    points = sorted(set(marks or hour_points(frames)) | {REFERENCE_FRAMES})
    stream = world.make_long_stream(seed, frames, question_points=points)
    g = geometry_for(adapter, stream.look, head_map_path)
    full_tokens = g.prefix + EQUAL_BYTES_AT / g.frames_per_unit * g.tokens_per_unit
    target = g.prefix + budget_tokens if budget_tokens else fraction * full_tokens
    sessions = {}
    for policy in policies:
        session = make_session(adapter, policy, policy_knobs(policy, target, g), head_map_path)
        identity = {"model_id": adapter.model_id, "config_hash": adapter.config_hash}
        settings = ArchiveSettings(str(folder / f"{seed}-{policy}"), recall_chunks=recall_chunks)
        session.attach_archive(Archive.open(settings, identity, owner=f"bench/{policy}"), encoder=encoder)
        sessions[policy] = session
    reference = make_session(adapter, "full", {})
    records, chunk_ms = [], defaultdict(list)
    for i in range(frames):
        rgb = stream.frame(i)
        for policy, session in sessions.items():
            started = time.perf_counter()
            report = session.add_frame(rgb, stamp=stream.stamp(i))
            if report is not None:
                chunk_ms[policy].append((time.perf_counter() - started) * 1e3)
        if i < REFERENCE_FRAMES:
            reference.add_frame(rgb, stamp=stream.stamp(i))
        n = i + 1
        if trace is not None and trace_every and n % trace_every == 0:
            trace.extend(memory_state(seed, n, policy, session, chunk_ms[policy]) for policy, session in sessions.items())
        if n not in points:
            continue
        rng = np.random.default_rng((seed, n, 5))
        questions = stream.questions(n, rng, KINDS)
        base = {"seed": seed, "length": n}
        if n == REFERENCE_FRAMES:
            for q in questions:
                right, ms, _ = ask(reference, q, stream)
                records.append({**base, "policy": "full", "archive": False, "kind": q.kind, "correct": right, "ms": ms})
            continue
        for policy, session in sessions.items():
            one_ask = []
            with working_memory_only(session):
                for _ in range(3):  # the unit of cost: one ask on the working memory
                    started = time.perf_counter()
                    session.ask("How many objects are in view now?", ["0", "1", "2"])
                    one_ask.append((time.perf_counter() - started) * 1e3)
            status = session.status()
            state = {"kv_bytes": status.cache.kv_bytes, "rss_bytes": status.process_rss_bytes,
                     "archive_bytes": status.archive.bytes, "archive_chunks": status.archive.chunks,
                     "chunk_ms": float(np.median(chunk_ms[policy][-50:])), "one_ask_ms": float(np.median(one_ask))}
            for q in questions:
                with working_memory_only(session):
                    right, ms, _ = ask(session, q, stream)
                records.append({**base, **state, "policy": policy, "archive": False, "kind": q.kind, "correct": right,
                                "ms": ms})
                right, ms, recalled = ask(session, q, stream)
                records.append({**base, **state, "policy": policy, "archive": True, "kind": q.kind, "correct": right,
                                "ms": ms, "recalled_chunks": recalled, "index": encoder is not None})
                if encoder is not None and compare:  # side by side on the same memory: the archive without its index
                    with without_index(session):
                        right, ms, recalled = ask(session, q, stream)
                    records.append({**base, **state, "policy": policy, "archive": True, "kind": q.kind,
                                    "correct": right, "ms": ms, "recalled_chunks": recalled, "index": False})
                if q.kind == "seen":  # the same question over its own window: the whole stream so far
                    right, ms, recalled = ask(session, q, stream, (stream.stamp(0), stream.stamp(n - 1)))
                    records.append({**base, **state, "policy": policy, "archive": True, "kind": "seen@window",
                                    "correct": right, "ms": ms, "recalled_chunks": recalled,
                                    "index": encoder is not None})
            assert session.status().cache.kv_bytes == status.cache.kv_bytes  # recall leaves the cache as it was
    for session in sessions.values():
        session.close_archive()
    return records


def memory_state(seed: int, n: int, policy: str, session, chunk_ms: list[float]) -> dict:
    """What the memory costs at one point of the stream: the flat-cost check over a long run."""
    status = session.status()
    recent = chunk_ms[-200:]
    return {"seed": seed, "length": n, "policy": policy, "kv_bytes": status.cache.kv_bytes,
            "rss_bytes": status.process_rss_bytes, "archive_bytes": status.archive.bytes,
            "archive_chunks": status.archive.chunks, "chunk_ms": round(float(np.median(recent)), 2) if recent else None}


def summarise(records: list[dict]) -> dict:
    """Per (policy, archive, mark, kind): accuracy with its 95% interval and n; per (policy, mark):
    the cost and the memory."""
    cells = defaultdict(list)
    for r in records:
        config = "+archive" + ("+index" if r.get("index") else "") if r["archive"] else ""
        cells[(r["policy"], config, r["length"], r["kind"])].append(r["correct"])
        cells[(r["policy"], config, "all", r["kind"])].append(r["correct"])
        if r["kind"] in KINDS:
            cells[(r["policy"], config, r["length"], "long-memory")].append(r["correct"])
            cells[(r["policy"], config, "all", "long-memory")].append(r["correct"])
    accuracy = {}
    for (policy, archive, length, kind), hits in sorted(cells.items(), key=str):
        low, high = wilson(sum(hits), len(hits))
        accuracy.setdefault(f"{policy}{archive}", {}).setdefault(str(length), {})[kind] = {
            "accuracy": round(float(np.mean(hits)), 3), "low": round(low, 3), "high": round(high, 3), "n": len(hits)}
    cost = {}
    indexes = sorted({bool(r.get("index")) for r in records if r["archive"]})
    for policy, indexed in [(p, i) for p in sorted({r["policy"] for r in records if r["policy"] != "full"})
                            for i in indexes]:
        for length in sorted({r["length"] for r in records if r["policy"] == policy}):
            rows = [r for r in records if r["policy"] == policy and r["length"] == length]
            with_archive = [r for r in rows if r["archive"] and r.get("index", False) == indexed and r["kind"] in KINDS]
            one = float(np.median([r["one_ask_ms"] for r in rows]))
            cost.setdefault(policy + ("+index" if indexed else ""), {})[str(length)] = {
                "one_ask_ms": round(one, 2),
                "ask_ms_archive": round(float(np.median([r["ms"] for r in with_archive if r["kind"] in OPTION_KINDS])), 2),
                "when_ms_archive": round(float(np.median([r["ms"] for r in with_archive if r["kind"] in WHEN_MODES])), 2),
                "ask_multiple": round(float(np.median([r["ms"] / one for r in with_archive if r["kind"] in OPTION_KINDS])), 2),
                "when_multiple": round(float(np.median([r["ms"] / one for r in with_archive if r["kind"] in WHEN_MODES])), 2),
                "recalled_chunks": float(np.median([r.get("recalled_chunks", 0) for r in with_archive])),
                "kv_bytes": int(np.median([r["kv_bytes"] for r in rows])),
                "rss_mib": round(float(np.median([r["rss_bytes"] for r in rows])) / 2**20, 1),
                "archive_bytes": int(np.median([r["archive_bytes"] for r in rows])),
                "chunk_ms": round(float(np.median([r["chunk_ms"] for r in rows])), 2)}
    return {"accuracy": accuracy, "cost": cost}


def print_summary(summary: dict, frames: int) -> None:
    rows = []
    for config, marks in summary["accuracy"].items():
        for length, kinds in sorted(marks.items(), key=lambda kv: (kv[0] == "all", int(kv[0]) if kv[0] != "all" else 0)):
            rows.append({"config": config, "frames": length,
                         **{k: f"{kinds[k]['accuracy']:.2f} ({kinds[k]['n']})" if k in kinds else "" for k in
                            (*KINDS, "seen@window", "long-memory")}})
    print(table(rows, [("config", "config"), ("frames", "frames")] + [(k, k) for k in (*KINDS, "seen@window",
                                                                                      "long-memory")]))
    rows = [{"policy": p, "frames": n, **c} for p, marks in summary["cost"].items() for n, c in marks.items()]
    print(table(rows, [(k, k) for k in ("policy", "frames", "one_ask_ms", "ask_multiple", "when_multiple",
                                        "recalled_chunks", "kv_bytes", "rss_mib", "archive_bytes", "chunk_ms")]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="world-qwen2_5_vl")
    parser.add_argument("--frames", type=int, default=3600)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--policies", nargs="+", default=["fifo", "uniform", "hermes"])
    parser.add_argument("--fraction", type=float, default=1 / 8)
    parser.add_argument("--budget-tokens", type=int, default=0,
                        help="instead of --fraction: video tokens per layer for every policy (the node's budget_tokens)")
    parser.add_argument("--recall-chunks", type=int, default=4)
    parser.add_argument("--retrieval", default="auto",
                        help="retrieval_model_path: the index (auto: the bundled one for a world model; none: off); "
                             "with one, each archive question is asked again without it, side by side")
    parser.add_argument("--no-compare", action="store_true",
                        help="with an index, do not ask again without it (a day's walks take hours)")
    parser.add_argument("--marks", type=int, nargs="+", default=None,
                        help="stream lengths at which to ask (default: six even marks, and 128)")
    parser.add_argument("--trace-every", type=int, default=0,
                        help="record KV bytes, RSS, archive bytes and chunk time every N frames")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="where the JSON goes (default bench/results)")
    parser.add_argument("--name", default="", help="the JSON's name (default archive_recall-<model>-<frames>)")
    args = parser.parse_args(argv)
    adapter = load(args.model)
    from streamcache_ros.engine.adapters.models import resolve_model_path  # noqa: PLC0415

    head_map = pathlib.Path(resolve_model_path(args.model)) / "h2svc_head_map.json"
    head_map_path = str(head_map) if head_map.is_file() else ""  # h2svc needs the model's own
    from streamcache_ros.engine.adapters.models import resolve_retrieval_path  # noqa: PLC0415
    from streamcache_ros.engine.recall.index import RetrievalEncoder  # noqa: PLC0415

    retrieval = "" if args.retrieval == "none" else resolve_retrieval_path(args.retrieval, adapter.model_id)
    encoder = RetrievalEncoder.load(retrieval) if retrieval else None
    folder = pathlib.Path(tempfile.mkdtemp(prefix="archive-bench-"))
    records, trace = [], []
    started = time.perf_counter()
    try:
        for s in range(args.streams):
            records += run_stream(adapter, SEED + s, args.frames, tuple(args.policies), args.fraction, folder,
                                  args.recall_chunks, args.marks, args.trace_every, trace, args.budget_tokens,
                                  head_map_path, encoder, not args.no_compare)
            print(f"stream {s + 1}/{args.streams} done, {time.perf_counter() - started:.0f} s", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = summarise(records)
    print_summary(summary, args.frames)
    name = args.name or f"archive_recall-{args.model}-{args.frames}"
    path = write_json(name, {"model": args.model, "frames": args.frames, "streams": args.streams,
                             "policies": args.policies, "fraction": args.fraction,
                             "budget_tokens": args.budget_tokens,
                             "recall_chunks": args.recall_chunks, "marks": args.marks, "summary": summary,
                             "retrieval": args.retrieval, "seeds_from": SEED,
                             "trace": trace, "records": records,
                             "wall_s": round(time.perf_counter() - started, 1)}, args.out)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
