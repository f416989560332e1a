"""The README's and docs' accuracy tables from what bench/accuracy.py wrote.

    python bench/accuracy_tables.py bench/reported/accuracy-world-qwen2_5_vl.json [--full]

Compact (default): one row per policy, its share right on all option questions and on the
long-memory subset at every length, and the KV bytes it held at the longest. ``--full``: a table per
length, one row per question kind, as bench/accuracy.py prints them (from the JSON), then the time
tables (when, windowed seen, standing questions) and the one-hour rows where the run had them.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

from accuracy import print_hour, print_tables, print_time


def config_label(data: dict) -> str:
    """The label the bounded policies' cells carry (bench/accuracy.py: '1/8' for --fraction 0.125)."""
    return f"1/{round(1 / data['fraction'])}"


def compact(data: dict) -> str:
    summary, lengths, policies = data["summary"], data["lengths"], data["policies"]
    label, longest = config_label(data), max(lengths)

    def cell(policy: str, n: int, kind: str) -> dict:
        return summary.get(f"{n}|{'full' if policy == 'full' else label}|{policy}|{kind}") or {}

    head = ["policy", *[f"all, {n}" for n in lengths], *[f"long-memory, {n}" for n in lengths],
            f"KV bytes at {longest}"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for policy in policies:
        row = [f"`{policy}`"]
        for kind in ("all", "long_memory"):
            for n in lengths:
                c = cell(policy, n, kind)
                row.append(f"{c['accuracy']:.2f}" if c.get("n") else "")
        kv_bytes = cell(policy, longest, "all").get("kv_bytes")
        row.append(f"{kv_bytes / 1024:.0f} KiB" if kv_bytes else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def hour_range(data: dict) -> int:
    return data["hour"]["full"].get("position_range", 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=pathlib.Path)
    parser.add_argument("--full", action="store_true")
    args = parser.parse_args()
    data = json.loads(args.json.read_text())
    machine = data.get("machine", {})
    print(f"<!-- {args.json.name}: {machine.get('device')}, {machine.get('date')}, commit {machine.get('commit')} -->")
    if args.full:
        print_tables(data["summary"], data["lengths"], data["policies"], config_label(data))
        print_time(data.get("time") or {}, data["lengths"], data["policies"], config_label(data))
        hour = {k: v for k, v in (data.get("hour") or {}).items() if k != "full"}
        if hour:
            print_hour(hour, hour_range(data))
            print(f"\nfull: {data['hour']['full']['note']}")
    else:
        print(compact(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
