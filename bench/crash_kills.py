"""The archive killed at random moments, inside its commits too, and cut off as by a power loss.

    python bench/crash_kills.py                     # 200 kills, then 40 power cuts with each archive_sync
    python bench/crash_kills.py --kills 12 --power-cuts 4 --out /tmp/crash.json   # CI's short version

A child process opens the archive store (engine/recall/archive/store.py) and appends chunks (real
rows: random embeddings, float32 so a chunk read back is compared bit for bit), printing "ack N"
after each append returns, that is after its commit. The parent kills it, one of four ways, drawn
at random each round:

- ``time``: SIGKILL after a random delay (0-400 ms): lands anywhere, inside SQLite's commit too;
- ``insert``: the failpoint ``archive_insert:N=kill``: the child dies after its Nth row is written
  and before that transaction commits;
- ``bound``: ``archive_bound:N=kill``: dies inside the bound's deletions (a small archive_max_bytes);
- ``checkpoint``: ``archive_checkpoint:1=kill``: dies as the log is folded back at a clean close.

After every kill the archive is opened again as the node opens it and checked: it opens, nothing
was found damaged, every acknowledged chunk is there bit for bit unless the bound dropped it (then
every chunk older than it is gone too, and a hole names it), and the next child goes on from there.

Power cuts (``--power-cuts``): the child runs with bench/powerloss_shim.c preloaded, which keeps a copy
of each archive file as it was at its last fsync; the child is killed at a random instant and the
archive is opened from those copies alone (docs/reliability.md "Power loss"). Counted per
``archive_sync``: acknowledged chunks lost, archives that did not open. The cost of each mode:
milliseconds per append, measured beside.

Writes the JSON (device, date, commit) to ``--out`` (default bench/results/crash_kills.json). Exits 1
when a kill lost an acknowledged chunk or left an archive that did not open.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamcache_ros.engine.recall.archive import EncodedChunk  # noqa: E402
from streamcache_ros.engine.recall.archive.store import DB_NAME, ArchiveStore  # noqa: E402

IDENTITY = {"model_id": "crash-harness", "config_hash": "0"}
CAMERA = "/cam"
MODES = ("time", "insert", "bound", "checkpoint")


def make_chunk(index: int, frames: int = 8, hidden: int = 48) -> EncodedChunk:
    generator = torch.Generator().manual_seed(index)
    units = frames // 2
    return EncodedChunk(CAMERA, [float(index * frames + i) for i in range(frames)],
                        [(2 * u, 2 * u + 1) for u in range(units)], 3,
                        torch.randn(units * 3, hidden, generator=generator),
                        torch.arange(3 * units * 3, dtype=torch.float32).view(3, -1))


def open_store(folder: pathlib.Path, max_bytes: int, sync: str = "normal") -> ArchiveStore:
    return ArchiveStore.open(folder, IDENTITY, owner="crash-harness", dtype="float32", max_bytes=max_bytes, sync=sync)


# -- the child ----------------------------------------------------------------------------------------
def child(folder: pathlib.Path, start: int, count: int, max_bytes: int, sync: str, close: bool) -> None:
    from streamcache_ros.engine import arm_failpoints
    arm_failpoints()  # the plan in STREAMCACHE_TEST_FAULTS, as the node arms it
    store = open_store(folder, max_bytes, sync)
    print("ready", flush=True)
    for index in range(start, start + count):
        chunk_id = store.append(make_chunk(index))
        if index % 4 == 0:
            store.note_watch(chunk_id, {"Is there a red square?": 0.25})
        print(f"ack {index}", flush=True)
    if close:
        store.close()
        print("closed", flush=True)


# -- the parent ---------------------------------------------------------------------------------------
def run_child(folder, start, count, max_bytes, sync, close, faults="", delay=None, preload=None, powerloss_dir=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "STREAMCACHE_TEST_FAULTS": faults}
    if preload:
        env.update(LD_PRELOAD=str(preload), POWERLOSS_WATCH=str(folder), POWERLOSS_DIR=str(powerloss_dir))
    args = [sys.executable, __file__, "--child", str(folder), "--start", str(start), "--count", str(count),
            "--max-bytes", str(max_bytes), "--sync", sync] + (["--close"] if close else [])
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # "ready": the store is open, the chunks made; the kill is timed from here
    if delay is not None:
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    # read through the same buffered pipe as readline (communicate() would skip what it buffered)
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.wait(timeout=120)
    acked = [int(line.split()[1]) for line in (first + out).splitlines() if line.startswith("ack ")]
    return proc.returncode, acked, err


def check(folder: pathlib.Path, acked: set[int], max_bytes: int) -> dict:
    """The archive after a kill: opens, undamaged, every acknowledged chunk there bit for bit unless
    the bound dropped it (with everything older), and the bound's drops named as a hole."""
    try:
        store = open_store(folder, max_bytes)
    except Exception as err:  # noqa: BLE001 - the failure this harness looks for
        return {"opened": False, "error": f"{type(err).__name__}: {err}"}
    try:
        rows = store.load(store.rows())
        held = {int(row.stamps[0]) // 8: row for row in rows}
        unpinned = sorted(i for i, row in held.items() if not row.pinned)
        oldest_kept = unpinned[0] if unpinned else max(held, default=-1) + 1
        pinned = {i for i, row in held.items() if row.pinned}
        missing = sorted(i for i in acked if i not in held)
        # dropped by the bound: older than every unpinned chunk still held
        lost = [i for i in missing if i >= oldest_kept and i not in pinned]
        changed = [i for i, row in held.items() if not torch.equal(row.chunk.embeds, make_chunk(i).embeds)]
        bound_holes = [h for h in store.holes() if h[3] == "bound"]
        return {"opened": True, "damaged": bool(store.warnings), "warnings": store.warnings, "lost": lost,
                "changed": changed, "held": len(held), "dropped_by_bound": len(missing) - len(lost),
                "hole_named": not (len(missing) - len(lost)) or bool(bound_holes),
                "unacked_committed": len(set(held) - acked), "next": max(list(held) + list(acked), default=-1) + 1}
    finally:
        store.close()


def kills(rounds: int, rng: random.Random, work: pathlib.Path, max_bytes: int) -> dict:
    folder = work / "kills"
    acked: set[int] = set()
    start, results = 0, {mode: 0 for mode in MODES}
    failures, lost_total, dropped, unacked, in_commit_window = [], 0, 0, 0, 0
    for round_ in range(rounds):
        mode = rng.choice(MODES)
        results[mode] += 1
        count, close, faults, delay = 40, False, "", None
        if mode == "time":
            delay = rng.uniform(0.0, 0.4)
        elif mode == "insert":
            faults = f"archive_insert:{rng.randint(1, 20)}=kill"
        elif mode == "bound":
            faults = f"archive_bound:{rng.randint(1, 6)}=kill"
        else:
            count, close, faults = rng.randint(1, 10), True, "archive_checkpoint:1=kill"
        rc, got, err = run_child(folder, start, count, max_bytes, "normal", close, faults, delay)
        if rc not in (-signal.SIGKILL, 0):
            failures.append({"round": round_, "mode": mode, "rc": rc, "stderr": err[-400:]})
        acked |= set(got)
        verdict = check(folder, acked, max_bytes)
        if not verdict["opened"] or verdict["damaged"] or verdict["lost"] or verdict["changed"] \
                or not verdict["hole_named"]:
            failures.append({"round": round_, "mode": mode, **{k: v for k, v in verdict.items() if k != "next"}})
        if verdict["opened"]:
            lost_total += len(verdict["lost"])
            dropped = verdict["dropped_by_bound"]
            unacked += verdict["unacked_committed"]
            in_commit_window += int(verdict["unacked_committed"] > 0)
            start = verdict["next"]
    return {"kills": rounds, "by_mode": results, "acknowledged": len(acked), "acknowledged_lost": lost_total,
            "unopenable": sum(1 for f in failures if f.get("opened") is False),
            "found_damaged": sum(1 for f in failures if f.get("damaged")), "dropped_by_bound": dropped,
            "kills_after_commit_before_ack": in_commit_window, "failures": failures[:10]}


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
        _, acked, _ = run_child(folder, 0, 100_000, 1 << 30, sync, False, delay=rng.uniform(0.1, 1.0),
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
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--power-cuts", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default="", help="a folder for the archives (default: a temporary one, removed)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "crash_kills.json"))
    args = parser.parse_args(argv)
    if args.child:
        child(pathlib.Path(args.child), args.start, args.count, args.max_bytes, args.sync, args.close)
        return 0
    rng = random.Random(args.seed)
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="crash-kills-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        report = {"bench": "crash_kills", "device": "cpu (2 cores)", "date": time.strftime("%Y-%m-%d"),
                  "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                           text=True).stdout.strip(), "seed": args.seed, "max_bytes": args.max_bytes}
        report["kills"] = kills(args.kills, rng, work, args.max_bytes)
        print(json.dumps({k: v for k, v in report["kills"].items() if k != "failures"}), flush=True)
        shim = build_shim(work) if args.power_cuts else None
        report["power_cuts"] = ([power_cuts(args.power_cuts, sync, rng, work, shim) for sync in ("normal", "full")]
                                if shim else "not run: no C compiler to build bench/powerloss_shim.c")
        report["append_ms"] = {sync: round(append_cost(sync, work), 3) for sync in ("normal", "full")}
        print(json.dumps({k: report[k] for k in ("power_cuts", "append_ms")}), flush=True)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    k = report["kills"]
    return 1 if k["acknowledged_lost"] or k["unopenable"] or k["found_damaged"] or k["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
