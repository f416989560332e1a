"""Why each bounded policy wins or loses against ``uniform`` at equal bytes, with evidence
(docs/policy-diagnosis.md).

    python bench/policy_diagnosis.py --model world-qwen2_5_vl --length 128 --streams 20
    python bench/policy_diagnosis.py --model world-llava_onevision --length 512 --streams 6

Held-out world streams (the accuracy benchmark's seeds and questions, bench/accuracy.py) go through
one session per policy at the accuracy benchmark's equal bytes (1/8 of the full cache at 512
frames), and a full cache beside them. After the stream, every option question is asked of every
policy, and besides its answer the run records:

* **what it keeps**: per layer, per KV head (H2SVC: per bank) the share of the stream's frames it
  holds, and by age (the stream cut in quarters, oldest first);
* **which truth frames survive**: of the frames that show the answer (``evidence_frames``), the
  share held whole in every layer and the share held at all;
* **its choice on the full cache**: the full cache asked with its keys restricted to the frames the
  policy holds (any token of them, in any layer): the policy's choice of frames, with every token of
  them and the positions they had. Below the policy's own accuracy: the frames it chose are worse
  than what it makes of them; above it: what it loses is in how it keeps them (positions
  renumbered, a frame kept in some layers or heads only, the summary token);
* **oracle keeps**: the full cache restricted to exactly the truth frames (``oracle_exact``; a
  question whose truth is that something never appeared has no truth frames and is left out), and
  to the truth frames filled up to uniform's count of frames with frames spread evenly
  (``oracle_fill``): an upper bound for any policy that keeps whole frames at that budget;
* ``--variant name=policy:key=value,...``: more sessions beside them, the policy's knobs at equal
  bytes with these settings on top (values as JSON; for H2SVC ``bank_shares=[s,w,e]`` shares the
  bytes out in the proportions W_s : W_w : N_e, 4 : 16 : 64 by default), to try a change side by
  side;
* HERMES **without its summary token** (its own cache, the summary hidden from the question) and
  H2SVC **with a shuffled head map** (the same bank sizes, heads drawn at random): whether the
  summary and the profiled head map help.

Also over 8-frame windows of the full cache: the hard-negative false-yes rate (``seen`` about an
identity sharing its colour or its shape with one in view, answered no) and windowed ``seen``.
Output: bench/results/policy_diagnosis-<model>-<length>.json (``--out``) and the tables.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import accuracy  # noqa: E402
from common import RESULTS, table, write_json  # noqa: E402

from streamcache_ros import world  # noqa: E402

SHUFFLED = "h2svc_shuffled"
QUARTERS = 4


# -- restricted asks ---------------------------------------------------------------------------------
def score_on(session, question: world.Question, units: list[int]) -> int:
    """The option ``session`` picks when its attention sees only ``units`` (with the prefix and the
    question; no summary token): what the session's own ask does with a key filter."""
    from streamcache_ros.engine.memory.ledger import Selection  # noqa: PLC0415

    ids = session.adapter.question_ids(question.text, question.options)
    session.policy.ensure_room(len(ids) + session.config.mc_max_new_tokens)
    chosen = sorted(units)
    reply = session.answering.score(ids, list(question.options), Selection(chosen, chosen), None, None,
                                    time.perf_counter())
    return reply.option_index


# -- what a session holds ----------------------------------------------------------------------------
@dataclasses.dataclass
class Held:
    """A session's memory timeline by frame index: per frame, the share of its tokens each layer (and
    each H2SVC bank) holds; units held at all."""

    layer_kept: dict[int, list[float]]
    bank_kept: dict[int, list[float]]
    unit_of: dict[int, int]
    num_layers: int
    banks: list[str]

    @classmethod
    def of(cls, session, stream: world.WorldStream, n: int) -> "Held":
        timeline = session.memory_timeline()
        frame_of = {round(stream.stamp(i), 6): i for i in range(n)}
        layer_kept, bank_kept, unit_of = {}, {}, {}
        for f in timeline.frames:
            i = frame_of.get(round(f.stamp, 6))
            if i is None:
                continue
            layer_kept[i], bank_kept[i], unit_of[i] = f.layer_kept, f.bank_kept, f.unit
        return cls(layer_kept, bank_kept, unit_of, timeline.num_layers, list(timeline.bank_names))

    def any_units(self) -> list[int]:
        return sorted({self.unit_of[i] for i, kept in self.layer_kept.items() if max(kept) > 0})

    def whole(self, frame: int) -> bool:
        return frame in self.layer_kept and min(self.layer_kept[frame]) >= 0.999

    def touched(self, frame: int) -> bool:
        return frame in self.layer_kept and max(self.layer_kept[frame]) > 0

    def profile(self, n: int) -> dict:
        """Share of the stream's frames each layer / bank holds (mean share of their tokens), overall
        and per quarter of the stream, oldest first."""
        quarters = [range(q * n // QUARTERS, (q + 1) * n // QUARTERS) for q in range(QUARTERS)]

        def share(get, frames) -> float:
            frames = list(frames)
            return float(np.mean([get(i) for i in frames])) if frames else 0.0

        out = {"layers": [], "banks": []}
        for layer in range(self.num_layers):
            get = (lambda i, layer=layer: self.layer_kept[i][layer] if i in self.layer_kept else 0.0)
            out["layers"].append({"all": share(get, range(n)), "quarters": [share(get, q) for q in quarters]})
        for b, name in enumerate(self.banks):
            get = (lambda i, b=b: self.bank_kept[i][b] if i in self.bank_kept and b < len(self.bank_kept[i]) else 0.0)
            out["banks"].append({"bank": name, "all": share(get, range(n)), "quarters": [share(get, q) for q in quarters]})
        return out


def head_rows(session, n_units: int) -> list[dict]:
    """Per storage row (a layer's KV heads together; one KV head on H2SVC): the share of the units
    seen that it holds any token of, and the oldest it holds (as a share of the stream's units)."""
    counts = session.policy.unit_tokens()
    out = []
    for r in range(counts.counts.shape[0]):
        held = counts.units[counts.counts[r] > 0]
        out.append({"row": r, "layer": r // counts.rows_per_layer, "units_share": len(held) / max(n_units, 1),
                    "oldest_share": (float(held.min()) / max(n_units, 1)) if len(held) else None})
    return out


# -- the runs ----------------------------------------------------------------------------------------
def shuffled_head_map(path: str, seed: int, out: pathlib.Path) -> str:
    """A head map with the same scores dealt to the heads at random: the same bank sizes, heads drawn
    regardless of what the profile found."""
    from streamcache_ros.engine.cache.sap import HeadMap  # noqa: PLC0415

    head_map = HeadMap.load(path)
    scores = np.array(head_map.score)
    flat = np.random.default_rng(seed).permutation(scores.ravel())
    shuffled = dataclasses.replace(head_map, score=flat.reshape(scores.shape).tolist())
    out.parent.mkdir(parents=True, exist_ok=True)
    shuffled.save(out)
    return str(out)


@dataclasses.dataclass(frozen=True)
class Variant:
    """A session beside the policies: ``policy`` at equal bytes with ``settings`` on top."""

    name: str
    policy: str
    settings: dict

    @classmethod
    def parse(cls, text: str) -> "Variant":
        name, _, rest = text.partition("=")
        policy, _, pairs = rest.partition(":")
        settings = {}
        for pair in filter(None, pairs.split(";")):
            key, _, value = pair.partition("=")
            try:
                settings[key] = json.loads(value)
            except json.JSONDecodeError:
                settings[key] = value
        if not name or not policy:
            raise SystemExit(f"--variant takes name=policy:key=value;key=value, got '{text}'")
        return cls(name, policy, settings)

    def knobs(self, base: dict, target_tokens: float, g) -> dict:
        """The equal-bytes knobs with the settings on top; for H2SVC ``bank_shares`` [s, w, e] sets
        the proportions W_s : W_w : N_e (default 4 : 16 : 64) the bytes are shared out by."""
        settings = dict(self.settings)
        shares = settings.pop("bank_shares", None)
        instant = int(settings.pop("instant_frames", 0))
        if instant:  # the window's tokens come out of the same bytes (bench/accuracy.py's rule)
            base = accuracy.policy_knobs(self.policy, target_tokens, g, instant)
        if self.policy == "h2svc" and (shares is not None or "ratios" in settings):
            # other banks hold other bytes: the windows made again so the mean over heads is the same
            window = math.ceil(instant / g.frames_per_unit) * g.tokens_per_unit
            base = {**base, **h2svc_knobs(target_tokens - window, g, shares or (4, 16, 64), settings.get("ratios"))}
        return {**base, **settings}


def h2svc_knobs(target_tokens: float, g, shares, ratios=None) -> dict:
    """H2SVC's windows holding ``target_tokens`` per layer on average, in the proportions ``shares``
    (bench/accuracy.py's rule with other proportions), for the bank fractions of ``ratios``."""
    fractions = g.bank_fractions if ratios is None else bank_fractions(ratios)
    units = max(target_tokens - g.prefix, g.tokens_per_unit) / g.tokens_per_unit
    f_s, f_w, f_e = fractions
    a, b, c = shares
    scale = units / (a * f_s + b * f_w + c * f_e)
    w_s, w_w = max(1, round(a * scale)), max(1, round(b * scale))
    n_e = max(2, round((units - f_s * w_s - f_w * w_w) / f_e)) if f_e else 2
    return {"w_s": w_s, "w_w": w_w, "n_e": n_e}


BANK_FRACTIONS: dict[str, tuple[float, float, float]] = {}


def bank_fractions(ratios) -> tuple[float, float, float]:
    """The share of KV heads per bank for ``ratios`` on the model's head map (set in main)."""
    from streamcache_ros.engine.cache.sap import HeadMap  # noqa: PLC0415

    bank = HeadMap.load(BANK_FRACTIONS["path"]).bank_ids(tuple(ratios), "head")
    return tuple(float((bank == b).sum()) / bank.numel() for b in range(3))


def run_stream(adapter, seed: int, length: int, head_map_path: str, shuffled_path: str, per_kind: int,
               policies: tuple[str, ...], fraction: float, windows: int,
               variants: tuple[Variant, ...] = (), budget: int = 0) -> tuple[list[dict], dict]:
    """One stream through every session; ``budget``: video tokens per layer every bounded policy
    holds (0: ``fraction`` of the full cache at 512 frames)."""
    stream = world.make_stream(seed, length, question_points=[length])
    g = accuracy.geometry_for(adapter, stream.look, head_map_path)
    full_longest = g.prefix + math.ceil(max(accuracy.LENGTHS) / g.frames_per_unit) * g.tokens_per_unit
    target = g.prefix + budget if budget else fraction * full_longest
    knobs = {p: accuracy.policy_knobs(p, target, g) for p in policies if p != "full"}
    sessions = {"full": accuracy.make_session(adapter, "full", {})}
    for policy in policies:
        if policy != "full":
            sessions[policy] = accuracy.make_session(adapter, policy, knobs[policy], head_map_path)
    if "h2svc" in sessions and shuffled_path:
        sessions[SHUFFLED] = accuracy.make_session(adapter, "h2svc", knobs["h2svc"], shuffled_path)
    for v in variants:
        base = accuracy.policy_knobs(v.policy, target, g)
        knobs[v.name] = v.knobs(base, target, g)
        sessions[v.name] = accuracy.make_session(adapter, v.policy, knobs[v.name], head_map_path)
    for i in range(length):
        rgb = stream.frame(i)
        for session in sessions.values():
            session.add_frame(rgb, stamp=stream.stamp(i))
    for session in sessions.values():
        session.flush()
    held = {name: Held.of(s, stream, length) for name, s in sessions.items()}
    n_units = sessions["full"].ledger.next_unit
    keeps = {name: {**held[name].profile(length), "rows": head_rows(s, n_units)} for name, s in sessions.items()}
    uniform_count = len(held["uniform"].any_units()) if "uniform" in held else 0
    all_units = held["full"].any_units()
    rng = np.random.default_rng((seed, length, 3))  # the accuracy benchmark's questions
    questions = stream.questions(length, rng, world.OPTION_KINDS, per_kind)
    records = []
    for q in questions:
        truth_frames = sorted(set(q.evidence_frames))
        truth_units = sorted({held["full"].unit_of[f] for f in truth_frames if f in held["full"].unit_of})
        base = {"seed": seed, "length": length, "kind": q.kind, "question": q.text, "truth": q.answer_index,
                "truth_frames": truth_frames, "evidence_age": (length - 1 - max(truth_frames)) if truth_frames else None,
                "window_frames": accuracy.window_frames(target, g)}
        oracle = {}
        if truth_units:
            oracle["oracle_exact"] = score_on(sessions["full"], q, truth_units) == q.answer_index
        if uniform_count:
            fill = fill_units(truth_units, all_units, uniform_count)
            oracle["oracle_fill"] = score_on(sessions["full"], q, fill) == q.answer_index
        for name, session in sessions.items():
            h = held[name]
            answer = session.ask(q.text, q.options)
            row = {**base, "policy": name, "correct": answer.option_index == q.answer_index,
                   "kv_bytes": session.status().cache.kv_bytes, **oracle,
                   "truth_whole": mean_or_none([h.whole(f) for f in truth_frames]),
                   "truth_touched": mean_or_none([h.touched(f) for f in truth_frames])}
            if name != "full":
                row["choice_on_full"] = score_on(sessions["full"], q, h.any_units()) == q.answer_index
            if name == "hermes":
                row["without_summary"] = score_on(session, q, h.any_units()) == q.answer_index
            records.append(row)
    windowed = window_checks(sessions["full"], stream, length, windows, np.random.default_rng((seed, length, 7)))
    return records + windowed, {"seed": seed, "knobs": knobs, "keeps": keeps}


def fill_units(truth: list[int], every: list[int], count: int) -> list[int]:
    """The truth units (the newest when more than ``count``) and others spread evenly to ``count``."""
    from streamcache_ros.engine.cache.uniform import spread  # noqa: PLC0415

    chosen = truth[-count:]
    rest = [u for u in every if u not in set(chosen)]
    return sorted(chosen + spread(rest, count - len(chosen)))


def window_checks(full, stream: world.WorldStream, n: int, count: int, rng) -> list[dict]:
    """``count`` 8-frame windows of the full cache: a hard negative and a windowed seen in each."""
    out = []
    for _ in range(count):
        first = int(rng.integers(0, n - accuracy.WINDOW_FRAMES + 1))
        last = first + accuracy.WINDOW_FRAMES - 1
        asked = [("seen_hard", world.ask_seen_hard_negative(stream, n, first, last, rng)),
                 ("seen@8", world.ask_seen_in_window(stream, n, first, last, rng))]
        for kind, q in asked:
            if q is None:
                continue
            answer = full.ask(q.text, q.options, since=stream.stamp(first), until=stream.stamp(last))
            said = q.options[answer.option_index] if answer.option_index >= 0 else ""
            out.append({"seed": stream.seed, "length": n, "policy": "full", "kind": kind, "question": q.text,
                        "truth": q.answer_index, "correct": answer.option_index == q.answer_index,
                        "said_yes": said == "yes", "answer_yes": q.answer == "yes"})
    return out


def mean_or_none(values: list) -> float | None:
    return float(np.mean(values)) if values else None


# -- summary -----------------------------------------------------------------------------------------
COLUMNS = ("correct", "choice_on_full", "oracle_exact", "oracle_fill", "truth_whole", "truth_touched",
           "without_summary")


def summarise(records: list[dict]) -> dict:
    """Per policy, over every option question and over the long-memory ones: the mean of each
    column where it was measured, with n."""
    groups = defaultdict(list)
    for r in records:
        if r["kind"] in world.OPTION_KINDS:
            groups[(r["policy"], "all")].append(r)
            if accuracy.long_memory(r):
                groups[(r["policy"], "long_memory")].append(r)
            groups[(r["policy"], r["kind"])].append(r)
    out = {}
    for (policy, subset), rows in sorted(groups.items()):
        cell = {"n": len(rows), "kv_kib": float(np.mean([r["kv_bytes"] for r in rows])) / 1024}
        for column in COLUMNS:
            values = [float(r[column]) for r in rows if r.get(column) is not None]
            if values:
                cell[column] = {"mean": float(np.mean(values)), "n": len(values)}
        out[f"{policy}|{subset}"] = cell
    hard = [r for r in records if r["kind"] == "seen_hard"]
    windowed = [r for r in records if r["kind"] == "seen@8"]
    out["full|hard_negative_false_yes"] = {"n": len(hard), "rate": mean_or_none([r["said_yes"] for r in hard]),
                                           "ci95": list(accuracy.wilson(sum(r["said_yes"] for r in hard), len(hard)))}
    out["full|seen@8"] = {"n": len(windowed), "accuracy": mean_or_none([r["correct"] for r in windowed])}
    return out


def keep_summary(streams: list[dict]) -> dict:
    """Per session: each layer's / bank's share of the frames held, and by quarter of the stream,
    averaged over the streams; per storage row the share of units held and the oldest."""
    out = {}
    for name in streams[0]["keeps"]:
        keeps = [s["keeps"][name] for s in streams]
        layers = [{"all": float(np.mean([k["layers"][i]["all"] for k in keeps])),
                   "quarters": np.mean([k["layers"][i]["quarters"] for k in keeps], axis=0).round(3).tolist()}
                  for i in range(len(keeps[0]["layers"]))]
        banks = [{"bank": keeps[0]["banks"][i]["bank"], "all": float(np.mean([k["banks"][i]["all"] for k in keeps])),
                  "quarters": np.mean([k["banks"][i]["quarters"] for k in keeps], axis=0).round(3).tolist()}
                 for i in range(len(keeps[0]["banks"]))]
        rows = [{"row": i, "layer": keeps[0]["rows"][i]["layer"],
                 "units_share": float(np.mean([k["rows"][i]["units_share"] for k in keeps])),
                 "oldest_share": mean_or_none([k["rows"][i]["oldest_share"] for k in keeps
                                               if k["rows"][i]["oldest_share"] is not None])}
                for i in range(len(keeps[0]["rows"]))]
        out[name] = {"layers": layers, "banks": banks, "rows": rows}
    return out


def print_tables(summary: dict, keeps: dict, names: list[str], length: int) -> None:
    for subset in ("all", "long_memory"):
        rows = []
        for name in names:
            cell = summary.get(f"{name}|{subset}")
            if not cell:
                continue
            row = {"policy": name, "n": cell["n"], "kv_kib": f"{cell['kv_kib']:.0f}"}
            for column in COLUMNS:
                c = cell.get(column)
                row[column] = f"{c['mean']:.2f}" if c else ""
            rows.append(row)
        print(f"\n{length} frames, {subset} option questions")
        print(table(rows, [("policy", "policy"), ("n", "n"), ("kv_kib", "KV KiB"), ("correct", "own"), ("choice_on_full", "its frames on full"),
                           ("oracle_exact", "oracle exact"), ("oracle_fill", "oracle fill"),
                           ("truth_whole", "truth whole"), ("truth_touched", "truth held"),
                           ("without_summary", "no summary")]))
    hard = summary["full|hard_negative_false_yes"]
    if hard["n"]:
        print(f"\nfull cache, 8-frame windows: hard-negative false yes {hard['rate']:.2f} (n={hard['n']}, "
              f"95% {hard['ci95'][0]:.2f}-{hard['ci95'][1]:.2f}); windowed seen "
              f"{summary['full|seen@8']['accuracy']:.2f} (n={summary['full|seen@8']['n']})")
    for name in names:
        k = keeps.get(name)
        if not k:
            continue
        layers = "  ".join(f"L{i} {x['all']:.2f} {x['quarters']}" for i, x in enumerate(k["layers"]))
        print(f"\n{name}: frames held per layer (all, by quarter oldest first): {layers}")
        for b in k["banks"]:
            print(f"  bank {b['bank']}: {b['all']:.2f} {b['quarters']}")
        if len(k["rows"]) > len(k["layers"]):
            print("  heads: " + "  ".join(f"L{r['layer']}h{r['row']}: {r['units_share']:.2f}" for r in k["rows"]))


def main(argv=None) -> int:
    from streamcache_ros.engine.adapters.models import DEFAULT_MODEL, resolve_model_path  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--length", type=int, default=128, help="frames per stream (questions asked at the end)")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="offset of the first seed (128-frame streams: the accuracy benchmark's short seeds; "
                             "longer ones: its long seeds)")
    parser.add_argument("--per-kind", type=int, default=3)
    parser.add_argument("--windows", type=int, default=4, help="8-frame windows per stream (hard negatives)")
    parser.add_argument("--fraction", type=float, default=1 / 8,
                        help="bounded bytes / the full cache's at 512 frames (the accuracy benchmark's equal bytes)")
    parser.add_argument("--budget", type=int, default=0,
                        help="instead of --fraction: video tokens per layer (the node's budget_tokens) for every bounded policy")
    parser.add_argument("--policies", nargs="+", default=["full", "fifo", "uniform", "hermes", "h2svc"])
    parser.add_argument("--no-shuffled", action="store_true", help="no H2SVC with a shuffled head map")
    parser.add_argument("--variant", action="append", default=[], type=Variant.parse,
                        help="name=policy:key=value;key=value: another session at equal bytes with these settings")
    parser.add_argument("--name", default="")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    adapter = accuracy.load(args.model)
    folder = pathlib.Path(resolve_model_path(args.model))
    head_map_path = str(folder / "h2svc_head_map.json") if (folder / "h2svc_head_map.json").is_file() else ""
    policies = tuple(p for p in args.policies if p != "h2svc" or head_map_path)
    if "full" not in policies:
        policies = ("full", *policies)
    BANK_FRACTIONS["path"] = head_map_path
    shuffled = ""
    if head_map_path and "h2svc" in policies and not args.no_shuffled:
        shuffled = shuffled_head_map(head_map_path, 0, RESULTS / "policy_diagnosis" / f"{folder.name}-shuffled.json")
    first = accuracy.ACCURACY_SEED + (0 if args.length <= 128 else 5_000_000) + args.first_seed
    records, streams, started = [], [], time.perf_counter()
    for i in range(args.streams):
        rows, info = run_stream(adapter, first + i, args.length, head_map_path, shuffled, args.per_kind, policies,
                                args.fraction, args.windows, tuple(args.variant), args.budget)
        records += rows
        streams.append(info)
        print(f"  stream {i + 1}/{args.streams}: {time.perf_counter() - started:.0f} s", flush=True)
    names = [*policies, *([SHUFFLED] if shuffled else []), *(v.name for v in args.variant)]
    summary, keeps = summarise(records), keep_summary(streams)
    print_tables(summary, keeps, names, args.length)
    name = args.name or f"policy_diagnosis-{folder.name}-{args.length}"
    path = write_json(name, {"model": folder.name, "length": args.length, "fraction": args.fraction,
                             "budget_tokens": args.budget, "variants": [dataclasses.asdict(v) for v in args.variant],
                             "streams": args.streams, "seconds": round(time.perf_counter() - started),
                             "summary": summary, "keeps": keeps, "stream_knobs": [s["knobs"] for s in streams],
                             "records": records}, args.out)
    print(f"\n{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
