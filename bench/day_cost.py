"""What a question costs over a day's archive, with the code as it is (docs/archive.md "Measured").

    python bench/day_cost.py                                   # the Qwen world model
    python bench/day_cost.py --model world-llava_onevision --out bench/reported

The accuracy over a day comes from bench/archive_recall.py (three held-out day streams, 50 minutes of
CPU); this measures the cost alone, in minutes: an hour of a held-out stream is archived by the
engine (the bundled Qwen world model, HERMES at the node's budget, the index), then its chunks are
written 24 times into a second archive, each copy 3 600 s later (payloads, keys and frame vectors as
they were), which is what a day's archive holds for a question's cost: 10 800 chunks, 86 400
indexed frames. A session restarted on it takes 64 more frames, then each question is timed 9
times, each time against one ask on the working memory (the archive set aside: the unit) timed just
before it, and the median ratio is kept. The questions: one about now (the working memory answers
it, archive or not), one about the beginning (a replay of the first chunk), another plain ask (a
replay of the first, newest and best-ranked chunks), "did you see" (retrieved, then verified),
`when` last and first for an identity seen (the index, then one-chunk replays: `when` at its best)
and for one the stream never showed (three are kept out), a `timeline` over an hour. The answers are
not scored (the copies repeat one hour's truth). A plain ask's time is then taken apart: the scratch
memory a replay is prefilled into, one chunk's prefill, how many it holds. And `when` at its worst,
at the hour and at the day: never true, its index misled into proposing chunks of an identity that
is there, so every candidate is replayed and refused and the walk goes on to its bound.
"""
from __future__ import annotations

import contextlib
import pathlib
import shutil
import statistics
import sys
import tempfile
import time


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from archive_recall import working_memory_only  # noqa: E402
from common import write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine import build_session  # noqa: E402
from streamcache_ros.engine.recall.archive import ArchiveStore  # noqa: E402

SEED = 510_000_000
ABOUT_FIRST = "What color was the first object you saw?"  # the first chunk alone (docs/archive.md "Recall")
PLAIN = "What color was the object you saw?"  # the first, the best-ranked and the newest chunks
HOUR = 3600


NOW = ("How many objects are in view now?", ["0", "1", "2"])


def _once(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1e3


def timed(call, times: int = 5) -> float:
    return statistics.median(_once(call) for _ in range(times))


def in_asks(session, call, times: int = 9) -> tuple[float, float]:
    """(the median ms of ``call``, the median of its ratio to one ask on the working memory timed just
    before it, each time): the ratio holds while the load of a shared machine moves, which a ratio of
    two medians taken minutes apart does not."""
    spent, ratios = [], []
    for _ in range(times):
        with working_memory_only(session):
            unit = _once(lambda: session.ask(*NOW))
        ms = _once(call)
        spent.append(ms)
        ratios.append(ms / unit)
    return statistics.median(spent), statistics.median(ratios)


@contextlib.contextmanager
def misleading_index(session, shown: str):
    """The index's text side reads every question as ``shown``: its candidates are then chunks that
    show something else, each replayed and refused by the model, and past them the window is walked
    as far as ``when_walk_chunks`` allows: a `when` at its worst (docs/archive.md "When with the index")."""
    encoder = session.memory.encoder
    real = encoder.embed_text
    encoder.embed_text = lambda _text: real(shown)
    try:
        yield
    finally:
        del encoder.embed_text


def worst_when(session, probe: str, never: str) -> dict:
    """A never-true `when` (last) whose index proposes chunks of another identity: every candidate
    verified and refused, then the walk; its cost in asks and what the reply says of it."""
    with misleading_index(session, probe):
        ms, asks = in_asks(session, lambda: session.when(never, "last"), times=5)
        reply = session.when(never, "last")
    return {"ms": round(ms, 1), "asks": round(asks, 2), "found": reply.found, "found_by": reply.found_by,
            "index_candidates": reply.index_candidates, "recalled_chunks": reply.recalled_chunks,
            "search_complete": reply.search_complete}


def plain_ask_parts(session, question: str, options: list[str]) -> dict:
    """Where a plain ask over a replay spends its time (docs/archive.md "Recall"): the scratch memory
    made (a full cache, its system prompt prefilled), one archived chunk prefilled into it (the
    newest; each costs about the same), the chunks the replay holds, and what is left: the ranking,
    the reads and the question asked of the replay."""
    tier = session.memory
    reply = session.ask(question, options)
    made = timed(tier.make_scratch)
    (row,) = tier.archive.load(tier.archive.rows()[-1:])[0]

    def one_chunk():
        tier.make_scratch().take_in(row.chunk)
    chunk = timed(one_chunk) - made
    return {"chunks_replayed": int(reply.recalled_chunks), "scratch_memory_ms": round(made, 1),
            "a_chunk_ms": round(chunk, 1)}


def main(argv=None) -> int:
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="world-qwen2_5_vl")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="the JSON's folder (default bench/results)")
    parser.add_argument("--profile", action="store_true", help="also print where a day's question spends its time")
    args = parser.parse_args(argv)
    PARAMS = {"model_path": args.model, "policy": "hermes"}
    work = pathlib.Path(tempfile.mkdtemp(prefix="day-cost-"))
    try:
        absent = world.kept_out(SEED)
        stream = world.make_long_stream(SEED, HOUR + 64, absent=absent)
        hour = build_session({**PARAMS, "archive_path": str(work / "hour")})
        for i in range(HOUR):
            hour.add_frame(stream.frame(i), stream.stamp(i))
        hour.flush()
        seen = next(v.identity for views in stream.truth[HOUR - 200:HOUR] for v in views)
        probe = world.SEEN_PROBE.format(shape=seen[0], colour=seen[1])
        never = world.SEEN_PROBE.format(shape=absent[0][0], colour=absent[0][1])
        worst = {"hour": worst_when(hour, probe, never)}
        identity = {"model_id": hour.adapter.model_id, "config_hash": hour.adapter.config_hash}
        source = hour.memory.archive.store
        rows = source.rows(with_keys=True)
        _, chunk_ids, vectors, _ = source.frame_index()
        by_chunk = {c: vectors[chunk_ids == c] for c in set(chunk_ids.tolist())}
        loaded = source.load(rows)
        hour.close_archive()
        day = ArchiveStore.open(work / "day", identity, dtype="float16", max_bytes=1 << 40)
        day.use_index(hour.memory.encoder.identity if hour.memory.encoder else "")
        started = time.perf_counter()
        for copy in range(24):
            shift = copy * HOUR
            for row in loaded:
                chunk = row.chunk
                chunk.stamps = [s + shift for s in row.stamps]
                chunk.frame_vectors = by_chunk.get(row.chunk_id)
                day.append(chunk, row.key)
        copy_s = time.perf_counter() - started
        day.close()
        session = build_session({**PARAMS, "archive_path": str(work / "day")})
        for i in range(HOUR, HOUR + 64):
            session.add_frame(stream.frame(i), stream.stamp(i) + 23 * HOUR)
        session.flush()
        chunks = session.status().archive.chunks
        with working_memory_only(session):
            one_ask = timed(lambda: session.ask(*NOW), times=9)
        colours = list(world.COLOUR_NAMES)
        calls = {
            "a question about now": lambda: session.ask(*NOW),
            "a question about the beginning": lambda: session.ask(ABOUT_FIRST, colours),
            "plain ask (replay)": lambda: session.ask(PLAIN, colours),
            "did you see (verified)": lambda: session.ask(probe, ["yes", "no"]),
            "did you see, never true": lambda: session.ask(never, ["yes", "no"]),
            "when last": lambda: session.when(probe, "last"),
            "when first": lambda: session.when(probe, "first"),
            "when last, never true": lambda: session.when(never, "last"),
            "when first, never true": lambda: session.when(never, "first"),
            "timeline over an hour": lambda: session.when(probe, "timeline", since=20 * HOUR, until=21 * HOUR),
        }
        measured = {name: in_asks(session, call) for name, call in calls.items()}
        costs = {name: ms for name, (ms, _) in measured.items()}
        found = session.when(probe, "last")
        worst["day"] = worst_when(session, probe, never)
        parts = plain_ask_parts(session, PLAIN, colours)
        parts["rest_ms"] = round(costs["plain ask (replay)"] - parts["scratch_memory_ms"]
                                 - parts["chunks_replayed"] * parts["a_chunk_ms"], 1)
        parts["in_asks"] = {k.removesuffix("_ms"): round(v / one_ask, 2) for k, v in parts.items() if k.endswith("_ms")}
        if args.profile:  # where a day's question spends its time
            import cProfile  # noqa: PLC0415
            import pstats  # noqa: PLC0415

            for name, call in (("ask", lambda: session.ask(probe, ["yes", "no"])), ("when", lambda: session.when(probe, "last")),
                               ("when, never true", lambda: session.when(never, "last"))):
                profile = cProfile.Profile()
                profile.runcall(lambda: [call() for _ in range(5)])
                print(f"-- {name}, 5 times")
                pstats.Stats(profile).sort_stats("tottime").print_stats(14)
        session.close_archive()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"archived_chunks": chunks, "copy_s": round(copy_s, 1), "one_ask_ms": round(one_ask, 1),
              "ms": {k: round(v, 1) for k, v in costs.items()},
              "multiple_of_one_ask": {name: round(asks, 2) for name, (_, asks) in measured.items()},
              "when_last": {"found_by": found.found_by, "recalled_chunks": found.recalled_chunks,
                            "frames_in_window": found.frames_in_window},
              "plain_ask_parts": parts, "when_every_candidate_fails": worst}
    for name, (ms, asks) in measured.items():
        print(f"{name:32s} {ms:8.1f} ms  {asks:6.2f} x one ask (one ask: {one_ask:.1f} ms)")
    for where, w in worst.items():
        print(f"when, every candidate refused, {where}: {w['asks']} asks ({w['index_candidates']} candidates, "
              f"{w['recalled_chunks']} chunks replayed, complete {w['search_complete']}, {w['found_by']})")
    print(f"a plain ask: a scratch memory {parts['scratch_memory_ms']} ms + {parts['chunks_replayed']} chunks x "
          f"{parts['a_chunk_ms']} ms + the rest {parts['rest_ms']} ms")
    path = write_json(f"day_cost-{args.model}", {"model": PARAMS["model_path"], "policy": "hermes", **result}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
