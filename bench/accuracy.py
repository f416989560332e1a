"""Accuracy against KV memory for every policy, on held-out shape-world streams (docs/world.md).

    python bench/accuracy.py                                  # the table, the sweep, the node check
    python bench/accuracy.py --model world-llava_onevision --short-streams 150 --long-streams 50
    python bench/accuracy.py --lengths 32 64 --short-streams 20 --no-node     # a quick look

Every stream is a seeded world stream the training never saw (seeds from 500 000 000; training
draws from 100 000 000 and validates on 900 000 000). Frames go through the real path: a `Session`
per policy over one shared model (the vision encoder runs once per chunk for all of them), the
node's defaults (`sample_fps` 1.0, `chunk_frames` 8), then every question kind whose precondition
holds is asked with its options and scored by `option_index`.

Policies are compared at equal KV bytes: each bounded policy's own knobs (`budget_tokens` for
fifo / hermes / uniform, `w_s` / `w_w` / `n_e` for h2svc) are set per stream so that what it holds at
steady state is ``--fraction`` (default 1/8) of what the full cache holds at the longest length;
the bytes actually held are measured and reported, and the run says where they differ by more than
5%. ``--sweep`` repeats the longest length at several fractions. One configuration also runs
through the node over DDS, on replayed world bags, and must give the Session's answers.

Time, through the memory itself (docs/world.md "Windows", docs/interfaces.md "When"):

- ``last_seen`` / ``first_seen``: the `when` search (mode last / first, the question `Did you see a
  {colour} {shape}?`), right within ±2 s; the Ask's ``evidence_stamps[0]`` beside it
  (``last_seen_evidence``);
- ``seen@8``: `seen` over 8-frame windows at random places of 128-frame streams (``--windowed``);
- ``watch``: standing questions asked over every chunk just encoded, their answer against the
  truth per chunk (``--watch``).

``--hour-streams`` runs 3 600-frame streams (one hour at 1 fps) for the bounded policies at equal
bytes and records per 600 frames: the long-memory kinds' accuracy, KV bytes, the largest position
against the model's range, and prefill / compress ms per chunk.

Output: a table per length (kind x policy: accuracy, 95% Wilson interval, n), the long-memory
subset (first_*, seen, where the evidence is older than the window a FIFO of the same bytes
holds), JSON with every answer, and a plot of accuracy against KV bytes.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import ROOT, free_text_unchecked, machine, table  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine import Answer, QuestionError  # noqa: E402

POLICIES = ("full", "fifo", "hermes", "h2svc", "uniform")
LENGTHS = (32, 64, 128, 512)
ACCURACY_SEED = 500_000_000
SHORT_POINTS = (32, 64, 128)  # asked along one 128-frame stream
SWEEP_FRACTIONS = (1 / 16, 1 / 8, 1 / 4)
REPORTED = ROOT / "bench" / "reported"
FIGURES = ROOT / "bench" / "figures"
SCORED_KINDS = world.OPTION_KINDS
LONG_MEMORY = ("first_color", "first_shape", "seen")
WHEN_KINDS = ("last_seen", "first_seen")  # scored through the when search (±2 s)
TIME_KINDS = (*WHEN_KINDS, "last_seen_evidence", "seen@8", "watch")  # the time table's rows
WINDOW_FRAMES = 8
HOUR_FRAMES = 3600  # one hour at 1 fps; asked every sixth of it


def hour_points(frames: int) -> list[int]:
    step = max(frames // 6, 1)
    return list(range(step, frames + 1, step))


# -- equal bytes -----------------------------------------------------------------------------------
@dataclass
class Geometry:
    prefix: int  # system-prompt tokens (every layer, every head keeps them)
    tokens_per_unit: int  # for this stream's frame size
    frames_per_unit: int
    bank_fractions: tuple[float, float, float]  # H2SVC: share of KV heads per bank


def policy_knobs(policy: str, target_tokens: float, g: Geometry, instant_frames: int = 0) -> dict:
    """The policy's own parameters that make it hold ``target_tokens`` per layer (mean over KV heads
    for h2svc) at steady state, prefix included. ``instant_frames``: with the instant window
    (docs/architecture.md "The instant window") of that many frames, whose tokens every layer and
    head holds beside the policy's bound: the bound is what is left of the target."""
    if policy == "full":
        return {}
    window = math.ceil(instant_frames / g.frames_per_unit) * g.tokens_per_unit  # chunks of 8: whole units
    video = max(target_tokens - g.prefix - window, g.tokens_per_unit)
    instant = {"instant_frames": int(instant_frames)} if instant_frames else {}
    if policy in ("fifo", "uniform", "hermes"):
        # HERMES compresses when layer 0 passes its budget counting the prefix (docs/hermes.md §2) but
        # then keeps prefix + budget; a budget of video + prefix held 10% more bytes than fifo
        return {"budget_tokens": int(round(video)), **instant}
    if policy == "h2svc":
        units = video / g.tokens_per_unit  # units per head, on average over the banks
        f_s, f_w, f_e = g.bank_fractions
        # the paper's proportions W_s : W_w : N_e = 4 : 16 : 64, scaled to the bytes
        scale = units / (4 * f_s + 16 * f_w + 64 * f_e)
        w_s, w_w = max(1, round(4 * scale)), max(1, round(16 * scale))
        n_e = max(2, round((units - f_s * w_s - f_w * w_w) / f_e)) if f_e else 2
        return {"w_s": w_s, "w_w": w_w, "n_e": n_e, **instant}
    raise ValueError(f"no knobs for policy '{policy}'")


# knobs that are general parameters (the rest are "<policy>.<knob>")
GENERAL_KNOBS = ("budget_tokens", "instant_frames")


def knob_parameters(policy: str, knobs: dict) -> dict:
    """``knobs`` as the node's parameters."""
    return {(k if k in GENERAL_KNOBS else f"{policy}.{k}"): v for k, v in knobs.items()}


def window_frames(target_tokens: float, g: Geometry) -> int:
    """The frames a FIFO holding ``target_tokens`` per layer keeps: evidence older than this is
    what only a long memory can answer from."""
    return int((target_tokens - g.prefix) // g.tokens_per_unit) * g.frames_per_unit


# -- the model, once -------------------------------------------------------------------------------
class SharedEncoder:
    """The adapter's vision encoder, run once per chunk for every session fed the same frames."""

    def __init__(self, inner):
        self.inner = inner
        self.name = getattr(inner, "name", "torch")
        self.memo: dict[str, object] = {}

    def __call__(self, tensors):
        key = hashlib.blake2b(b"".join(t.numpy().tobytes() for t in tensors.values()), digest_size=16).hexdigest()
        if key not in self.memo:
            if len(self.memo) > 16:
                self.memo.clear()
            self.memo[key] = self.inner(tensors)
        return self.memo[key]


def load(model: str):
    from streamcache_ros.engine import load_adapter  # noqa: PLC0415

    adapter = load_adapter(model, device="cpu", dtype="float32")
    adapter.vision_encoder = SharedEncoder(adapter.vision_encoder)
    return free_text_unchecked(adapter)  # last_seen_evidence asks "When ...?" without options, for its evidence


def geometry_for(adapter, look: world.Look, head_map_path: str) -> Geometry:
    probe = np.zeros((look.height, look.width, 3), np.uint8)
    inputs = adapter.preprocess([probe] * adapter.frames_per_unit)
    fractions = head_map_fractions(head_map_path) if head_map_path else (0.0, 0.0, 0.0)
    return Geometry(len(adapter.prefix_ids), inputs.tokens_per_unit, adapter.frames_per_unit, fractions)


def head_map_fractions(path: str) -> tuple[float, float, float]:
    """The share of KV heads in each H2SVC bank, by the head map's own ratios (the policy's default)."""
    from streamcache_ros.engine.cache.sap import HeadMap  # noqa: PLC0415

    head_map = HeadMap.load(path)
    bank = head_map.bank_ids(head_map.ratios, "head")
    total = bank.numel()
    return tuple(float((bank == b).sum()) / total for b in range(3))


def make_session(adapter, policy: str, knobs: dict, head_map_path: str = ""):
    """A session as the node builds it: the policy from flat parameters (the head map from the
    model's folder, or ``head_map_path``)."""
    from streamcache_ros.engine import Session, SessionConfig  # noqa: PLC0415
    from streamcache_ros.engine.factory import build_policy  # noqa: PLC0415

    params = {"policy": policy, **knob_parameters(policy, knobs)}
    if policy == "h2svc" and head_map_path:
        params["h2svc.head_map_path"] = head_map_path
    return Session(adapter, build_policy(adapter, policy, params), SessionConfig(chunk_frames=8))


# -- running streams ---------------------------------------------------------------------------------
# the world the streams are drawn from: the shape world, or the patrol world (docs/world.md "The patrol
# world": the same frames' rules, what is in view decided by where the robot is)
STREAMS = {"shape": world.make_stream, "patrol": world.make_patrol_stream}
WORLD_KIND = ["shape"]


def run_stream(adapter, seed: int, points: list[int], fractions: dict[str, float], head_map_path: str,
               per_kind: int, policies: tuple[str, ...], reference_fraction: float = 1 / 8,
               max_new_tokens: int = 0, kinds: tuple[str, ...] = SCORED_KINDS, windows: int = 0,
               watch: bool = False, full_until: int = 0, longest: int = 0, instant_frames: int = 0,
               budget_tokens: int = 0) -> list[dict]:
    """One held-out stream of ``max(points)`` frames through one session per (policy, fraction);
    every question kind asked after each of ``points`` frames (last_seen / first_seen through the
    when search). One record per (session, question). The full cache's long-memory questions are
    those older than ``reference_fraction``'s window. ``windows``: that many windowed seen
    questions over 8-frame windows at each point; ``watch``: standing questions on every chunk;
    ``full_until``: stop feeding the full cache after that many frames (0: never; the hour runs);
    ``longest``: the length the bytes are equalised at (default: the longest of LENGTHS);
    ``instant_frames``: every bounded policy's instant window, within the same bytes;
    ``budget_tokens``: every bounded policy holds the prefix and this many video tokens per layer
    (the node's ``budget_tokens``) instead of a fraction of the full cache."""
    length = max(points)
    stream = STREAMS[WORLD_KIND[0]](seed, length, question_points=points)
    g = geometry_for(adapter, stream.look, head_map_path)
    full_longest = g.prefix + math.ceil((longest or max(LENGTHS)) / g.frames_per_unit) * g.tokens_per_unit
    sessions = []
    for policy in policies:
        for label, fraction in (fractions.items() if policy != "full" else [("full", 1.0)]):
            target = g.prefix + budget_tokens if budget_tokens else fraction * full_longest
            knobs = policy_knobs(policy, target, g, instant_frames)
            reference = g.prefix + budget_tokens if budget_tokens else reference_fraction * full_longest
            window = window_frames(reference if policy == "full" else target, g)
            sessions.append((policy, label, fraction, knobs, window,
                             make_session(adapter, policy, knobs, head_map_path)))
    records = []
    standing = watch_questions(stream, seed) if watch else []
    chunk_times = defaultdict(list)
    for i in range(length):
        rgb = stream.frame(i)
        for policy, label, *_, session in sessions:
            if policy == "full" and full_until and i >= full_until:
                continue
            report = session.add_frame(rgb, stamp=stream.stamp(i))
            if report is not None:
                chunk_times[label if policy != "full" else "full", policy].append((report.prefill_ms,
                                                                                   report.compress_ms))
                records += watch_records(session, standing, report, stream, seed, policy, label, i)
        n = i + 1
        if n not in points:
            continue
        rng = np.random.default_rng((seed, n, 3))
        questions = stream.questions(n, rng, kinds, per_kind)
        questions += windowed_seen(stream, n, windows, rng)
        for policy, label, fraction, knobs, window, session in sessions:
            if policy == "full" and full_until and n > full_until:
                continue
            times = chunk_times.pop((label if policy != "full" else "full", policy), [])
            per_point = {"prefill_ms": float(np.mean([t[0] for t in times])) if times else None,
                         "compress_ms": float(np.mean([t[1] for t in times])) if times else None}
            for q in questions:
                if q.kind in WHEN_KINDS:
                    records += when_records(session, q, stream, seed, n, policy, label, fraction, knobs, g,
                                            per_point)
                    continue
                since, until = (stream.stamp(q.window[0]), stream.stamp(q.window[1])) if q.window else (None, None)
                try:
                    answer = session.ask(q.text, q.options, max_new_tokens=max_new_tokens, since=since, until=until)
                except QuestionError as err:  # the window's frames were evicted: what the memory lost
                    answer = Answer(f"refused: {err}", -1, 0, 0.0, 0.0, 0, 0.0, 0.0, 0)
                status = session.status()
                records.append({
                    "seed": seed, "length": n, "policy": policy, "config": label, "fraction": fraction,
                    "knobs": knobs, "kind": "seen@8" if q.window else q.kind, "question": q.text, "truth": q.answer_index,
                    "answer": answer.text, "option_index": answer.option_index,
                    "correct": answer.option_index == q.answer_index,
                    "evidence_age": (n - 1 - max(q.evidence_frames)) if q.evidence_frames else None,
                    "window_frames": window, "kv_bytes": status.cache.kv_bytes,
                    "kv_tokens": status.cache.kv_tokens, "frames_in_memory": status.frames_in_memory,
                    "tokens_per_unit": g.tokens_per_unit, "max_position": status.cache.max_position,
                    "position_range": adapter.text_config.max_position_embeddings,
                    "look": [stream.look.width, stream.look.height, stream.look.encoding], **per_point})
    return records


def windowed_seen(stream, n: int, count: int, rng) -> list:
    """``count`` seen questions over 8-frame windows at random places of the first ``n`` frames."""
    out = []
    for _ in range(count if n >= WINDOW_FRAMES else 0):
        first = int(rng.integers(0, n - WINDOW_FRAMES + 1))
        out += stream.window_questions(n, first, first + WINDOW_FRAMES - 1, rng, ("seen",))
    return out


def when_records(session, q, stream, seed, n, policy, label, fraction, knobs, g, per_point) -> list[dict]:
    """last_seen / first_seen through the when search (±2 s); for last_seen, the Ask's first
    evidence stamp beside it (last_seen_evidence)."""
    mode = "last" if q.kind == "last_seen" else "first"
    truth = stream.stamp(q.answer_frame)
    found = session.when(q.probe, mode)
    status = session.status()
    base = {"seed": seed, "length": n, "policy": policy, "config": label, "fraction": fraction, "knobs": knobs,
            "question": q.probe, "truth_stamp": truth, "window_frames": 0, "kv_bytes": status.cache.kv_bytes,
            "kv_tokens": status.cache.kv_tokens, "frames_in_memory": status.frames_in_memory,
            "tokens_per_unit": g.tokens_per_unit, "evidence_age": n - 1 - q.answer_frame,
            "max_position": status.cache.max_position, **per_point}
    out = [{**base, "kind": q.kind, "said_stamp": found.stamp if found.found else None,
            "correct": found.found and abs(found.stamp - truth) <= LAST_SEEN_TOLERANCE_S,
            "questions_asked": found.questions_asked, "when_ms": found.total_ms}]
    if q.kind == "last_seen":
        answer = session.ask(q.text, [])
        said = answer.evidence[0].stamp if answer.evidence else None
        out.append({**base, "kind": "last_seen_evidence", "said_stamp": said,
                    "correct": said is not None and abs(said - truth) <= LAST_SEEN_TOLERANCE_S})
    return out


def watch_questions(stream, seed: int) -> list[str]:
    """Two standing questions for a stream: an identity it shows at some point, and one at random."""
    rng = np.random.default_rng((seed, 11))
    shown = sorted({v.identity for f in stream.truth for v in f})
    every = [(s, c) for s in world.SHAPES for c in world.COLOUR_NAMES]
    picks = [shown[int(rng.integers(len(shown)))]] if shown else []
    picks.append(every[int(rng.integers(len(every)))])
    return [world.SEEN_PROBE.format(colour=c, shape=s) for s, c in picks]


def watch_records(session, questions, report, stream, seed, policy, label, last: int) -> list[dict]:
    """The standing questions over the chunk just encoded (its last frame is ``last``), against the
    truth of its frames."""
    if not questions:
        return []
    frames = range(last - report.frames + 1, last + 1)
    out = []
    for a in session.watch(questions, report):
        colour, shape = a.question[:-1].split()[-2:]
        truth = any(v.identity == (shape, colour) for i in frames for v in stream.truth[i])
        out.append({"seed": seed, "length": last + 1, "policy": policy, "config": label, "kind": "watch",
                    "question": a.question, "truth": truth, "yes_probability": a.yes_probability,
                    "correct": (a.answer == "yes") == truth, "window_frames": 0, "evidence_age": None,
                    "kv_bytes": 0})
    return out


def long_memory(record: dict) -> bool:
    """first_* always; seen when its evidence (a 'yes') is older than the window, or a 'no'
    (an identity never in view: telling it from one seen long ago is what the question tests)."""
    if record["kind"] not in LONG_MEMORY:
        return False
    age = record["evidence_age"]
    return age is None or age >= record["window_frames"]


# -- statistics ----------------------------------------------------------------------------------------
def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def cell(records: list[dict]) -> dict:
    n, hits = len(records), sum(r["correct"] for r in records)
    lo, hi = wilson(hits, n)
    return {"n": n, "accuracy": hits / n if n else None, "ci95": [round(lo, 3), round(hi, 3)],
            "kv_bytes": float(np.mean([r["kv_bytes"] for r in records])) if records else None}


def summarise(records: list[dict]) -> dict:
    by = defaultdict(list)
    for r in records:
        by[(r["length"], r["config"], r["policy"], r["kind"])].append(r)
        by[(r["length"], r["config"], r["policy"], "all")].append(r)
        if long_memory(r):
            by[(r["length"], r["config"], r["policy"], "long_memory")].append(r)
    return {"|".join(map(str, k)): cell(v) for k, v in sorted(by.items(), key=lambda kv: str(kv[0]))}


def cells_filled(records: list[dict], points, policy: str, minimum: int, kinds=SCORED_KINDS) -> bool:
    counts = defaultdict(int)
    for r in records:
        if r["policy"] == policy:
            counts[(r["length"], r["kind"])] += 1
    return all(counts[(n, k)] >= minimum for n in points for k in kinds)


def bytes_check(records: list[dict]) -> list[str]:
    """Bounded policies at one fraction, on one stream, at the end: within 5% of each other."""
    out = []
    by = defaultdict(dict)
    for r in records:
        if r["policy"] != "full":
            by[(r["seed"], r["length"], r["config"])][r["policy"]] = r["kv_bytes"]
    for (seed, length, label), held in by.items():
        if length != max(LENGTHS) or len(held) < 2:
            continue
        low, high = min(held.values()), max(held.values())
        if high > 1.05 * low:
            out.append(f"seed {seed} {label}: {held}")
    return out


# -- the node, over DDS --------------------------------------------------------------------------------
def node_check(model: str, policy: str, streams: int, length: int, fraction: float, head_map_path: str,
               work: pathlib.Path, instant_frames: int = 0) -> dict:
    """World bags replayed (lock-step) into streamcache_node; the questions asked over DDS; the
    answers compared with a Session fed the same frames."""
    import node_harness as harness  # noqa: PLC0415

    from streamcache_ros.client.client import StreamCacheClient  # noqa: PLC0415
    from streamcache_ros.tools.bagfile import DEFAULT_START_NS, make_world_bag, read_world_questions  # noqa: PLC0415

    adapter = load(model)
    work.mkdir(parents=True, exist_ok=True)
    seeds = [ACCURACY_SEED + 9_000_000 + i for i in range(streams)]
    first = world.make_stream(seeds[0], length)
    g = geometry_for(adapter, first.look, head_map_path)
    # one node, one configuration: the knobs of the first stream's frame size, frames of that size
    full_longest = g.prefix + math.ceil(max(LENGTHS) / g.frames_per_unit) * g.tokens_per_unit
    knobs = policy_knobs(policy, fraction * full_longest, g, instant_frames)
    # every bag in the first stream's encoding; a JPEG stream is on <topic>/compressed (docs/world.md)
    camera = "/camera/image_raw" + ("/compressed" if first.look.encoding == "jpeg" else "")
    params = {"model_path": model, "policy": policy, "device": "cpu", "camera_topics": f"['{camera}']",
              **knob_parameters(policy, knobs)}
    domain = harness.new_domain()
    env = harness.child_env(domain)
    namespace = "/accuracy"
    node = harness.start(harness.node_command(namespace, params), env, work / "node.log")
    import os  # noqa: PLC0415

    os.environ["ROS_DOMAIN_ID"] = str(domain)
    client = StreamCacheClient(namespace, timeout=180.0)
    results = []
    try:
        for k, seed in enumerate(seeds):
            look = world.Look(**{**world.make_stream(seed, 4).look.__dict__, "width": first.look.width,
                                 "height": first.look.height, "encoding": first.look.encoding})
            bag = make_world_bag(work / f"bag{k}", seed, length, look=look, overwrite=True,
                                 start_ns=DEFAULT_START_NS + k * 100_000 * 1_000_000_000)
            client.reset()
            done = harness.subprocess.run(harness.replay_command(bag, namespace), env=env, cwd=ROOT,
                                          capture_output=True, text=True, timeout=harness.GUARD_S)
            if done.returncode != 0:
                raise RuntimeError(f"replay failed: {done.stdout[-500:]} {done.stderr[-500:]}")
            session = make_session(adapter, policy, knobs, head_map_path)
            stream = world.make_stream(seed, length, look=look)
            for i in range(length):
                session.add_frame(stream.frame(i), stamp=float(i))
            for q in read_world_questions(bag)["questions"]:
                if not q["options"]:
                    continue
                r = client.ask(q["text"], q["options"])
                mine = session.ask(q["text"], q["options"])
                results.append({"seed": seed, "kind": q["kind"], "truth": q["answer_index"],
                                "node": r.option_index, "node_ok": r.success, "session": mine.option_index})
    finally:
        client.close()
        harness.stop(node)
    agree = sum(r["node"] == r["session"] for r in results)
    hits = sum(r["node"] == r["truth"] for r in results)
    return {"policy": policy, "knobs": knobs, "streams": streams, "length": length, "questions": len(results),
            "node_accuracy": hits / len(results) if results else None, "ci95": wilson(hits, len(results)),
            "same_answer_as_session": agree, "answers": results}


LAST_SEEN_TOLERANCE_S = 2.0


# -- output ----------------------------------------------------------------------------------------------
def print_tables(summary: dict, lengths, policies, label: str) -> None:
    for length in lengths:
        rows = []
        for kind in (*SCORED_KINDS, "long_memory", "all"):
            row = {"kind": kind}
            for policy in policies:
                c = summary.get(f"{length}|{'full' if policy == 'full' else label}|{policy}|{kind}")
                row[policy] = (f"{c['accuracy']:.2f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}] n={c['n']}"
                               if c and c["n"] else "")
            rows.append(row)
        held = (f"{label} a layer" if label.endswith("tokens")
                else f"{label} of the full cache's bytes at {max(LENGTHS)} frames")
        print(f"\n{length} frames (bounded policies at {held})")
        print(table(rows, [("kind", "kind"), *[(p, p) for p in policies]]))


def plot(summary: dict, policies, path: pathlib.Path, model: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    length = max(LENGTHS)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, kind, title in ((axes[0], "all", "all questions"), (axes[1], "long_memory", "long-memory questions")):
        for policy in policies:
            points = sorted((c["kv_bytes"], c["accuracy"], c["ci95"]) for key, c in summary.items()
                            if key.startswith(f"{length}|") and key.endswith(f"|{policy}|{kind}") and c["n"])
            if not points:
                continue
            xs = [p[0] / 1024 for p in points]
            ys = [p[1] for p in points]
            err = [[y - p[2][0] for y, p in zip(ys, points)], [p[2][1] - y for y, p in zip(ys, points)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=policy)
        ax.set_xscale("log")
        ax.set_xlabel("KV cache held at the question (KiB, log scale)")
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{title}, {length}-frame streams")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{model}: accuracy against KV memory (95% intervals)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def print_time(summary: dict, lengths, policies, label: str) -> None:
    """Time, through the memory: a row per kind, a column per policy, one table per length."""
    for length in lengths:
        rows = []
        for kind in TIME_KINDS:
            row = {"kind": kind}
            for policy in policies:
                c = summary.get(f"{length}|{'full' if policy == 'full' else label}|{policy}|{kind}")
                row[policy] = (f"{c['accuracy']:.2f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}] n={c['n']}"
                               if c and c["n"] else "")
            if any(row[p] for p in policies):
                rows.append(row)
        if rows:
            print(f"\ntime at {length} frames: when within ±{LAST_SEEN_TOLERANCE_S:g} s, seen over 8-frame windows, "
                  f"standing questions per chunk (bounded policies at {label})")
            print(table(rows, [("kind", "kind"), *[(p, p) for p in policies]]))


def hour_table(records: list[dict], policies, label: str, position_range: int, frames: int) -> dict:
    """Per policy and sixth of the hour: long-memory accuracy, KV bytes, the largest position, ms per
    chunk; and whether memory, positions and per-chunk time stayed flat."""
    out = {}
    for policy in policies:
        mine = [r for r in records if r["policy"] == policy and r["config"] == label]
        rows = []
        for n in hour_points(frames):
            at = [r for r in mine if r["length"] == n]
            if not at:
                continue
            scored = [r for r in at if r["kind"] in (*LONG_MEMORY, *WHEN_KINDS)]
            rows.append({"frames": n, **cell(scored), "kv_bytes": float(np.mean([r["kv_bytes"] for r in at])),
                         "max_position": max(r["max_position"] for r in at),
                         "prefill_ms": median_of(at, "prefill_ms"), "compress_ms": median_of(at, "compress_ms")})
        if not rows:
            continue
        held = [r["kv_bytes"] for r in rows[1:]] or [rows[0]["kv_bytes"]]  # full from the first sixth on
        third = max(1, len(rows) // 3)
        out[policy] = {"rows": rows, "memory_flat": max(held) <= 1.05 * min(held),
                       "positions_inside": all(r["max_position"] < position_range for r in rows),
                       # medians of the last third against the first: noise aside, no growth with time
                       "chunk_time_flat": all(median_of(rows[-third:], k) <= 1.5 * median_of(rows[:third], k) + 5.0
                                              for k in ("prefill_ms", "compress_ms")
                                              if median_of(rows[:third], k) is not None)}
    return out


def median_of(records: list[dict], key: str):
    values = [r[key] for r in records if r.get(key) is not None]
    return float(np.median(values)) if values else None


def print_hour(hour: dict, position_range: int) -> None:
    for policy, result in hour.items():
        print(f"\none hour, {policy}: memory flat {result['memory_flat']}, positions inside the range "
              f"({position_range}) {result['positions_inside']}, per-chunk time flat {result['chunk_time_flat']}")
        print(table([{**r, "accuracy": f"{r['accuracy']:.2f} n={r['n']}" if r["n"] else ""} for r in result["rows"]],
                    [("frames", "frames"), ("accuracy", "long-memory accuracy"), ("kv_bytes", "KV bytes"),
                     ("max_position", "largest position"), ("prefill_ms", "prefill ms/chunk"),
                     ("compress_ms", "compress ms/chunk")]))


def main(argv=None) -> int:
    from streamcache_ros.engine.adapters.models import DEFAULT_MODEL  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    parser.add_argument("--world", choices=tuple(STREAMS), default="shape",
                        help="the streams' world: shape (default) or patrol (docs/world.md)")
    parser.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
    parser.add_argument("--fraction", type=float, default=1 / 8, help="bounded bytes / full bytes at the longest length")
    parser.add_argument("--min-questions", type=int, default=100, help="per cell (kind x length x policy)")
    parser.add_argument("--short-streams", type=int, default=300,
                        help="128-frame streams at most, asked after 32, 64 and 128 frames")
    parser.add_argument("--long-streams", type=int, default=100, help="512-frame streams")
    parser.add_argument("--hour-streams", type=int, default=0, help="3600-frame streams (bounded policies)")
    parser.add_argument("--hour-frames", type=int, default=HOUR_FRAMES, help="a shorter 'hour' (the smoke test)")
    parser.add_argument("--per-kind", type=int, default=3, help="questions of one kind per point at most")
    parser.add_argument("--windowed", type=int, default=6,
                        help="seen questions over 8-frame windows after 128 frames, per stream")
    parser.add_argument("--no-time", action="store_true", help="no when search, no standing questions")
    parser.add_argument("--sweep-streams", type=int, default=40,
                        help="of the 512-frame streams, how many also run the budget sweep")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="per answer (0: the session's default)")
    parser.add_argument("--budget-tokens", type=int, default=0,
                        help="instead of --fraction: every bounded policy holds the prefix and this many video tokens "
                             "per layer (the node's budget_tokens; the model folder's own is the node's default)")
    parser.add_argument("--instant-frames", type=int, default=0,
                        help="every bounded policy's instant window (the newest N frames of each camera kept whole, "
                             "docs/architecture.md \"The instant window\"), within the same bytes; 0: off")
    parser.add_argument("--no-node", action="store_true")
    parser.add_argument("--node-policy", default="hermes")
    parser.add_argument("--node-streams", type=int, default=12)
    parser.add_argument("--name", default="", help="the JSON's name (default accuracy-<model>)")
    parser.add_argument("--out", type=pathlib.Path, default=REPORTED)
    parser.add_argument("--node-only", action="store_true",
                        help="only the check through the node; its result replaces 'node' in the existing JSON")
    args = parser.parse_args(argv)
    WORLD_KIND[0] = args.world
    kinds = SCORED_KINDS + (() if args.no_time else WHEN_KINDS)
    adapter = load(args.model)
    from streamcache_ros.engine.adapters import read_model_settings  # noqa: PLC0415
    from streamcache_ros.engine.cache import POLICIES as REGISTERED  # noqa: PLC0415
    from streamcache_ros.engine.adapters.models import resolve_model_path  # noqa: PLC0415

    folder = pathlib.Path(resolve_model_path(args.model))
    head_map_path = str(folder / "h2svc_head_map.json") if (folder / "h2svc_head_map.json").is_file() else ""
    policies = tuple(p for p in args.policies if p in REGISTERED and (p != "h2svc" or head_map_path))
    label = f"{args.budget_tokens} tokens" if args.budget_tokens else f"1/{round(1 / args.fraction)}"
    if args.budget_tokens:
        args.sweep_streams = 0  # the sweep is over fractions of the full cache
    name = args.name or f"accuracy-{pathlib.Path(args.model).name}"
    if args.node_only:
        return node_only(args, head_map_path, name)
    main_fraction = {label: args.fraction}
    sweep_fractions = {f"1/{round(1 / f)}": f for f in SWEEP_FRACTIONS} | main_fraction
    records, started = [], time.perf_counter()
    short = [n for n in args.lengths if n in SHORT_POINTS]
    for i in range(args.short_streams if short else 0):
        records += run_stream(adapter, ACCURACY_SEED + i, short, main_fraction, head_map_path, args.per_kind,
                              policies, args.fraction, args.max_new_tokens, kinds,
                              windows=0 if args.no_time else args.windowed, watch=not args.no_time,
                              instant_frames=args.instant_frames, budget_tokens=args.budget_tokens)
        if cells_filled(records, short, policies[0], args.min_questions):
            break
        if i % 25 == 24:
            print(f"  {i + 1} streams of {max(short)} frames, {time.perf_counter() - started:.0f} s", flush=True)
    if short:
        print(f"{max(short)}-frame streams: {i + 1}, {time.perf_counter() - started:.0f} s", flush=True)
    for i in range(args.long_streams if max(LENGTHS) in args.lengths else 0):
        fractions = sweep_fractions if i < args.sweep_streams else main_fraction
        records += run_stream(adapter, ACCURACY_SEED + 5_000_000 + i, [max(LENGTHS)], fractions, head_map_path,
                              args.per_kind, policies, args.fraction, args.max_new_tokens, kinds,
                              instant_frames=args.instant_frames, budget_tokens=args.budget_tokens)
        if i % 10 == 9:
            print(f"  {i + 1} streams of {max(LENGTHS)} frames, {time.perf_counter() - started:.0f} s", flush=True)
    hour_records = []
    bounded = tuple(p for p in policies if p != "full")
    for i in range(args.hour_streams):
        hour_records += run_stream(adapter, ACCURACY_SEED + 7_000_000 + i, hour_points(args.hour_frames), main_fraction,
                                   head_map_path, args.per_kind, bounded, args.fraction, args.max_new_tokens,
                                   LONG_MEMORY + (() if args.no_time else WHEN_KINDS),
                                   instant_frames=args.instant_frames, budget_tokens=args.budget_tokens)
        print(f"  {i + 1} streams of {args.hour_frames} frames, {time.perf_counter() - started:.0f} s", flush=True)
    sweep = [r for r in records if r["length"] == max(LENGTHS) and r["seed"] < ACCURACY_SEED + 5_000_000 +
             args.sweep_streams and r["kind"] in SCORED_KINDS]
    records = [r for r in records if r["config"] in (label, "full")]
    timed = [r for r in records if r["kind"] in TIME_KINDS]
    records = [r for r in records if r["kind"] in SCORED_KINDS]
    summary, time_summary = summarise(records), summarise(timed)
    print_tables(summary, args.lengths, policies, label)
    print_time(time_summary, args.lengths, policies, label)
    position_range = adapter.text_config.max_position_embeddings
    hour = hour_table(hour_records, bounded, label, position_range, args.hour_frames) if hour_records else {}
    if hour:
        print_hour(hour, position_range)
        hour["full"] = full_past_range(records, position_range, args.hour_frames)
        print(f"\nfull at {args.hour_frames} frames: {hour['full']['note']}")
    node = None if args.no_node else checked_node(args, head_map_path)
    if node and "error" in node:
        print(f"\nnode over DDS: not measured ({node['error']})")
    elif node:
        print(f"\nnode over DDS ({node['policy']}, {node['streams']} streams of 64 frames): accuracy "
              f"{node['node_accuracy']:.3f}, the Session's answer in {node['same_answer_as_session']}/{node['questions']}")
    mismatched = bytes_check(records + [r for r in sweep if r["config"] != label])
    print("\nequal bytes: " + ("all within 5%" if not mismatched else f"{len(mismatched)} streams off by > 5%"))
    sweep_summary = summarise(sweep) if sweep else {}
    out = {"machine": machine("cpu"), "model": args.model, "world": args.world, "policies": policies, "lengths": args.lengths,
           "fraction": args.fraction, "budget_tokens": args.budget_tokens, **({"instant_frames": args.instant_frames} if args.instant_frames else {}), "options_prompt": read_model_settings(str(folder)).get("options_prompt"),
           "seconds": round(time.perf_counter() - started), "summary": summary, "time": time_summary,
           "hour": hour, "sweep": sweep_summary, "bytes_mismatch": mismatched, "node": node, "records": records,
           "time_records": timed, "hour_records": hour_records,
           "sweep_records": [r for r in sweep if r["config"] not in (label, "full")]}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{name}.json"
    path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    if sweep_summary:
        plot(sweep_summary, policies, FIGURES / f"{name}.png", args.model)
    print(f"wrote {path}")
    return 0


def full_past_range(records: list[dict], position_range: int, frames: int) -> dict:
    """The full cache at one hour, from its largest position at the longest length measured (it
    grows by the same positions per frame): computed, not run."""
    full = [r for r in records if r["policy"] == "full" and r.get("max_position") is not None]
    if not full:
        return {"note": "not measured"}
    longest = max(r["length"] for r in full)
    at = max(r["max_position"] for r in full if r["length"] == longest)
    needed = int(math.ceil(at * frames / longest))
    inside = needed < position_range
    return {"computed": True, "frames": frames, "largest_position_at": {longest: at}, "positions_needed": needed,
            "position_range": position_range, "inside": inside,
            "note": (f"needs about {needed} positions (computed from {at:.0f} at {longest} frames); the model's "
                     f"range is {position_range}: " + ("inside" if inside else "past the model's position range"))}


def node_only(args, head_map_path: str, name: str) -> int:
    """--node-only: the node check alone, written into the JSON a full run left (its tables kept)."""
    path = args.out / f"{name}.json"
    if not path.is_file():
        print(f"--node-only needs a full run's {path} first", file=sys.stderr)
        return 2
    data = json.loads(path.read_text())
    node = checked_node(args, head_map_path)
    data["node"] = {**node, "machine": machine("cpu")}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in node.items() if k != "records"}))
    return 0 if "error" not in node else 1


def checked_node(args, head_map_path: str) -> dict:
    """node_check, or the reason it failed: the tables above are kept either way."""
    try:
        # a folder per model: two models checked side by side must not share bags
        work = ROOT / "bench" / "results" / f"accuracy-node-{pathlib.Path(args.model).name}"
        return node_check(args.model, args.node_policy, args.node_streams, 64, args.fraction, head_map_path, work,
                          args.instant_frames)
    except Exception as err:  # noqa: BLE001 - reported in the JSON, the session tables still written
        return {"error": f"{type(err).__name__}: {err}"}


if __name__ == "__main__":
    sys.exit(main())
