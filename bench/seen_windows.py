""""Did you see X?" over time windows, through streamcache_node over DDS, negatives counted as carefully
as positives (docs/interfaces.md "Did you see X?").

    python bench/seen_windows.py                                   # both world models, 4 streams of 1 200 frames
    python bench/seen_windows.py --models world-qwen2_5_vl --frames 300 --streams 1 --per-size 4   # a quick look

Held-out world streams (seeds from 530 000 000: no training run or other benchmark draws them) of
random looks, each keeping three identities out on purpose (never shown), are written as bags and
replayed lock-step into a node with its defaults (HERMES, the archive with the bundled index). Then,
through the Python client as any client asks, over windows of 24, 60, 120 and 480 frames at random
places in the stream, one window after another:

- the plain question "Did you see a {colour} {shape}?" with options yes / no, about an identity in
  view in the window (true yes), one seen elsewhere in the stream but not in the window, and one
  the stream never showed (both true no): half yes, half no;
- ``when`` last for the present identity (right within 2 s) and for the two absent ones (right:
  not found).

Reported per window size and in all: true-yes rate, false-yes rate (each negative kind apart),
accuracy, what always-yes and always-no would score on the same mix and the margin over the better
of them; how each answer was reached (found_by), incomplete searches; cost as multiples of one ask
on the working memory, measured in the same run. Writes bench/results/seen_windows-<model>.json
(``--out`` to choose the folder), with the machine, date and commit.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import node_harness as h  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.tools import bagfile  # noqa: E402

SEED = 530_000_000
SIZES = (24, 60, 120, 480)
S = 1_000_000_000
START = bagfile.DEFAULT_START_NS
KEPT_OUT = 3  # identities each stream never shows
NOW = ("How many objects are in view now?", ["0", "1", "2"])  # the unit of cost


def held_out(seed: int, frames: int) -> tuple[world.WorldStream, tuple]:
    absent = world.kept_out(seed, KEPT_OUT)
    look = world.random_look(np.random.default_rng((seed, 0)))
    return world.make_stream(seed, frames, look=look, absent=absent), absent


def probe(identity) -> str:
    return world.SEEN_PROBE.format(shape=identity[0], colour=identity[1])


def windows(stream: world.WorldStream, absent, per_size: int, rng: np.random.Generator) -> list[dict]:
    """For each size, ``per_size`` windows at random places: the identities to ask of each."""
    n = len(stream)
    seen = {v.identity for f in stream.truth for v in f}
    out = []
    for size in SIZES:
        if size > n:
            continue
        for _ in range(per_size):
            first = int(rng.integers(0, n - size + 1))
            inside = sorted({v.identity for f in stream.truth[first:first + size] for v in f})
            elsewhere = sorted(seen - set(inside))
            if not inside or not elsewhere:
                continue
            present = [inside[int(i)] for i in rng.choice(len(inside), min(2, len(inside)), replace=False)]
            out.append({"size": size, "first": first, "present": present,
                        "elsewhere": elsewhere[int(rng.integers(len(elsewhere)))],
                        "never": absent[int(rng.integers(len(absent)))]})
    return out


def ask_windows(client, stream, plan: list[dict], one_ask_ms: float) -> list[dict]:
    records = []
    for w in plan:
        since, until = (START + w["first"] * S) / S, (START + (w["first"] + w["size"] - 1) * S) / S
        asks = [(identity, "present") for identity in w["present"]] + [(w["elsewhere"], "elsewhere"),
                                                                         (w["never"], "never")]
        for identity, kind in asks:
            started = time.perf_counter()
            reply = client.ask(probe(identity), ["yes", "no"], since=since, until=until)
            ms = (time.perf_counter() - started) * 1e3
            frames = [i for i in range(w["first"], w["first"] + w["size"])
                      if identity in {v.identity for v in stream.truth[i]}]
            first_evidence = (round(h.stamp_ns(reply.evidence_stamps[0]) / S - START / S)
                              if reply.success and len(reply.evidence_stamps) else None)
            records.append({"question": "seen", "size": w["size"], "kind": kind, "truth": kind == "present",
                            "success": reply.success, "error": reply.error_message, "said_yes": reply.answer == "yes",
                            "found_by": reply.found_by, "search_complete": reply.search_complete,
                            "evidence_shows_it": first_evidence in frames if first_evidence is not None else None,
                            "recalled_chunks": int(reply.recalled_chunks), "ms": ms, "asks": ms / one_ask_ms})
        for identity, kind in asks[:1] + asks[-2:]:
            started = time.perf_counter()
            reply = client.when(probe(identity), "last", since=since, until=until)
            ms = (time.perf_counter() - started) * 1e3
            frames = [i for i in range(w["first"], w["first"] + w["size"])
                      if identity in {v.identity for v in stream.truth[i]}]
            right = (reply.found and abs(h.stamp_ns(reply.stamp) / S - START / S - frames[-1]) <= 2) if frames \
                else not reply.found
            records.append({"question": "when", "size": w["size"], "kind": kind, "truth": bool(frames),
                            "success": reply.success, "error": reply.error_message, "found": reply.found,
                            "right": bool(reply.success and right), "found_by": reply.found_by,
                            "search_complete": reply.search_complete, "recalled_chunks": int(reply.recalled_chunks),
                            "ms": ms, "asks": ms / one_ask_ms})
    return records


def one_ask(client, reps: int = 5) -> float:
    """The unit of cost: one ask on the working memory, a question about now with no window (the
    working memory's, whatever the archive holds: docs/archive.md "Recall"; a window over the newest
    frames is not it where the budget holds less than a chunk whole, as LLaVA's 96 tokens do); the
    replies must say no chunk was recalled."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        reply = client.ask(*NOW)
        times.append((time.perf_counter() - started) * 1e3)
        assert reply.success and reply.recalled_chunks == 0, reply
    return statistics.median(times)


def summarise(records: list[dict]) -> dict:
    out = {}
    groups = defaultdict(list)
    for r in records:
        groups[(r["question"], str(r["size"]))].append(r)
        groups[(r["question"], "all")].append(r)
    for (question, size), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] == "all", kv[0][1])):
        rows = [r for r in rows if r["success"]]
        positives = [r for r in rows if r["truth"]]
        negatives = [r for r in rows if not r["truth"]]
        said = (lambda r: r["said_yes"]) if question == "seen" else (lambda r: r["found"])
        right = [(said(r) == r["truth"]) if question == "seen" else r["right"] for r in rows]
        always_yes = float(np.mean([r["truth"] for r in rows])) if rows else 0.0
        accuracy = float(np.mean(right)) if rows else 0.0
        cell = {"n": len(rows), "positives": len(positives), "negatives": len(negatives), "accuracy": round(accuracy, 3),
                "true_yes": round(float(np.mean([said(r) for r in positives])), 3) if positives else None,
                "false_yes": round(float(np.mean([said(r) for r in negatives])), 3) if negatives else None,
                "always_yes": round(always_yes, 3), "always_no": round(1 - always_yes, 3),
                "margin_over_always": round(accuracy - max(always_yes, 1 - always_yes), 3),
                "incomplete": sum(not r["search_complete"] for r in rows),
                "found_by": dict(sorted(Counter(r["found_by"] for r in rows).items())),
                "median_asks": round(float(np.median([r["asks"] for r in rows])), 2) if rows else None,
                "refused": len(groups[(question, size)]) - len(rows)}
        for kind in ("elsewhere", "never"):
            of_kind = [r for r in negatives if r["kind"] == kind]
            if of_kind:
                cell[f"false_yes_{kind}"] = round(float(np.mean([said(r) for r in of_kind])), 3)
        if question == "seen":
            shown = [r["evidence_shows_it"] for r in positives if r["said_yes"] and r["evidence_shows_it"] is not None]
            cell["first_evidence_shows_it"] = round(float(np.mean(shown)), 3) if shown else None
        if question == "when" and positives:
            cell["right_when_present"] = round(float(np.mean([r["right"] for r in positives])), 3)
        out.setdefault(question, {})[size] = cell
    return out


def run_model(model: str, args, work: pathlib.Path) -> dict:
    domain = h.new_domain()
    namespace = "/bench_seen"
    records, streams = [], []
    for s in range(args.streams):
        seed = SEED + s
        stream, absent = held_out(seed, args.frames)
        bag = bagfile.make_world_bag(work / f"{model}-{s}", seed, args.frames, look=stream.look, absent=absent,
                                     topic="/camera/image_raw")
        node = h.start(h.node_command(namespace, {"model_path": model, "archive_path": str(work / f"archive-{model}-{s}")}),
                       h.child_env(domain), work / f"node-{model}-{s}.log")
        try:
            from streamcache_ros.client.client import StreamCacheClient  # noqa: PLC0415

            with StreamCacheClient(namespace, timeout=h.GUARD_S, domain_id=domain) as client:
                replay = h.start(h.replay_command(bag, namespace), h.child_env(domain), work / f"replay-{model}-{s}.log")
                assert replay.wait(timeout=h.GUARD_S) == 0, (work / f"replay-{model}-{s}.log").read_text()[-2000:]
                unit = one_ask(client)
                plan = windows(stream, absent, args.per_size, np.random.default_rng((seed, 3)))
                got = ask_windows(client, stream, plan, unit)
                for r in got:
                    r["stream"] = s
                records += got
                streams.append({"seed": seed, "frames": args.frames, "kept_out": [list(a) for a in absent],
                                "look": [stream.look.width, stream.look.height, stream.look.encoding],
                                "one_ask_ms": round(unit, 2), "status": h.stamp_ns(client.memory_status().archive_newest_stamp)})
        finally:
            h.stop(node)
        print(f"{model}: stream {s + 1}/{args.streams} done", flush=True)
    summary = summarise(records)
    rows = [{"question": q, "size": size, **{k: cell.get(k) for k in ("n", "accuracy", "true_yes", "false_yes",
                                                                       "always_yes", "always_no", "margin_over_always",
                                                                       "incomplete", "median_asks")}}
            for q, sizes in summary.items() for size, cell in sizes.items()]
    print(h.table(rows, ["question", "size", "n", "accuracy", "true_yes", "false_yes", "always_yes", "always_no",
                         "margin_over_always", "incomplete", "median_asks"]))
    return {"bench": "seen_windows", "model": model, "machine": h.machine(), "frames": args.frames,
            "streams": streams, "sizes": list(SIZES), "per_size": args.per_size, "seeds_from": SEED,
            "summary": summary, "records": records}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["world-qwen2_5_vl", "world-llava_onevision"])
    parser.add_argument("--frames", type=int, default=1200)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--per-size", type=int, default=8, help="windows of each size per stream")
    parser.add_argument("--out", type=pathlib.Path, default=h.RESULTS)
    args = parser.parse_args(argv)
    work = pathlib.Path(tempfile.mkdtemp(prefix="seen-windows-"))
    try:
        for model in args.models:
            report = run_model(model, args, work)
            path = h.write_json(args.out / f"seen_windows-{model}.json", report)
            print(f"wrote {path}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
