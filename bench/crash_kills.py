"""The archive killed at random moments while it writes, and cut off as by a power loss.

    python bench/crash_kills.py                     # 200 kills during writes, then 40 power cuts with each archive_sync
    python bench/crash_kills.py --kills 12 --power-cuts 4 --out /tmp/crash.json   # CI's short version

A child process opens the archive store (engine/recall/archive/store.py) and appends chunks: real
rows, with float32 embeddings, frame vectors, thumbnails and a retrieval key, a standing answer
on every fourth; it prints "ack N" after each append returns, that is after its commit. The child
marks where it is in a byte the parent can read after it dies (``Phase``): between rows, packing a
chunk, inside the chunk's transaction, inside its commit, inside the bound's deletions, inside the
checkpoint of a close, or done (after the last write). The parent kills it, one of five ways:

- ``time``: SIGKILL after a delay drawn over the writing span (measured first, ready to last ack);
- ``insert``: the failpoint ``archive_insert:N=kill``: the child dies after its Nth row is written,
  before that transaction commits;
- ``commit``: the parent kills the moment it sees the child in a commit;
- ``bound``: ``archive_bound:N=kill``: dies inside the bound's deletions (a small archive_max_bytes);
- ``checkpoint``: the child closes the store; the parent kills the moment it sees the close's
  checkpoint begin.

Each kill is recorded with where it landed (the byte at death). Only kills that landed while the
child was writing count toward ``--kills`` (a clock kill after the last write, or a watcher's kill
that came too late, is recorded and drawn again); a failpoint kill that did not fire fails the run.
After every kill the archive is opened again as the node opens it and checked: it opens, nothing was
found damaged, every acknowledged chunk is there with every column as written (compared with the
row the chunk packs to) unless the bound dropped it (then every chunk older than it is gone too, and
a hole names it), and the next child goes on from there.

Power cuts (``--power-cuts``): the child runs with bench/powerloss_shim.c preloaded, which keeps a copy
of each archive file as it was at its last fsync; the child is killed at a random instant and the
archive is opened from those copies alone (docs/reliability.md "Power loss"). Counted per
``archive_sync``: acknowledged chunks lost, archives that did not open. The cost of each mode:
milliseconds per append, measured beside.

Writes the JSON (device, date, commit) to ``--out`` (default bench/results/crash_kills.json). Exits 1
when a kill lost an acknowledged chunk, changed a column, left an archive that did not open, or did
not fire.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamcache_ros.engine.recall.archive import EncodedChunk  # noqa: E402
from streamcache_ros.engine.recall.archive.record import packed_row  # noqa: E402
from streamcache_ros.engine.recall.archive.store import DB_NAME, ArchiveStore  # noqa: E402

IDENTITY = {"model_id": "crash-harness", "config_hash": "0"}
CAMERA = "/cam"
MODES = ("time", "insert", "commit", "bound", "checkpoint")
WATCHED = {"Is there a red square?": 0.25}  # the standing answer every fourth chunk gets
# where the child is: one byte in a shared file
PHASES = {"r": "between rows", "p": "packing a chunk", "t": "inside a chunk's transaction", "c": "inside a commit",
          "b": "inside the bound's deletions", "w": "writing a standing answer", "k": "inside the checkpoint",
          "d": "after the last write"}
WRITING = set("rptcbwk")  # a kill in one of these landed while the child was writing
PREMADE = 400  # chunks a child makes before it says "ready" (the kills' runs are shorter)


def make_chunk(index: int, frames: int = 8, hidden: int = 48) -> EncodedChunk:
    generator = torch.Generator().manual_seed(index)
    units = frames // 2
    rng = np.random.default_rng(index)
    return EncodedChunk(CAMERA, [float(index * frames + i) for i in range(frames)],
                        [(2 * u, 2 * u + 1) for u in range(units)], 3,
                        torch.randn(units * 3, hidden, generator=generator),
                        torch.arange(3 * units * 3, dtype=torch.float32).view(3, -1),
                        frame_vectors=rng.standard_normal((frames, 16)).astype(np.float32),
                        thumbnails=[bytes(rng.integers(0, 256, 64, dtype=np.uint8)) for _ in range(frames)])


def make_key(index: int) -> np.ndarray:
    return np.random.default_rng((index, 1)).standard_normal((1, 2, 4)).astype(np.float16)


def open_store(folder: pathlib.Path, max_bytes: int, sync: str = "normal") -> ArchiveStore:
    return ArchiveStore.open(folder, IDENTITY, owner="crash-harness", dtype="float32", max_bytes=max_bytes, sync=sync)


class Phase:
    """One byte in a file both processes map: where the child is."""

    def __init__(self, path: pathlib.Path, create: bool = False):
        if create:
            path.write_bytes(b"r")
        self._file = open(path, "r+b")  # noqa: SIM115 - mapped for the process's life
        self._map = mmap.mmap(self._file.fileno(), 1)

    def set(self, phase: str) -> None:
        self._map[0] = ord(phase)

    def get(self) -> str:
        return chr(self._map[0])


class _Marked:
    """The store's connection, marking a commit as it happens (``with db`` commits on exit)."""

    def __init__(self, db, phase: Phase):
        self._db, self._phase = db, phase

    def __enter__(self):
        return self._db.__enter__()

    def __exit__(self, *exc):
        before = self._phase.get()
        self._phase.set("c")
        try:
            return self._db.__exit__(*exc)
        finally:
            self._phase.set(before)

    def __getattr__(self, name):
        return getattr(self._db, name)


def marked(store: ArchiveStore, phase: Phase) -> ArchiveStore:
    """``store`` with its steps marking ``phase``: a chunk's transaction, the bound, a standing
    answer, the close's checkpoint, each commit."""
    def around(name: str, mark: str):
        inner = getattr(store, name)

        def wrapped(*args, **kw):
            before = phase.get()
            phase.set(mark)
            try:
                return inner(*args, **kw)
            finally:
                phase.set(before)
        setattr(store, name, wrapped)
    around("_commit", "t")
    around("_keep_within_bound", "b")
    around("note_watch", "w")
    around("fold_log", "k")
    store.db = _Marked(store.db, phase)
    return store


# -- the child ----------------------------------------------------------------------------------------
def child(folder: pathlib.Path, start: int, count: int, max_bytes: int, sync: str, close: bool,
          phase_file: str) -> None:
    from streamcache_ros.engine import arm_failpoints
    arm_failpoints()  # the plan in STREAMCACHE_TEST_FAULTS, as the node arms it
    phase = Phase(pathlib.Path(phase_file)) if phase_file else None
    store = open_store(folder, max_bytes, sync)
    # made before "ready", so that a clock kill lands in the store's work, not in making test data; a
    # power cut's long run makes the rest as it goes
    made = {index: (make_chunk(index), make_key(index)) for index in range(start, start + min(count, PREMADE))}
    if phase is not None:
        marked(store, phase)
        phase.set("r")
    print("ready", flush=True)
    began = time.perf_counter()
    for index in range(start, start + count):
        chunk, key = made.pop(index, None) or (make_chunk(index), make_key(index))
        if phase is not None:
            phase.set("p")
        chunk_id = store.append(chunk, key)
        if index % 4 == 0:
            store.note_watch(chunk_id, WATCHED)
        if phase is not None:
            phase.set("r")
        print(f"ack {index}", flush=True)
    print(f"span {time.perf_counter() - began:.6f}", flush=True)  # ready to the last ack: what clock kills are drawn over
    if close:
        store.close()  # its checkpoint marks "k" (fold_log)
        print("closed", flush=True)
    if phase is not None:
        phase.set("d")


# -- the parent ---------------------------------------------------------------------------------------
def run_child(folder, start, count, max_bytes, sync, close, faults="", delay=None, watch_for="", preload=None,
              powerloss_dir=None, phase_file=None):
    """(exit code, acknowledged chunks, stderr, the phase it ended in, seconds from ready to its last ack)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "STREAMCACHE_TEST_FAULTS": faults}
    if preload:
        env.update(LD_PRELOAD=str(preload), POWERLOSS_WATCH=str(folder), POWERLOSS_DIR=str(powerloss_dir))
    phase = Phase(phase_file, create=True) if phase_file else None
    args = [sys.executable, __file__, "--child", str(folder), "--start", str(start), "--count", str(count),
            "--max-bytes", str(max_bytes), "--sync", sync, "--phase-file", str(phase_file or "")] + \
        (["--close"] if close else [])
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # "ready": the store is open, the chunks made; the kill is timed from here
    ready = time.perf_counter()
    if delay is not None:
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    elif watch_for:  # the moment the child is seen there
        while proc.poll() is None and phase.get() not in watch_for:
            pass
        proc.send_signal(signal.SIGKILL)
    # read through the same buffered pipe as readline (communicate() would skip what it buffered)
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.wait(timeout=120)
    lines = (first + out).splitlines()
    acked = [int(line.split()[1]) for line in lines if line.startswith("ack ")]
    span = next((float(line.split()[1]) for line in lines if line.startswith("span ")), time.perf_counter() - ready)
    return proc.returncode, acked, err, phase.get() if phase else "", span


def expected_row(index: int, pinned: bool) -> dict:
    """Every column an acknowledged chunk's row must hold, as its append packed it."""
    row = packed_row(make_chunk(index), make_key(index), "float32")
    row.update(pinned=int(pinned), watch=json.dumps({q: round(p, 4) for q, p in WATCHED.items()} if index % 4 == 0
                                                    else {}))
    return row


def check(folder: pathlib.Path, acked: set[int], max_bytes: int) -> dict:
    """The archive after a kill: opens, undamaged, every acknowledged chunk there with every column
    as written, unless the bound dropped it (with everything older), and the bound's drops named as
    a hole."""
    try:
        store = open_store(folder, max_bytes)
    except Exception as err:  # noqa: BLE001 - the failure this harness looks for
        return {"opened": False, "error": f"{type(err).__name__}: {err}"}
    try:
        columns = [name for name in expected_row(0, True) if name != "id"]
        held = {}
        for values in store.reader.execute(f"SELECT {', '.join(columns)} FROM chunks"):
            row = dict(zip(columns, values))
            held[int(json.loads(row["stamps"])[0]) // 8] = row
        unpinned = sorted(i for i, row in held.items() if not row["pinned"])
        oldest_kept = unpinned[0] if unpinned else max(held, default=-1) + 1
        pinned = {i for i, row in held.items() if row["pinned"]}
        missing = sorted(i for i in acked if i not in held)
        # dropped by the bound: older than every unpinned chunk still held
        lost = [i for i in missing if i >= oldest_kept and i not in pinned]
        changed = {}
        for i in sorted(acked & set(held)):
            want = expected_row(i, bool(held[i]["pinned"]))
            wrong = [c for c in columns if c != "watch" and held[i][c] != want[c]]
            # a kill between a chunk's commit and its standing answer's: the answer may be missing
            if json.loads(held[i]["watch"]) not in (json.loads(want["watch"]), {}):
                wrong.append("watch")
            if wrong:
                changed[i] = wrong
        bound_holes = [h for h in store.holes() if h[3] == "bound"]
        return {"opened": True, "damaged": bool(store.warnings), "warnings": store.warnings, "lost": lost,
                "changed": changed, "held": len(held), "dropped_by_bound": len(missing) - len(lost),
                "hole_named": not (len(missing) - len(lost)) or bool(bound_holes),
                "unacked_committed": len(set(held) - acked), "next": max(list(held) + list(acked), default=-1) + 1}
    finally:
        store.close()


def writing_span(work: pathlib.Path, count: int, max_bytes: int) -> float:
    """Seconds from "ready" to the last ack of a child that is not killed: clock kills are drawn over it."""
    folder = work / "span"
    _, acked, _, _, span = run_child(folder, 0, count, max_bytes, "normal", False, phase_file=work / "span-phase")
    shutil.rmtree(folder, ignore_errors=True)
    return span


def kills(rounds: int, rng: random.Random, work: pathlib.Path, max_bytes: int, count: int = 120) -> dict:
    folder = work / "kills"
    span = writing_span(work, count, max_bytes)
    acked: set[int] = set()
    start, landed, by_mode, missed = 0, Counter(), Counter(), Counter()
    failures, lost_total, dropped, unacked, attempts, records = [], 0, 0, 0, 0, []
    while sum(by_mode.values()) < rounds and attempts < 4 * rounds:
        attempts += 1
        mode = rng.choice(MODES)
        close, faults, delay, watch_for, n = False, "", None, "", count
        if mode == "time":
            delay = rng.uniform(0.0, span)
        elif mode == "insert":
            faults = f"archive_insert:{rng.randint(1, 20)}=kill"
        elif mode == "commit":
            watch_for = "c"
        elif mode == "bound":
            faults = f"archive_bound:{rng.randint(1, 6)}=kill"
        else:
            n, close, watch_for = rng.randint(1, 10), True, "k"
        rc, got, err, phase, _ = run_child(folder, start, n, max_bytes, "normal", close, faults, delay, watch_for,
                                           phase_file=work / "phase")
        acked |= set(got)
        fired = rc == -signal.SIGKILL
        if faults and not fired:  # a failpoint kill must fire: the run fails otherwise
            failures.append({"attempt": attempts, "mode": mode, "rc": rc, "why": "the kill did not fire",
                             "stderr": err[-400:]})
        elif rc not in (-signal.SIGKILL, 0):
            failures.append({"attempt": attempts, "mode": mode, "rc": rc, "stderr": err[-400:]})
        counted = fired and phase in WRITING
        records.append({"mode": mode, "landed": PHASES.get(phase, phase), "counted": counted})
        if counted:
            by_mode[mode] += 1
            landed[PHASES[phase]] += 1
        else:
            missed[mode] += 1
        verdict = check(folder, acked, max_bytes)
        if not verdict["opened"] or verdict["damaged"] or verdict["lost"] or verdict["changed"] \
                or not verdict["hole_named"]:
            failures.append({"attempt": attempts, "mode": mode, **{k: v for k, v in verdict.items() if k != "next"}})
        if verdict["opened"]:
            lost_total += len(verdict["lost"])
            dropped = verdict["dropped_by_bound"]
            unacked += verdict["unacked_committed"]
            start = verdict["next"]
    return {"kills_during_writes": sum(by_mode.values()), "attempts": attempts, "writing_span_s": round(span, 4),
            "by_mode": dict(by_mode), "landed": dict(landed), "not_counted": dict(missed),
            "acknowledged": len(acked), "acknowledged_lost": lost_total,
            "columns_changed": sum(1 for f in failures if f.get("changed")),
            "unopenable": sum(1 for f in failures if f.get("opened") is False),
            "found_damaged": sum(1 for f in failures if f.get("damaged")), "dropped_by_bound": dropped,
            "committed_before_ack": unacked, "failures": failures[:10], "records": records}


def build_shim(work: pathlib.Path) -> pathlib.Path | None:
    shim = work / "powerloss_shim.so"
    done = subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(ROOT / "bench" / "powerloss_shim.c"),
                           "-ldl"], capture_output=True, text=True)
    return shim if done.returncode == 0 else None


def power_cuts(rounds: int, sync: str, rng: random.Random, work: pathlib.Path, shim: pathlib.Path) -> dict:
    lost_counts, unopenable, acked_total = [], 0, 0
    for round_ in range(rounds):
        folder, synced = work / f"cut-{sync}-{round_}" / "live", work / f"cut-{sync}-{round_}" / "synced"
        folder.mkdir(parents=True)
        synced.mkdir()
        _, acked, _, _, _ = run_child(folder, 0, 100_000, 1 << 30, sync, False, delay=rng.uniform(0.1, 1.0),
                                      preload=shim, powerloss_dir=synced)
        after = work / f"cut-{sync}-{round_}" / "after"
        after.mkdir()
        for name in (DB_NAME, DB_NAME + "-wal"):
            if (synced / name).exists():
                shutil.copy(synced / name, after / name)
        verdict = check(after, set(acked), 1 << 30)
        acked_total += len(acked)
        if not verdict["opened"] or verdict["damaged"]:
            unopenable += 1
            continue
        lost_counts.append(len(verdict["lost"]))
    return {"sync": sync, "cuts": rounds, "acknowledged": acked_total, "unopenable_or_damaged": unopenable,
            "acknowledged_lost": int(sum(lost_counts)), "cuts_losing_any": sum(1 for n in lost_counts if n),
            "most_lost_in_one_cut": max(lost_counts, default=0)}


def append_cost(sync: str, work: pathlib.Path, appends: int = 200) -> float:
    store = open_store(work / f"cost-{sync}", 1 << 30, sync)
    chunks = [make_chunk(i) for i in range(appends)]
    started = time.perf_counter()
    for c in chunks:
        store.append(c)
    elapsed = time.perf_counter() - started
    store.close()
    return elapsed / appends * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", default="")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--max-bytes", type=int, default=120_000)
    parser.add_argument("--sync", default="normal")
    parser.add_argument("--close", action="store_true")
    parser.add_argument("--phase-file", default="")
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--power-cuts", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default="", help="a folder for the archives (default: a temporary one, removed)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "crash_kills.json"))
    args = parser.parse_args(argv)
    if args.child:
        child(pathlib.Path(args.child), args.start, args.count, args.max_bytes, args.sync, args.close, args.phase_file)
        return 0
    rng = random.Random(args.seed)
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="crash-kills-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        report = {"bench": "crash_kills", "device": "cpu (2 cores)", "date": time.strftime("%Y-%m-%d"),
                  "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                           text=True).stdout.strip(), "seed": args.seed, "max_bytes": args.max_bytes}
        report["kills"] = kills(args.kills, rng, work, args.max_bytes)
        print(json.dumps({k: v for k, v in report["kills"].items() if k not in ("failures", "records")}), flush=True)
        shim = build_shim(work) if args.power_cuts else None
        report["power_cuts"] = ([power_cuts(args.power_cuts, sync, rng, work, shim) for sync in ("normal", "full")]
                                if shim else "not asked" if not args.power_cuts else
                                "not run: no C compiler to build bench/powerloss_shim.c")
        report["append_ms"] = {sync: round(append_cost(sync, work), 3) for sync in ("normal", "full")}
        print(json.dumps({k: report[k] for k in ("power_cuts", "append_ms")}), flush=True)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    k = report["kills"]
    short = k["kills_during_writes"] < args.kills
    return 1 if k["acknowledged_lost"] or k["unopenable"] or k["found_damaged"] or k["failures"] or short else 0


if __name__ == "__main__":
    sys.exit(main())
