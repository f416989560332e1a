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

Negatives are asked as carefully as positives: each stream keeps three identities out on purpose
(never shown), so "no" is always there to ask. ``seen`` is the world's question (yes or no with even
odds: a "no" is an identity not seen so far); ``seen@window`` asks "did you see" over windows of 60
to 480 frames before the mark (yes or no with even odds; a "no" is seen elsewhere or never,
``world.ask_seen_in_window``); ``never_seen`` is ``when`` last for a kept-out identity (right: not
found) beside ``last_seen`` / ``first_seen`` for seen ones. For every yes/no kind the JSON reports what
always-yes and always-no score on the same mix, and the margin over the better.

Recorded per mark: accuracy per kind, with and without; a question's cost in ms and as a multiple
of one ask on the working memory (``when`` at its best, a moment found, and at its worst, never
true); KV bytes, process RSS and archive bytes; per-chunk time.
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
WHEN_MODES = {"last_seen": "last", "first_seen": "first", "never_seen": "last"}
KINDS = OPTION_KINDS + tuple(WHEN_MODES)
# the kinds answered yes or no (a when: found or not), and whether each record's truth is yes
YES_NO_KINDS = ("seen", "seen@window", "last_seen", "first_seen", "never_seen")
KEPT_OUT = 3  # identities each stream never shows, so that a long stream still has "no" to ask
WINDOW_SIZES = (60, 120, 480)
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


def never_seen(stream, n: int, absent: tuple, rng) -> world.Question:
    """``when`` last for an identity the stream never showed (its right answer: not found)."""
    shape, colour = absent[int(rng.integers(len(absent)))]
    probe = world.SEEN_PROBE.format(colour=colour, shape=shape)
    return world.Question("never_seen", probe, [], -1, n, [], answer_frame=-1, probe=probe)


def windowed_seen(stream, n: int, rng) -> list[world.Question]:
    """"Did you see" over a window of each WINDOW_SIZES before ``n`` (yes or no with even odds)."""
    out = []
    for size in WINDOW_SIZES:
        if size <= n:
            first = int(rng.integers(0, n - size + 1))
            out += stream.window_questions(n, first, first + size - 1, rng, ("seen",))
    return out


def truth_yes(q) -> bool | None:
    """Whether the true answer of a yes/no kind is yes (a when: found); None for other kinds."""
    if q.kind in ("last_seen", "first_seen"):
        return True
    if q.kind == "never_seen":
        return False
    return q.answer == "yes" if q.kind == "seen" else None


def ask(session, q, stream, window: tuple[float, float] | None = None) -> tuple[bool, float, int]:
    """(right, ms, chunks recalled) for one world question (over ``window`` when given)."""
    started = time.perf_counter()
    if q.kind in WHEN_MODES:
        found = session.when(q.probe, WHEN_MODES[q.kind])
        if q.kind == "never_seen":
            return not found.found, (time.perf_counter() - started) * 1e3, found.recalled_chunks
        right = found.found and abs(found.stamp - stream.stamp(q.answer_frame)) <= LAST_SEEN_TOLERANCE_S
        return right, (time.perf_counter() - started) * 1e3, found.recalled_chunks
    since, until = window or (None, None)
    answer = session.ask(q.text, q.options, since=since, until=until)
    return answer.option_index == q.answer_index, (time.perf_counter() - started) * 1e3, answer.recalled_chunks


def run_stream(adapter, seed: int, frames: int, policies: tuple[str, ...], fraction: float, folder: pathlib.Path,
               recall_chunks: int, marks: list[int] | None = None, trace_every: int = 0,
               trace: list[dict] | None = None, budget_tokens: int = 0, head_map_path: str = "",
               encoder=None, compare: bool = True, content: str = "auto") -> list[dict]:
    points = sorted(set(marks or hour_points(frames)) | {REFERENCE_FRAMES})
    absent = world.kept_out(seed, KEPT_OUT)
    stream = world.make_long_stream(seed, frames, question_points=points, absent=absent)
    g = geometry_for(adapter, stream.look, head_map_path)
    full_tokens = g.prefix + EQUAL_BYTES_AT / g.frames_per_unit * g.tokens_per_unit
    target = g.prefix + budget_tokens if budget_tokens else fraction * full_tokens
    sessions = {}
    for policy in policies:
        session = make_session(adapter, policy, policy_knobs(policy, target, g), head_map_path)
        identity = {"model_id": adapter.model_id, "config_hash": adapter.config_hash}
        settings = ArchiveSettings(str(folder / f"{seed}-{policy}"), recall_chunks=recall_chunks, content=content)
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
        questions = stream.questions(n, rng, [k for k in KINDS if k != "never_seen"]) + [never_seen(stream, n, absent, rng)]
        base = {"seed": seed, "length": n}
        if n == REFERENCE_FRAMES:
            for q in questions:
                right, ms, _ = ask(reference, q, stream)
                records.append({**base, "policy": "full", "archive": False, "kind": q.kind, "correct": right, "ms": ms,
                                "truth_yes": truth_yes(q)})
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
                yes = truth_yes(q)
                with working_memory_only(session):
                    right, ms, _ = ask(session, q, stream)
                records.append({**base, **state, "policy": policy, "archive": False, "kind": q.kind, "correct": right,
                                "ms": ms, "truth_yes": yes})
                right, ms, recalled = ask(session, q, stream)
                records.append({**base, **state, "policy": policy, "archive": True, "kind": q.kind, "correct": right,
                                "ms": ms, "recalled_chunks": recalled, "index": encoder is not None, "truth_yes": yes})
                if encoder is not None and compare:  # side by side on the same memory: the archive without its index
                    with without_index(session):
                        right, ms, recalled = ask(session, q, stream)
                    records.append({**base, **state, "policy": policy, "archive": True, "kind": q.kind,
                                    "correct": right, "ms": ms, "recalled_chunks": recalled, "index": False,
                                    "truth_yes": yes})
            for q in windowed_seen(stream, n, rng):  # "did you see" over windows, half of them "no"
                right, ms, recalled = ask(session, q, stream, (stream.stamp(q.window[0]), stream.stamp(q.window[1])))
                records.append({**base, **state, "policy": policy, "archive": True, "kind": "seen@window",
                                "correct": right, "ms": ms, "recalled_chunks": recalled,
                                "index": encoder is not None, "truth_yes": q.answer == "yes",
                                "window_frames": q.window[1] - q.window[0] + 1})
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
    truths = defaultdict(list)
    for r in records:
        if r.get("truth_yes") is not None:
            config = "+archive" + ("+index" if r.get("index") else "") if r["archive"] else ""
            for length in (r["length"], "all"):
                truths[(r["policy"], config, length, r["kind"])].append(r["truth_yes"])
                truths[(r["policy"], config, length, "yes/no")].append(r["truth_yes"])
                cells[(r["policy"], config, length, "yes/no")].append(r["correct"])
    for (policy, archive, length, kind), hits in sorted(cells.items(), key=str):
        low, high = wilson(sum(hits), len(hits))
        cell = {"accuracy": round(float(np.mean(hits)), 3), "low": round(low, 3), "high": round(high, 3), "n": len(hits)}
        yes = truths.get((policy, archive, length, kind))
        if yes:  # what always-yes and always-no score on the same mix, and the margin over the better
            share = float(np.mean(yes))
            cell.update(always_yes=round(share, 3), always_no=round(1 - share, 3),
                        margin_over_always=round(cell["accuracy"] - max(share, 1 - share), 3))
        accuracy.setdefault(f"{policy}{archive}", {}).setdefault(str(length), {})[kind] = cell
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
                # when at its best (a moment found) and at its worst (never true: every candidate read)
                "when_found_multiple": _median([r["ms"] / one for r in with_archive
                                                if r["kind"] in ("last_seen", "first_seen")]),
                "when_never_true_multiple": _median([r["ms"] / one for r in with_archive if r["kind"] == "never_seen"]),
                "seen_window_multiple": _median([r["ms"] / one for r in rows if r["archive"]
                                                 and r.get("index", False) == indexed and r["kind"] == "seen@window"]),
                "recalled_chunks": float(np.median([r.get("recalled_chunks", 0) for r in with_archive])),
                "kv_bytes": int(np.median([r["kv_bytes"] for r in rows])),
                "rss_mib": round(float(np.median([r["rss_bytes"] for r in rows])) / 2**20, 1),
                "archive_bytes": int(np.median([r["archive_bytes"] for r in rows])),
                "chunk_ms": round(float(np.median([r["chunk_ms"] for r in rows])), 2)}
    return {"accuracy": accuracy, "cost": cost}


def _median(values: list[float]) -> float | None:
    return round(float(np.median(values)), 2) if values else None


def print_summary(summary: dict, frames: int) -> None:
    rows = []
    for config, marks in summary["accuracy"].items():
        for length, kinds in sorted(marks.items(), key=lambda kv: (kv[0] == "all", int(kv[0]) if kv[0] != "all" else 0)):
            rows.append({"config": config, "frames": length,
                         **{k: f"{kinds[k]['accuracy']:.2f} ({kinds[k]['n']})" if k in kinds else "" for k in
                            (*KINDS, "seen@window", "long-memory", "yes/no")},
                         "always yes/no": (f"{kinds['yes/no']['always_yes']:.2f}/{kinds['yes/no']['always_no']:.2f}"
                                           if "yes/no" in kinds else "")})
    print(table(rows, [("config", "config"), ("frames", "frames")] + [(k, k) for k in (
        *KINDS, "seen@window", "long-memory", "yes/no", "always yes/no")]))
    rows = [{"policy": p, "frames": n, **c} for p, marks in summary["cost"].items() for n, c in marks.items()]
    print(table(rows, [(k, k) for k in ("policy", "frames", "one_ask_ms", "ask_multiple", "when_multiple",
                                        "when_found_multiple", "when_never_true_multiple", "seen_window_multiple",
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
    parser.add_argument("--recall-chunks", type=int, default=2, help="the node's default")
    parser.add_argument("--retrieval", default="auto",
                        help="retrieval_model_path: the index (auto: the bundled one for a world model; none: off); "
                             "with one, each archive question is asked again without it, side by side")
    parser.add_argument("--archive-content", default="auto", choices=("auto", "embeddings", "frames"),
                        help="what an archived chunk keeps (frames: encoded again on every replay)")
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
                                  head_map_path, encoder, not args.no_compare, args.archive_content)
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
                             "retrieval": args.retrieval, "seeds_from": SEED, "kept_out": KEPT_OUT,
                             "archive_content": args.archive_content,
                             "trace": trace, "records": records,
                             "wall_s": round(time.perf_counter() - started, 1)}, args.out)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
