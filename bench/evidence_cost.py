"""What evidence costs: answering with the attention mass computed against answering without it.

    python bench/evidence_cost.py                    # both tiny models, every policy, and real shapes
    python bench/evidence_cost.py --questions 20 --lengths 64 256

SDPA and flash-attn return no attention weights, so for evidence the answer's tokens' q·K over the
cache is computed again, for the chosen layers only (docs/interfaces.md "Time windows and evidence").
Two measures, both ratios taken in one run (this machine is noisy; docs/performance.md):

1. End to end on the bundled tiny models: the same question answered with ``evidence_k`` 0 (no mass
   computed), 3 with the default layers (the middle half), and 3 with every layer, alternated, over
   a world stream of each length, for every policy; the answers are the same tokens (evidence never
   changes the logits), so the time per answer compares like with like. The tiny models are all
   attention (hidden size 64): this is an upper bound on the share.
2. One layer at real shapes (Qwen2.5-VL-7B: 28 query heads, 4 KV heads, head_dim 128): one decode
   step's attention over T cached tokens (SDPA), against the attention mass of the same query.
   A 7B decode step also reads ~15 GB of weights, so there the mass is a small part of a step.

Writes bench/reported/evidence_cost.json and prints the tables.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import ROOT, machine, median, table  # noqa: E402

from streamcache_ros import world  # noqa: E402

MODELS = ("tiny-qwen2_5_vl", "tiny-llava_onevision")
POLICIES = ("full", "fifo", "uniform", "hermes", "h2svc")
BUDGET_UNITS = 16  # bounded policies keep this many units per layer (h2svc: its windows below)
H2SVC = {"w_s": 2, "w_w": 8, "n_e": 24}
LOOK = world.Look(320, 240, (40, 50, 60), 4, 10, False, "rgb8")
QUESTION = "When did you last see the red circle?"
REAL = {"num_q_heads": 28, "num_kv_heads": 4, "head_dim": 128}
REPORTED = ROOT / "bench" / "reported"


def tiny_rows(model: str, lengths: list[int], questions: int, new_tokens: int) -> list[dict]:
    from streamcache_ros.engine import Session, SessionConfig, load_adapter  # noqa: PLC0415
    from streamcache_ros.engine.factory import build_policy  # noqa: PLC0415
    from streamcache_ros.engine.session import default_evidence_layers  # noqa: PLC0415

    adapter = load_adapter(model, device="cpu", dtype="float32")
    layers = adapter.geometry().num_layers
    per_unit = adapter.preprocess([world.make_stream(0, 1, look=LOOK).frame(0)] * adapter.frames_per_unit)
    budget = BUDGET_UNITS * per_unit.tokens_per_unit
    stream = world.make_stream(1, max(lengths), look=LOOK)
    rows = []
    for policy in POLICIES:
        params = {"policy": policy, "budget_tokens": budget, **{f"h2svc.{k}": v for k, v in H2SVC.items()}}
        sessions = {name: Session(adapter, build_policy(adapter, policy, params),
                                  SessionConfig(chunk_frames=8, max_new_tokens=new_tokens, evidence_layers=chosen))
                    for name, chosen in (("default", default_evidence_layers(layers)),
                                         ("all", tuple(range(layers))))}
        fed = 0
        for length in sorted(lengths):
            for i in range(fed, length):
                for session in sessions.values():
                    session.add_frame(stream.frame(i), stamp=stream.stamp(i))
            fed = length
            times = {"none": [], "default": [], "all": []}
            tokens = set()
            for _ in range(questions):  # alternated, so a slow spell of the machine hits all three
                for name, session, k in (("none", sessions["default"], 0), ("default", sessions["default"], 3),
                                         ("all", sessions["all"], 3)):
                    started = time.perf_counter()
                    answer = session.ask(QUESTION, max_new_tokens=new_tokens, evidence_k=k)
                    times[name].append((time.perf_counter() - started) * 1e3)
                    tokens.add(answer.answer_tokens)
            base = median(times["none"])
            rows.append({"model": model, "policy": policy, "frames": length, "layers": layers,
                         "default_layers": list(default_evidence_layers(layers)),
                         "answer_tokens": sorted(tokens), "kv_tokens": sessions["default"].status().cache.kv_tokens,
                         "ms_without": base, "ms_default": median(times["default"]), "ms_all": median(times["all"]),
                         "ratio_default": median(times["default"]) / base, "ratio_all": median(times["all"]) / base})
    return rows


def real_shape_rows(lengths: list[int], repeats: int) -> list[dict]:
    """One layer's decode-step attention (SDPA) against the attention mass, at Qwen2.5-VL-7B's shapes."""
    import torch  # noqa: PLC0415

    from streamcache_ros.engine.cache import KVStore  # noqa: PLC0415
    from streamcache_ros.engine.cache.attention import cached_attention  # noqa: PLC0415
    from streamcache_ros.engine.cache.evidence import AttentionMass  # noqa: PLC0415

    torch.manual_seed(0)
    hq, hkv, dim = REAL["num_q_heads"], REAL["num_kv_heads"], REAL["head_dim"]
    rows = []
    for length in lengths:
        keys, values = torch.randn(1, hkv, length, dim), torch.randn(1, hkv, length, dim)
        units = torch.arange(length) // 64
        store = KVStore(keys, values, torch.zeros(3, length), units, torch.zeros(length, dtype=torch.long),
                        torch.arange(hkv), True)
        q = torch.randn(1, hq, 1, dim)
        mass = AttentionMass([0], 1, int(units.max()) + 1)
        attention, extra = [], []
        with torch.inference_mode():
            for _ in range(repeats):
                started = time.perf_counter()
                cached_attention(q, keys, values)
                attention.append((time.perf_counter() - started) * 1e3)
                started = time.perf_counter()
                mass.observe(0, store, q, None)
                extra.append((time.perf_counter() - started) * 1e3)
        rows.append({"cached_tokens": length, **REAL, "attention_ms": median(attention), "mass_ms": median(extra),
                     "ratio": median(extra) / median(attention)})
    return rows


def main(argv=None) -> int:
    import torch  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--lengths", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--questions", type=int, default=9, help="answers per configuration and length")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--real-lengths", nargs="+", type=int, default=[1500, 6000, 24000])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=pathlib.Path, default=REPORTED)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    tiny = [row for model in args.models for row in tiny_rows(model, args.lengths, args.questions, args.new_tokens)]
    print(table(tiny, [("model", "model"), ("policy", "policy"), ("frames", "frames"), ("kv_tokens", "KV tokens"),
                       ("ms_without", "ms, no evidence"), ("ratio_default", "x, default layers"),
                       ("ratio_all", "x, every layer")]))
    real = real_shape_rows(args.real_lengths, args.repeats)
    print()
    print(table(real, [("cached_tokens", "cached tokens"), ("attention_ms", "attention ms (one layer, SDPA)"),
                       ("mass_ms", "mass ms"), ("ratio", "mass / attention")]))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "evidence_cost.json"
    path.write_text(json.dumps({"machine": machine("cpu"), "args": {k: str(v) if isinstance(v, pathlib.Path) else v
                                                                    for k, v in vars(args).items()},
                                "tiny": tiny, "real_shapes": real,
                                "seconds": round(time.perf_counter() - started)}, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
