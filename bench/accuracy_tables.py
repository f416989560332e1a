"""The README's and docs' accuracy tables from what bench/accuracy.py wrote.

    python bench/accuracy_tables.py bench/reported/accuracy-world-qwen2_5_vl.json [--full]

Compact (default): one row per policy, its share right on all option questions and on the
long-memory subset at every length, and the KV bytes it held at the longest. ``--full``: a table per
length, one row per question kind (the benchmark's own print-out, from the JSON).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys


def cell(c: dict | None) -> str:
    if not c or not c.get("n"):
        return ""
    return f"{c['accuracy']:.2f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}] n={c['n']}"


def short(c: dict | None) -> str:
    return f"{c['accuracy']:.2f}" if c and c.get("n") else ""


def config_of(summary: dict, length: int, policy: str) -> str | None:
    """The configuration label a policy's cells carry at ``length`` (full: 'full')."""
    for key in summary:
        n, config, p, _ = key.split("|")
        if int(n) == length and p == policy:
            return config
    return None


def compact(data: dict) -> str:
    summary, lengths, policies = data["summary"], data["lengths"], data["policies"]
    longest = max(lengths)
    head = ["policy", *[f"all, {n}" for n in lengths], *[f"long-memory, {n}" for n in lengths],
            f"KV bytes at {longest}"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for policy in policies:
        row = [f"`{policy}`"]
        for kind in ("all", "long_memory"):
            for n in lengths:
                row.append(short(summary.get(f"{n}|{config_of(summary, n, policy)}|{policy}|{kind}")))
        c = summary.get(f"{longest}|{config_of(summary, longest, policy)}|{policy}|all") or {}
        row.append(f"{c.get('kv_bytes', 0) / 1024:.0f} KiB" if c.get("kv_bytes") else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def full(data: dict) -> str:
    summary, lengths, policies = data["summary"], data["lengths"], data["policies"]
    kinds = list(dict.fromkeys(key.split("|")[3] for key in summary))
    out = []
    for n in lengths:
        head = ["kind", *policies]
        lines = [f"**{n} frames**", "", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for kind in kinds:
            lines.append("| " + " | ".join([kind, *[cell(summary.get(f"{n}|{config_of(summary, n, p)}|{p}|{kind}"))
                                                    for p in policies]]) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def last_seen(data: dict) -> str:
    """last_seen (evidence_stamps[0] within 2 s of the truth): a row per policy, a column per length."""
    summary, lengths = data["last_seen"]["summary"], data["lengths"]
    head = ["policy", *[f"{n} frames" for n in lengths]]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for policy in data["policies"]:
        lines.append("| " + " | ".join([f"`{policy}`", *[cell(summary.get(
            f"{n}|{config_of(summary, n, policy)}|{policy}|last_seen")) for n in lengths]]) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=pathlib.Path)
    parser.add_argument("--full", action="store_true")
    args = parser.parse_args()
    data = json.loads(args.json.read_text())
    machine = data.get("machine", {})
    print(f"<!-- {args.json.name}: {machine.get('device')}, {machine.get('date')}, commit {machine.get('commit')} -->")
    if data.get("last_seen") and not data["summary"]:
        print(last_seen(data))
    else:
        print(full(data) if args.full else compact(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
