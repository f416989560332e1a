"""Cache cost at real shapes: KV bytes held and compression time per chunk, every policy side by side,
as the stream grows from 16 to 2048 frames.

Each policy is fed random K/V of a 7B model's shapes (28 layers, 4 KV heads, head_dim 128) the way the
session feeds it: per chunk of 16 frames, ``append`` for every layer (one unit at a time for H2SVC,
with ``after_prefill`` after each), then ``after_chunk``; the policies take turns, a chunk each (lock step),
so a change in the machine's load hits them alike. The attention of the chunk's queries is left
out by default (``--attention`` runs it too: a GPU job), so what is timed is the cache's own work:

* append ms: rotating and storing the chunk's keys/values (the copies the storage makes);
* compress ms: everything the policy does to get back to budget: ``ensure_room``, H2SVC's
  ``after_prefill`` (frame vectors, STCE insert/evict) and ``after_chunk`` (HERMES: guidance
  projections and attention, scores, selection, summary, re-index; H2SVC: removal of the evicted).

Beside them, once a shape: a chunk's prefill through the decoder (``decoder_prefill.py``: one real
decoder layer of the shape's widths, random weights, over a bounded cache, times the layers), so each
compression is also read as a share of it (``--no-prefill`` skips it).

Bytes are ``stats().kv_bytes`` after the chunk is compressed ("held") and before ("peak"), checked
against the exact formula. Where the full cache would not fit in memory it is not run past that
length; its bytes there come from the formula and are labelled ``computed``.

The data are random, so what HERMES and STCE select means nothing; the work they do is the real
work at the real sizes. HERMES's guidance q/k come from random embeddings of the real prompt lengths
(docs/hermes.md §12: 20 / 22 / 43 tokens) through a random projection of the real size; H2SVC's head map
is random scores split 10/40/50 by SAP's rule (sap.py).

    python bench/cache_cost.py [--models llava_onevision-7b qwen2_5_vl-7b] [--max-frames 2048]
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import pathlib
import tempfile
import time

import common
import decoder_prefill
import torch

from streamcache_ros.engine.adapters import ADAPTERS
from streamcache_ros.engine.cache import PREFIX_UNIT, CacheGeometry, ChunkContext, NewTokens, make_policy
from streamcache_ros.engine.cache.attention import resolve_backend
from streamcache_ros.engine.cache.hermes_rules import guidance_prompts
from streamcache_ros.engine.cache.positions import PositionRangeError
from streamcache_ros.engine.cache.rope import RotarySpec
from streamcache_ros.engine.cache.sap import HeadMap, split_counts
from streamcache_ros.engine.ingest.guidance import GuidanceProvider

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclasses.dataclass(frozen=True)
class Shape:
    """The facts of one model that decide its cache's size and its policies' work."""

    name: str
    family: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    mrope_section: tuple[int, ...] | None
    max_position_embeddings: int
    unit_grid: tuple[int, int]  # merged tokens (rows, cols) of one stream unit
    frames_per_unit: int
    prefix_tokens: int  # the system prompt (docs/hermes.md §1)
    dtype: str
    t_stride: float = 1.0  # M-RoPE: t advance per unit
    rope_theta: float = 1e6
    intermediate: int = 18944  # the decoder's MLP width (both 7B decoders): the prefill's measure

    @property
    def unit_tokens(self) -> int:
        return self.unit_grid[0] * self.unit_grid[1]


SHAPES = {
    # docs/hermes.md §1: SigLIP 27x27 pooled to 14x14 = 196 tokens per frame; 1D RoPE; the reference runs fp16
    "llava_onevision-7b": Shape("llava_onevision-7b", "llava_onevision", 28, 28, 4, 128, 3584, None, 32768,
                                (14, 14), 1, 13, "float16"),
    # a 448x448 frame: 32x32 patches of 14 px, merged 2x2 -> 16x16 = 256 tokens per temporal patch of 2 frames;
    # M-RoPE (16, 24, 24); t advances 2 frames / 1 fps · 2 tokens_per_second = 4 per unit; the checkpoint is bf16
    "qwen2_5_vl-7b": Shape("qwen2_5_vl-7b", "qwen2_5_vl", 28, 28, 4, 128, 3584, (16, 24, 24), 128000,
                           (16, 16), 2, 14, "bfloat16", t_stride=4.0),
}
# docs/hermes.md §12: the guidance prompts' lengths with the real tokenizer (no history)
GUIDANCE_TOKENS = {"local": 20, "global": 22, "mixed": 43}


def shrink(shape: Shape, layers: int, head_dim: int, grid: int) -> Shape:
    """The same model family at toy sizes (smoke tests)."""
    section = None if shape.mrope_section is None else (head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16)
    return dataclasses.replace(shape, layers=layers, head_dim=head_dim, hidden=4 * head_dim, mrope_section=section,
                               unit_grid=(grid, grid), intermediate=8 * head_dim)


def geometry(shape: Shape, device: torch.device) -> CacheGeometry:
    dim = shape.head_dim
    inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    return CacheGeometry(num_layers=shape.layers, num_q_heads=shape.q_heads, num_kv_heads=shape.kv_heads,
                         head_dim=dim, dtype=DTYPES[shape.dtype], device=device,
                         rotary=RotarySpec(inv_freq, shape.mrope_section),
                         max_position_embeddings=shape.max_position_embeddings,
                         traits=ADAPTERS[shape.family].traits, attention_backend=resolve_backend("auto", device))


class RandomGuidance(GuidanceProvider):
    """The session's GuidanceProvider at real shapes without a model (``token_ids``, ``embedding_qk``):
    the real prompt lengths, and q/k projected from random embeddings through a random matrix of the
    real size (so the projection's cost is there; one matrix serves every layer)."""

    def __init__(self, shape: Shape, device: torch.device, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.shape, self.device, self.dtype = shape, device, DTYPES[shape.dtype]
        # CPU matrix products in fp16 take a slow path (~100x fp32): project in fp32 there
        self.compute_dtype = self.dtype if device.type == "cuda" else torch.float32
        width = (shape.q_heads + shape.kv_heads) * shape.head_dim
        self.weight = (torch.randn(shape.hidden, width, generator=gen) / math.sqrt(shape.hidden)).to(
            device, self.compute_dtype)
        self.lengths = {text: GUIDANCE_TOKENS[kind] for kind, text in guidance_prompts([]).items()}
        self.gen = gen
        self._embedded = {}  # the session's reuse of a prompt's q/k from chunk to chunk (GuidanceProvider)

    def token_ids(self, text: str) -> list[int]:
        count = self.lengths.get(text) or max(1, round(1.3 * len(text.split())))  # ~1.3 BPE tokens a word
        return list(range(count))

    def _weights(self, layer: int) -> tuple:
        return ()

    def embedding_qk(self, ids: list[int], layers: list[int] | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.shape
        embeds = torch.randn(1, len(ids), s.hidden, generator=self.gen).to(self.device, self.compute_dtype)
        out = []
        for _ in range(s.layers) if layers is None else layers:
            normed = embeds * torch.rsqrt(embeds.pow(2).mean(-1, keepdim=True) + 1e-6)  # RMSNorm
            qk = (normed @ self.weight).to(self.dtype).view(1, len(ids), -1, s.head_dim).transpose(1, 2)
            out.append((qk[:, :s.q_heads], qk[:, s.q_heads:]))
        return out


def random_head_map(shape: Shape, folder: pathlib.Path, seed: int = 0) -> str:
    """A head map of random TADs for the synthetic model, split 10/40/50 by SAP's rule."""
    gen = torch.Generator().manual_seed(seed)
    v2v = torch.rand(shape.layers, shape.kv_heads, generator=gen, dtype=torch.float64)
    t2v = torch.rand(shape.layers, shape.kv_heads, generator=gen, dtype=torch.float64)
    path = folder / f"head_map_{shape.name}.json"
    digest = hashlib.sha256(repr(shape).encode()).hexdigest()[:16]
    HeadMap.build(f"synthetic-{shape.name}", digest, v2v, t2v, profile={"source": "random (benchmark)"}).save(path)
    return str(path)


@dataclasses.dataclass(frozen=True)
class Variant:
    label: str
    policy: str
    params: dict


def variants(args, head_map: str) -> list[Variant]:
    out = []
    for kind in args.policies:
        if kind == "full":
            out.append(Variant("full", "full", {}))
        elif kind in ("fifo", "uniform"):  # the same budget: two baselines side by side
            out.append(Variant(f"{kind}-{budget_label(args.fifo_budget)}", kind, {"budget_tokens": args.fifo_budget}))
        elif kind == "hermes":
            out += [Variant(f"hermes-{budget_label(b)}", "hermes", {"budget_tokens": b}) for b in args.hermes_budgets]
        elif kind == "h2svc":
            w_s, w_w, n_e = args.h2svc
            out.append(Variant(f"h2svc-{w_s}/{w_w}/{n_e}", "h2svc",
                               {"w_s": w_s, "w_w": w_w, "n_e": n_e, "head_map": HeadMap.load(head_map)}))
        else:
            raise SystemExit(f"unknown policy '{kind}' (full fifo uniform hermes h2svc)")
    return out


def budget_label(tokens: int) -> str:
    return f"{tokens // 1000}k" if tokens % 1000 == 0 else str(tokens)


# -- the exact sizes ------------------------------------------------------------------------------
def expected_bytes(shape: Shape, variant: Variant, frames: int, chunk_frames: int,
                   bank_heads: tuple[int, int, int] | None = None) -> tuple[int, int]:
    """(held after compression, peak before it) at ``frames`` frames, from the policies' rules:
    full keeps everything; fifo/hermes keep the prefix + min(budget, video tokens) per layer (a deep
    HERMES layer: budget − 1 + its summary token); uniform the same with the budget in whole units; an
    H2SVC head keeps the prefix + min(window, units) units, and evicted units stay stored (hidden)
    until the chunk ends."""
    per_token = 2 * shape.head_dim * torch.finfo(DTYPES[shape.dtype]).bits // 8  # K and V, one head
    ut, p = shape.unit_tokens, shape.prefix_tokens
    units, chunk_units = frames // shape.frames_per_unit, chunk_frames // shape.frames_per_unit
    before = units - chunk_units
    heads = shape.layers * shape.kv_heads
    if variant.policy == "full":
        tokens = heads * (p + units * ut)
        return tokens * per_token, tokens * per_token
    if variant.policy in ("fifo", "hermes", "uniform"):
        budget = variant.params["budget_tokens"]
        if variant.policy == "uniform":  # whole units only
            budget = budget // ut * ut
        held = heads * (p + min(budget, units * ut))
        peak = heads * (p + min(budget, before * ut) + chunk_units * ut)
        return held * per_token, peak * per_token
    if variant.policy == "h2svc":
        windows = (variant.params["w_s"], variant.params["w_w"], variant.params["n_e"])
        counts = bank_heads or split_counts(heads)
        held = sum(n * (p + min(w, units) * ut) for n, w in zip(counts, windows))
        peak = sum(n * (p + (min(w, before) + chunk_units) * ut) for n, w in zip(counts, windows))
        return held * per_token, peak * per_token
    raise ValueError(variant.policy)


# -- the stream -------------------------------------------------------------------------------------
class RandomTokens:
    """A pool of random q/k/v; each forward takes a window of it (fresh enough, no per-chunk randn)."""

    def __init__(self, geo: CacheGeometry, tokens: int, with_queries: bool, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.size = 3 * tokens + 17

        def pool(heads):
            return torch.randn(1, heads, self.size, geo.head_dim, generator=gen).to(geo.device, geo.dtype)

        self.k, self.v = pool(geo.num_kv_heads), pool(geo.num_kv_heads)
        self.q = pool(geo.num_q_heads) if with_queries else None
        self.calls = 0

    def take(self, count: int):
        self.calls += 1
        start = (self.calls * 7919) % (self.size - count + 1)
        window = slice(start, start + count)
        q = None if self.q is None else self.q[:, :, window]
        return q, self.k[:, :, window], self.v[:, :, window]


def chunk_positions(shape: Shape, units: int, device) -> torch.Tensor:
    """[axes, N] positions of a chunk relative to its start, as the adapters make them."""
    rows, cols = shape.unit_grid
    if shape.mrope_section is None:
        return torch.arange(units * rows * cols, dtype=torch.float32, device=device)[None]
    t = torch.tensor([math.floor(u * shape.t_stride) for u in range(units)], dtype=torch.float32)
    t = t.view(units, 1, 1).expand(units, rows, cols)
    h = torch.arange(rows, dtype=torch.float32).view(1, rows, 1).expand(units, rows, cols)
    w = torch.arange(cols, dtype=torch.float32).view(1, 1, cols).expand(units, rows, cols)
    return torch.stack([t.reshape(-1), h.reshape(-1), w.reshape(-1)]).to(device)


def forward(policy, geo: CacheGeometry, tokens: RandomTokens, new: NewTokens, attention: bool) -> None:
    for layer in range(geo.num_layers):
        q, k, v = tokens.take(len(new))
        if attention:
            policy.attend(layer, q, k, v, new)
        else:
            policy.append(layer, k, v, new)


def stream(shape: Shape, variant: Variant, geo: CacheGeometry, provider: RandomGuidance, args,
           frames_limit: int):
    """Feed ``frames_limit`` frames to a fresh policy, a chunk per step; yields one record per chunk
    (run it under ``torch.inference_mode``)."""
    device = geo.device
    policy = make_policy(variant.policy, **variant.params)
    policy.setup(geo)
    axes = geo.rotary.axes
    chunk_units = args.chunk_frames // shape.frames_per_unit
    rel = chunk_positions(shape, chunk_units, device)
    tokens = RandomTokens(geo, rel.shape[1], args.attention, seed=args.seed)
    prefix = shape.prefix_tokens
    prefix_tokens = NewTokens(torch.arange(prefix, dtype=torch.float32, device=device).expand(axes, -1),
                              torch.full((prefix,), PREFIX_UNIT), torch.full((prefix,), -1))
    forward(policy, geo, tokens, prefix_tokens, args.attention)
    step = shape.unit_tokens if policy.prefill_unit_by_unit else rel.shape[1]
    for chunk in range(frames_limit // args.chunk_frames):
        units = torch.arange(chunk * chunk_units, (chunk + 1) * chunk_units).repeat_interleave(shape.unit_tokens)
        chunk_ids = torch.full((rel.shape[1],), chunk)
        store, compress = common.Stopwatch(device), common.Stopwatch(device)
        try:
            with compress:
                policy.ensure_room(int(rel.max().item()) + 1)
        except PositionRangeError as err:  # the full cache past the model's positions: computed from here
            print(f"  {variant.label} stops after {chunk * args.chunk_frames} frames: {err}", flush=True)
            return
        for start in range(0, rel.shape[1], step):
            part = slice(start, start + step)
            offset = rel[:, :start].max() + 1 if start else 0.0  # the session's rebasing of each step
            new = NewTokens(rel[:, part] - offset, units[part], chunk_ids[part])
            with store:
                forward(policy, geo, tokens, new, args.attention)
            with compress:
                policy.after_prefill(new)
        peak = policy.stats().kv_bytes
        with compress:  # as the session does: the guidance the policy asks for, then the compression
            request = policy.guidance_request([])
            guidance = provider.compute(request, policy) if request is not None else None
            outcome = policy.after_chunk(ChunkContext(chunk, guidance=guidance))
        held = policy.stats()
        yield {"frames": (chunk + 1) * args.chunk_frames, "append_ms": store.ms, "compress_ms": compress.ms,
               "peak_bytes": peak, "held_bytes": held.kv_bytes, "kv_tokens": held.kv_tokens,
               "reindexed": outcome.reindexed}


def lock_step(streams: dict, checkpoints=()) -> dict[str, list[dict]]:
    """Advance every policy's stream a chunk at a time, in turn, so that a change in the machine's
    load hits them alike; returns each one's records (and says when it passes a checkpoint)."""
    records = {name: [] for name in streams}
    active = dict(streams)
    started = time.perf_counter()
    while active:
        for name, chunks in list(active.items()):
            record = next(chunks, None)
            if record is None:
                del active[name]
            else:
                records[name].append(record)
        frames = max((r[-1]["frames"] for r in records.values() if r), default=0)
        if frames in checkpoints and active:
            print(f"  {frames} frames after {time.perf_counter() - started:.0f} s", flush=True)
    return records


def measure_prefill(shape: Shape, args, device: torch.device, chunk_tokens: int) -> dict:
    """A chunk's prefill through the decoder at this shape, over a bounded policy's cache (the FIFO
    budget and the system prompt): the measure a compression is a share of. On a CPU in bfloat16,
    the fastest dtype a CPU runs it in (float16 there is a slow path, 6x here); on a GPU the shape's."""
    dtype = DTYPES[shape.dtype] if device.type == "cuda" else torch.bfloat16
    held = args.fifo_budget + shape.prefix_tokens
    measured = decoder_prefill.chunk_prefill_ms(shape, chunk_tokens, held, shape.intermediate, dtype, device,
                                                seed=args.seed)
    print(f"# {shape.name}: a chunk's prefill ({chunk_tokens} tokens over {held}) {measured['prefill_ms']:.0f} ms "
          f"({measured['layers']} x {min(measured['layer_ms']):.0f} ms, {measured['dtype']})", flush=True)
    return measured


def summarize(shape: Shape, variant: Variant, records: list[dict], checkpoints: list[int], chunk_frames: int,
              bank_heads, prefill: dict | None = None) -> list[dict]:
    """One row per checkpoint: bytes at that chunk, times as medians over the chunks since the last one,
    the compression as a share of ``prefill`` (a chunk's, measured once for the shape) where given."""
    rows, previous = [], 0
    by_frames = {r["frames"]: r for r in records}
    for frames in checkpoints:
        held_f, peak_f = expected_bytes(shape, variant, frames, chunk_frames, bank_heads)
        row = {"model": shape.name, "policy": variant.label, "frames": frames,
               "held_bytes_formula": held_f, "peak_bytes_formula": peak_f}
        record = by_frames.get(frames)
        if record is None:
            row.update(held_bytes=held_f, peak_bytes=peak_f, source="computed")
        else:
            window = [r for r in records if previous < r["frames"] <= frames]
            row.update(held_bytes=record["held_bytes"], peak_bytes=record["peak_bytes"], source="measured",
                       kv_tokens=record["kv_tokens"], chunks_timed=len(window),
                       append_ms=common.median(r["append_ms"] for r in window),
                       compress_ms=common.median(r["compress_ms"] for r in window),
                       reindex_chunks=sum(r["reindexed"] for r in window),
                       formula_ok=record["held_bytes"] == held_f and record["peak_bytes"] == peak_f)
            if prefill and row["compress_ms"] is not None:
                row["compress_share_of_prefill"] = row["compress_ms"] / prefill["prefill_ms"]
        rows.append(row)
        previous = frames
    return rows


def full_frames_that_fit(shape: Shape, checkpoints: list[int], args, device) -> int:
    """The longest checkpoint whose full cache (at its peak, with one layer copied while it grows)
    fits in ``--memory-fraction`` of the memory available now."""
    room = args.memory_fraction * common.available_memory(device)
    full = Variant("full", "full", {})
    fitting = [f for f in checkpoints
               if expected_bytes(shape, full, f, args.chunk_frames)[1] * (1 + 1 / shape.layers) <= room]
    limit = max(fitting, default=0)
    return min(limit, args.full_max_frames) if args.full_max_frames else limit


def plot(rows: list[dict], per_chunk: dict[str, list[dict]], path: pathlib.Path, device_label: str) -> bool:
    """Top: KV bytes held against stream length (log-log; the full cache dashed where computed).
    Bottom: compression time of every chunk."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 8.5), squeeze=False)
    for column, model in enumerate(models):
        top, bottom = axes[0][column], axes[1][column]
        for policy in dict.fromkeys(r["policy"] for r in rows if r["model"] == model):
            mine = [r for r in rows if r["model"] == model and r["policy"] == policy]
            measured = [r for r in mine if r["source"] == "measured"]
            line, = top.plot([r["frames"] for r in measured], [r["held_bytes"] / 2 ** 30 for r in measured],
                             marker="o", label=policy)
            computed = [r for r in mine if r["source"] == "computed"]
            if computed:
                joined = measured[-1:] + computed
                top.plot([r["frames"] for r in joined], [r["held_bytes"] / 2 ** 30 for r in joined], linestyle="--",
                         marker="x", color=line.get_color(), label=f"{policy} (computed)")
            chunks = per_chunk.get(f"{model}/{policy}", [])
            if policy != "full" and chunks:  # full does not compress
                bottom.plot([c["frames"] for c in chunks], [c["compress_ms"] for c in chunks], linewidth=1,
                            color=line.get_color(), label=policy)
        top.set_xscale("log", base=2)
        top.set_yscale("log")
        top.set_xlabel("frames in the stream")
        top.set_ylabel("KV cache held after each chunk (GiB)")
        top.set_title(model)
        top.grid(True, which="both", alpha=0.3)
        top.legend(fontsize=8)
        bottom.set_xlabel("frames in the stream")
        bottom.set_ylabel(f"compression ms per chunk ({device_label})")
        bottom.set_yscale("log")
        bottom.grid(True, which="both", alpha=0.3)
        bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def report(rows: list[dict], device_label: str, attention: bool = False) -> str:
    for row in rows:
        row["held"] = common.human_bytes(row["held_bytes"]) + (" (computed)" if row["source"] == "computed" else "")
        row["peak"] = common.human_bytes(row["peak_bytes"])
        share = row.get("compress_share_of_prefill")
        row["share"] = "" if share is None else f"{100 * share:.2f}%"
    work = "prefill (store + attention)" if attention else "store"
    return common.table(rows, [("model", "model"), ("policy", "policy"), ("frames", "frames"), ("held", "KV held"),
                               ("peak", "KV peak (in chunk)"), ("append_ms", f"{work} ms/chunk ({device_label})"),
                               ("compress_ms", f"compress ms/chunk ({device_label})"),
                               ("share", "compress / a chunk's prefill"), ("formula_ok", "= formula")])


def replot(path: pathlib.Path) -> None:
    """Table and PNG again from a JSON this script wrote (e.g. one a GPU run brought back)."""
    import json  # noqa: PLC0415

    data = json.loads(path.read_text())
    label = "GPU" if data["machine"].get("cuda") else "CPU"
    print(report(data["rows"], label, bool(data["args"].get("attention"))))
    png = path.with_suffix(".png")
    drawn = plot(data["rows"], data["per_chunk"], png, label)
    print(f"wrote {png}" if drawn else "matplotlib is not installed: no plot")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(parser)
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--policies", nargs="+", default=["full", "fifo", "uniform", "hermes", "h2svc"])
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024, 2048],
                        help="stream lengths (frames) to report; the stream runs to the longest")
    parser.add_argument("--chunk-frames", type=int, default=16, help="frames per chunk (the reference: 16)")
    parser.add_argument("--hermes-budgets", type=int, nargs="+", default=[4000, 6000])
    parser.add_argument("--fifo-budget", type=int, default=6000, help="budget of fifo and uniform")
    parser.add_argument("--h2svc", type=int, nargs=3, default=[4, 16, 64], metavar=("W_S", "W_W", "N_E"))
    parser.add_argument("--dtype", choices=["model", *DTYPES], default="model",
                        help="model: fp16 (LLaVA-OV) / bf16 (Qwen2.5-VL), their checkpoints' dtypes")
    parser.add_argument("--attention", action="store_true",
                        help="also run each chunk's attention with random queries (prefill cost; for a GPU)")
    parser.add_argument("--memory-fraction", type=float, default=0.3,
                        help="run the full cache only while it fits in this part of the free memory")
    parser.add_argument("--full-max-frames", type=int, default=0, help="and no further than this (0: no limit)")
    parser.add_argument("--no-prefill", action="store_true",
                        help="skip the measure of a chunk's prefill through one real decoder layer of the shape")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (4 layers, head_dim 16, 3x3 units): smoke test")
    parser.add_argument("--name", default="cache_cost", help="base name of the JSON / PNG")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replot", type=pathlib.Path, metavar="JSON", help="only redo the table and plot of a result")
    args = parser.parse_args(argv)
    if args.replot:
        return replot(args.replot)
    if args.chunk_frames % 2:
        parser.error("--chunk-frames must be even (a Qwen2.5-VL unit is 2 frames)")
    checkpoints = sorted({c for c in args.checkpoints if c % args.chunk_frames == 0})
    if not checkpoints:
        parser.error("no checkpoint is a multiple of --chunk-frames")
    device = torch.device(args.device)
    started = time.perf_counter()
    rows, per_chunk, notes = [], {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            shape = SHAPES[name]
            if args.tiny:
                shape = shrink(shape, layers=4, head_dim=16, grid=3)
            if args.dtype != "model":
                shape = dataclasses.replace(shape, dtype=args.dtype)
            geo = geometry(shape, device)
            head_map = random_head_map(shape, pathlib.Path(scratch), args.seed)
            bank_heads = tuple(HeadMap.load(head_map).split)
            provider = RandomGuidance(shape, device, args.seed)
            full_limit = full_frames_that_fit(shape, checkpoints, args, device)
            notes[name] = {"shape": dataclasses.asdict(shape), "h2svc_bank_heads": bank_heads,
                           "full_measured_up_to_frames": full_limit, "chunk_tokens":
                           args.chunk_frames // shape.frames_per_unit * shape.unit_tokens}
            if not args.no_prefill:
                notes[name]["prefill"] = measure_prefill(shape, args, device, notes[name]["chunk_tokens"])
            chosen = variants(args, head_map)
            limits = {v.label: full_limit if v.policy == "full" else checkpoints[-1] for v in chosen}
            print(f"# {name}: " + ", ".join(f"{label} to {n} frames" for label, n in limits.items()), flush=True)
            with torch.inference_mode():
                records = lock_step({v.label: stream(shape, v, geo, provider, args, limits[v.label]) for v in chosen},
                                    checkpoints)
            for variant in chosen:
                per_chunk[f"{name}/{variant.label}"] = records[variant.label]
                rows += summarize(shape, variant, records[variant.label], checkpoints, args.chunk_frames, bank_heads,
                                  notes[name].get("prefill"))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    label = "GPU" if device.type == "cuda" else "CPU"
    print(report(rows, label, args.attention))
    out = pathlib.Path(args.out)
    payload = {"args": {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items()},
               "models": notes, "rows": rows, "per_chunk": per_chunk, "seconds": time.perf_counter() - started}
    path = common.write_json(args.name, payload, out, args.device)
    print(f"\nwrote {path}")
    png = out / f"{args.name}.png"
    if plot(rows, per_chunk, png, label):
        print(f"wrote {png}")
    else:
        print("matplotlib is not installed: no plot")


if __name__ == "__main__":
    main()
