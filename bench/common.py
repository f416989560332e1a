"""Shared pieces of the benchmarks: results folder, timing, tables, JSON, the machine's description."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = ROOT / "bench" / "results"


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS, help="folder for the JSON (and PNG)")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# the code that runs is the code at the start (a commit made while a long benchmark runs is not
# it); "dirty": the measured code (bench/, streamcache_ros/) differs from that commit; the results
# under bench/ are not code (a result rewritten while another benchmark starts is not a dirty tree)
CODE = {"commit": _git("rev-parse", "--short", "HEAD") or None,
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", "bench", "streamcache_ros",
                           ":!bench/reported", ":!bench/results", ":!bench/figures"))}


def _cpu_name() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> dict:
    """What the figures were measured on: a result without this is not a result."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    cuda = device.startswith("cuda") and torch.cuda.is_available()
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(torch.device(device)) if cuda else f"CPU: {_cpu_name()}",
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda if cuda else None,
        **CODE,
    }
    if cuda:
        from streamcache_ros.engine.cache.attention import flash_attn_func  # noqa: PLC0415

        info["flash_attn"] = flash_attn_func() is not None
    return info


def write_json(name: str, payload: dict, out_dir: pathlib.Path | None = None, device: str = "cpu") -> pathlib.Path:
    out_dir = pathlib.Path(out_dir or RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(device), **payload}, indent=2, default=str) + "\n")
    return path



def free_text_unchecked(adapter):
    """``adapter`` with its folder's free-text declaration set aside (docs/interfaces.md "Free-text
    answers"), for benchmarks that read an answer's attention, not its words: the world model
    refuses "When did you last see ...?" without options, and its evidence is what they measure."""
    adapter.model_settings = {k: v for k, v in (adapter.model_settings or {}).items()
                              if k not in ("answers", "question_words")}
    return adapter


def synchronize(device) -> None:
    """Wait for queued GPU work, so a timer around it measures the work."""
    import torch  # noqa: PLC0415

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """``with watch: ...`` adds the block's wall time (GPU work included) to ``watch.ms``."""

    def __init__(self, device="cpu"):
        self.device = device
        self.ms = 0.0

    def __enter__(self):
        synchronize(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        synchronize(self.device)
        self.ms += (time.perf_counter() - self._start) * 1e3
        return False


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def available_memory(device) -> int:
    """Bytes that can still be allocated on ``device`` (CPU: MemAvailable)."""
    import torch  # noqa: PLC0415

    if torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30  # unknown: assume little


def human_bytes(n: float | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return str(n)


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """Markdown table: ``columns`` are (key, header); floats get 3 significant digits."""
    def cell(value):
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
        return "" if value is None else str(value)

    head = "| " + " | ".join(h for _, h in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(cell(r.get(k)) for k, _ in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])
