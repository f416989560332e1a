"""Chunks kept against bytes cut from an archive's tail (docs/reliability.md "Torn and damaged files").

    python bench/torn_tail.py                      # 430 chunks of the bundled model's size, cut 4 KiB .. 50 %

An archive of ``--chunks`` chunks of random rows (64 tokens of 32 values each, about 5 KB a row in
fp16 with positions) is closed cleanly, then its tail is cut by each size in turn and opened as the
node opens it. Reported per cut: chunks kept by the
page-by-page salvage, chunks a walk of the table in SQL keeps (what the archive did before: rows in
id order up to the first that does not read), and the chunks the intact bytes could hold at most
(the whole file's chunks times the share of bytes kept). Writes the JSON (device, date, commit) to
``--out``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamcache_ros.engine.recall.archive import EncodedChunk  # noqa: E402
from streamcache_ros.engine.recall.archive.store import DB_NAME, ArchiveStore  # noqa: E402

IDENTITY = {"model_id": "torn-tail", "config_hash": "0"}


def make_chunk(index: int, tokens: int = 64, hidden: int = 32) -> EncodedChunk:
    generator = torch.Generator().manual_seed(index)
    return EncodedChunk("/cam", [float(index * 8 + i) for i in range(8)], [(2 * u, 2 * u + 1) for u in range(4)],
                        tokens // 4, torch.randn(tokens, hidden, generator=generator),
                        torch.arange(3 * tokens, dtype=torch.float32).view(3, -1))


def walk_in_sql(path: pathlib.Path) -> int:
    """Rows read in id order until the first that does not: the salvage before this one."""
    kept = 0
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            for (chunk_id,) in db.execute("SELECT id FROM chunks ORDER BY id").fetchall():
                db.execute("SELECT * FROM chunks WHERE id = ?", (chunk_id,)).fetchone()
                kept += 1
        finally:
            db.close()
    except sqlite3.DatabaseError:
        pass
    return kept


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=430)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "torn_tail.json"))
    args = parser.parse_args(argv)
    work = pathlib.Path(tempfile.mkdtemp(prefix="torn-tail-"))
    try:
        store = ArchiveStore.open(work / "whole", IDENTITY)
        for i in range(args.chunks):
            store.append(make_chunk(i))
        store.close()
        whole = (work / "whole" / DB_NAME).read_bytes()
        rows = []
        for cut in (4096, 40960, len(whole) // 10, len(whole) // 4, len(whole) // 2):
            folder = work / f"cut-{cut}"
            folder.mkdir()
            (folder / DB_NAME).write_bytes(whole[:-cut])
            walked = walk_in_sql(folder / DB_NAME)
            started = time.perf_counter()
            store = ArchiveStore.open(folder, IDENTITY)
            salvage_s = time.perf_counter() - started
            kept = store.stats()["chunks"]
            store.close()
            rows.append({"bytes_cut": cut, "share_cut": round(cut / len(whole), 4), "kept_by_salvage": kept,
                         "kept_by_sql_walk": walked,
                         "at_most": int(args.chunks * (len(whole) - cut) / len(whole)) + 1,
                         "salvage_s": round(salvage_s, 3)})
            print(json.dumps(rows[-1]), flush=True)
            shutil.rmtree(folder)
        report = {"bench": "torn_tail", "device": "cpu (2 cores)", "date": time.strftime("%Y-%m-%d"),
                  "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                           text=True).stdout.strip(),
                  "chunks": args.chunks, "file_bytes": len(whole), "cuts": rows}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
