"""The tables of docs/performance.md from a results folder (this machine's, or one a GPU run wrote).

    python bench/summary.py [bench/results]
"""
from __future__ import annotations

import json
import pathlib
import sys

import common


def pivot(rows: list[dict], row_key: str, column_key: str, cell) -> str:
    """A markdown table with one row per ``row_key`` value and one column per ``column_key`` value."""
    row_values = list(dict.fromkeys(r[row_key] for r in rows))
    columns = list(dict.fromkeys(r[column_key] for r in rows))
    cells = {(r[row_key], r[column_key]): cell(r) for r in rows}
    head = f"| {row_key} | " + " | ".join(str(c) for c in columns) + " |"
    rule = "|---" * (len(columns) + 1) + "|"
    body = [f"| {v} | " + " | ".join(cells.get((v, c), "") for c in columns) + " |" for v in row_values]
    return "\n".join([head, rule, *body])


def fmt(value, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def describe(machine: dict) -> str:
    commit = machine.get("commit") or "?"
    if machine.get("dirty"):
        commit += " (with uncommitted changes)"
    return (f"{machine['device']}, {machine.get('cpu_count')} cores, torch {machine['torch']}, "
            f"{machine['date'][:10]}, commit {commit}")


def cache_cost(data: dict) -> list[str]:
    out = [f"Cache cost at real shapes ({describe(data['machine'])}):"]
    rows = data["rows"]
    gpu = bool(data["machine"].get("cuda"))
    for model, notes in data["models"].items():
        mine = [r for r in rows if r["model"] == model]
        shape = notes["shape"]
        out.append(f"\n{model}, {shape['dtype']}, {notes['chunk_tokens']} tokens per chunk of "
                   f"{data['args']['chunk_frames']} frames; KV held after each chunk (GiB; *computed*: from the "
                   f"formula, the full cache not run that far):\n")
        out.append(pivot(mine, "frames", "policy", lambda r: (
            f"*{r['held_bytes'] / 2 ** 30:.3g}*" if r["source"] == "computed" else f"{r['held_bytes'] / 2 ** 30:.3g}")))
        last = max(r["frames"] for r in mine)
        out.append(f"\nPeak within a chunk (before compression) at {last} frames: " + ", ".join(
            f"{r['policy']} {r['peak_bytes'] / 2 ** 30:.3g}" for r in mine if r["frames"] == last) + " GiB; "
            f"every measured size equals the formula: {all(r.get('formula_ok', True) for r in mine)}.")
        work = "prefill (store + the chunk's attention)" if data["args"].get("attention") else "store (append)"
        out.append(f"\n{model}: median ms per chunk ({'GPU' if gpu else 'CPU'}), {work} + compress, "
                   "over the chunks since the previous length:\n")
        out.append(pivot([r for r in mine if r["source"] == "measured"], "frames", "policy",
                         lambda r: f"{fmt(r['append_ms'])} + {fmt(r['compress_ms'])}"))
    return out


def e2e(data: dict) -> list[str]:
    out = [f"End to end on the tiny models ({describe(data['machine'])}), ratios to `full` at the same length:"]
    for model in dict.fromkeys(r["model"] for r in data["rows"]):
        mine = [r for r in data["rows"] if r["model"] == model and r["policy"] != "full"]
        out.append(f"\n{model}: TTFT / ingest per chunk / decode tok/s / KV bytes, each ×full:\n")
        out.append(pivot(mine, "frames", "policy", lambda r: " / ".join(
            fmt(r.get(k), 2) for k in ("ttft_ms_vs_full", "chunk_ms_vs_full", "decode_tok_s_vs_full",
                                       "kv_bytes_vs_full"))))
        out.append(f"\n{model}: TTFT ms (median; this machine) and frames held:\n")
        out.append(pivot([r for r in data["rows"] if r["model"] == model], "frames", "policy",
                         lambda r: f"{fmt(r['ttft_ms'])} ({r['frames_in_memory']})"))
    return out


def stce(data: dict) -> list[str]:
    out = [f"H2SVC per-eviction update ({describe(data['machine'])}):\n"]
    out.append(common.table(data["rows"], [("heads", "episodic heads"), ("capacity", "N_e"), ("dim", "D"),
                                           ("median_ms", "ms per step (median)"), ("p90_ms", "p90 ms"),
                                           ("median_ms_per_head", "ms per head"),
                                           ("scores_per_step", "scores computed per step")]))
    return out


def main() -> None:
    folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else common.RESULTS)
    sections = {"cache_cost.json": cache_cost, "cache_cost_attention.json": cache_cost, "e2e_tiny.json": e2e,
                "stce_update.json": stce}
    for name, render in sections.items():
        path = folder / name
        if path.exists():
            print("\n".join(render(json.loads(path.read_text()))) + "\n")


if __name__ == "__main__":
    main()
