"""Performance at real widths: both model families, every policy, 64 / 256 / 512 frames of 640x480,
with the targets side by side, in one run (docs/performance.md#real-widths).

Models: random weights, built in memory from the real config classes at the real widths and heads,
with fewer layers:

- Qwen2.5-VL-3B: text hidden 2048, 16 / 2 heads, head_dim 128, M-RoPE [16, 24, 24], MLP 11008,
  vocabulary 151 936, 4 of 36 layers; the vision tower at its real widths (1280, window attention
  112, merger to 2048) with 8 of 32 blocks; the real preprocessor (a 640x480 frame pair is 17x23 =
  391 tokens).
- LLaVA-OneVision-0.5B: text hidden 896, 14 / 2 heads, head_dim 64, MLP 4864, vocabulary 151 647,
  10 of 24 layers; SigLIP at 384 px (1152 wide) with 4 of 26 layers (196 tokens a frame).

float32 on a CPU, bfloat16 on a GPU (SDPA; flash-attn where it imports). The tokenizer is the
bundled tiny model's (so the system prompt is 21 tokens, not the real 13-14).

Method. The frames are encoded once per family (``--encode-chunks`` chunks of the synthetic clip,
timed: the encoder's cost is the same for every policy and is reported once); every session then
replays those embeddings (each chunk with a little noise) through the real session: preprocessing
(memoised), prefill through the decoder, guidance, compression, re-index. The policies take turns a
chunk at a time, so the machine's load hits them alike. ``--fill model`` prefills every chunk
through the decoder (the default on a GPU); ``--fill synthetic`` (the default on a CPU, where one
chunk's prefill takes seconds) prefills through the decoder only the ``--measure-chunks`` chunks
before each length, and stores the chunks before them with the policies' own ``append`` of random
keys and values of the real shapes (bench/cache_cost.py's method): the same tokens, positions,
evictions and re-indexes, without the decoder's cost.

At each length, from the decoder-prefilled chunks: encode (the replay: ~0), prefill and compress ms
(and the CPU time of each: with ``--threads 1`` the work itself, whatever else the machine runs),
compress as % of prefill; extra memory (peak minus the level at its start: the process's RSS on a
CPU, the kernel's high-water mark reset at each start, with glibc told to return freed blocks at
once; torch's allocator on a GPU) of each phase of the chunk: the encode (here the chunk's
embeddings), the prefill (from the embeddings to the last block), the compression (guidance
included), and of the whole chunk from before the encode, against the chunk's KV bytes + 20% of
the cache; then the same question twice: TTFT and decode tokens/s (medians); the highest position
used against the range. ``full`` runs while it fits in memory and in the position range (LLaVA-OV's
32 768 positions hold 160 frames); beyond, its bytes come from the formula, labelled computed.

Prefill blocks (engine/ingest/prefill.py): ``--block-tokens`` runs every policy once per block size, each
its own session in the same lock step, and compares each size's prefill with one forward (0) of the
same policy at the same length when 0 is among them.

    python bench/real_shapes.py [--families qwen2_5_vl-3b llava_onevision-0.5b] [--lengths 64 256 512]
    python bench/real_shapes.py --block-tokens 0 64 128 256 512     # the block-size sweep
    python bench/real_shapes.py --quick     # toy widths and lengths: the smoke test
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import os
import pathlib
import sys
import time

# glibc keeps freed blocks below its (growing) mmap threshold in the heap, where RSS still counts
# them: fix the threshold, so that RSS follows what tensors hold (set before the process starts)
if __name__ == "__main__" and sys.platform.startswith("linux") and "MALLOC_MMAP_THRESHOLD_" not in os.environ \
        and not any("cuda" in a for a in sys.argv):
    os.environ.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    os.execv(sys.executable, [sys.executable, *sys.argv])

import common  # noqa: E402
import torch  # noqa: E402
from cache_cost import RandomTokens  # noqa: E402
from encoder_backends import QWEN_VISION, SIGLIP_VISION  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine import ChunkError, Session, SessionConfig  # noqa: E402
from streamcache_ros.engine.adapters import VisionEncoder, load_image_processor, resolve_dtype  # noqa: E402
from streamcache_ros.engine.adapters.llava_onevision import LlavaOnevisionAdapter  # noqa: E402
from streamcache_ros.engine.adapters.qwen2_5_vl import Qwen25VLAdapter  # noqa: E402
from streamcache_ros.engine.cache import make_policy  # noqa: E402
from streamcache_ros.engine.factory import build_policy, chunk_shape  # noqa: E402
from streamcache_ros.engine.adapters.models import BUNDLED_DIR  # noqa: E402

REPORTED = common.ROOT / "bench" / "reported"
FIGURES = common.ROOT / "bench" / "figures"
FRAME = (480, 640)
QUESTION = "What happened in the video? Describe the objects, their colours and how they moved."
POLICIES = ["full", "fifo", "uniform", "hermes", "h2svc"]
TARGETS = {"compress_pct": 5.0, "ttft_growth": 1.1, "decode_speedup": 1.5, "extra_cache_share": 0.2,
           "block_prefill": 1.15}


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    family: str
    text: dict  # text config at real widths, reduced depth
    vision: dict
    real_depth: dict  # what was cut: {"text layers": (used, real), ...}


FAMILIES = {
    "qwen2_5_vl-3b": Family(
        "qwen2_5_vl-3b", "qwen2_5_vl",
        dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=2, max_position_embeddings=128000,
             rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]}),
        # one full-attention block in every 8, as in the real tower (its blocks 7, 15, 23, 31)
        dict(QWEN_VISION, depth=8, fullatt_block_indexes=[7]),
        {"text layers": (4, 36), "vision blocks": (8, 32)}),
    "llava_onevision-0.5b": Family(
        "llava_onevision-0.5b", "llava_onevision",
        dict(model_type="qwen2", vocab_size=151647, hidden_size=896, intermediate_size=4864, num_hidden_layers=10,
             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0),
        dict(SIGLIP_VISION, num_hidden_layers=4),
        {"text layers": (10, 24), "vision layers": (4, 26)}),
}


def quick_family(spec: Family) -> Family:
    """Toy widths, the same structure (the smoke test): real preprocessors, tiny layers."""
    text = dict(spec.text, vocab_size=1024, intermediate_size=128, num_hidden_layers=2, num_key_value_heads=2)
    if spec.family == "qwen2_5_vl":
        text.update(hidden_size=128, num_attention_heads=4,
                    rope_parameters=dict(spec.text["rope_parameters"], mrope_section=[4, 6, 6]))
        vision = dict(spec.vision, depth=2, hidden_size=64, intermediate_size=64, num_heads=2, out_hidden_size=128,
                      fullatt_block_indexes=[1])
    else:
        text.update(hidden_size=64, num_attention_heads=4)
        vision = dict(spec.vision, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=1)
    return dataclasses.replace(spec, name=spec.name + "-toy", text=text, vision=vision)


# -- the model --------------------------------------------------------------------------------------
def build_adapter(spec: Family, device: torch.device, dtype: torch.dtype, attention: str):
    """The family's model at ``spec``'s sizes with random weights, wrapped in its adapter."""
    from transformers import (AutoTokenizer, LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,  # noqa
                              Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration)

    tiny = BUNDLED_DIR / f"tiny-{spec.family}"
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    if spec.family == "qwen2_5_vl":
        config = Qwen2_5_VLConfig(text_config=spec.text, vision_config=spec.vision, tie_word_embeddings=True)
        model_cls, adapter_cls = Qwen2_5_VLForConditionalGeneration, Qwen25VLAdapter
        # the real preprocessor's pixel bounds: 640x480 -> 476x644 -> 17x23 merged tokens a pair of frames
        processor = load_image_processor(str(tiny), spec.family, size={"shortest_edge": 56 * 56,
                                                                        "longest_edge": 28 * 28 * 16384})
    else:
        config = LlavaOnevisionConfig(text_config=spec.text, vision_config=spec.vision, vision_feature_layer=-1,
                                      vision_feature_select_strategy="full", image_grid_pinpoints=[[384, 384]],
                                      tie_word_embeddings=True)
        model_cls, adapter_cls = LlavaOnevisionForConditionalGeneration, LlavaOnevisionAdapter
        processor = load_image_processor(str(tiny), spec.family, size={"height": 384, "width": 384})
    flash = attention in ("auto", "flash") and device.type == "cuda" and _flash_available()
    torch.manual_seed(0)
    model = model_cls._from_config(config, attn_implementation="flash_attention_2" if flash else "sdpa",
                                   dtype=dtype)
    model.to(device).eval()
    return lambda: adapter_cls(model, tokenizer, processor, spec.name, attention=attention, sample_fps=1.0)


def _flash_available() -> bool:
    from streamcache_ros.engine.cache.attention import flash_attn_func  # noqa: PLC0415

    return flash_attn_func() is not None


class Memo:
    """The adapter's preprocessing, once per chunk of frames (the stream cycles through a few)."""

    def __init__(self, preprocess):
        self.preprocess, self.done = preprocess, {}

    def __call__(self, frames):
        key = id(frames[0])
        if key not in self.done:
            self.done[key] = self.preprocess(frames)
        return self.done[key]


class Replay(VisionEncoder):
    """The embeddings encoded once, chunk after chunk in turn, each time with a little noise (so that
    no two chunks are equal); the same sequence for every session."""

    name = "replay"

    def __init__(self, chunks: list[torch.Tensor], seed: int = 0):
        self.chunks, self.calls = chunks, 0
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, tensors):
        base = self.chunks[self.calls % len(self.chunks)]
        self.calls += 1
        # in place: the chunk's embeddings and nothing more (the chunk's memory is measured)
        noise = torch.randn(base.shape, generator=self.gen).to(base.device, base.dtype)
        return noise.mul_(0.05 * base.float().std().to(base.dtype)).add_(base)


@contextlib.contextmanager
def synthetic_prefill(adapter, tokens: RandomTokens):
    """The decoder replaced by the policy's own ``append`` of random keys and values of the real
    shapes (docs/performance.md: the chunks before a measured length)."""
    real = adapter.forward

    @torch.inference_mode()
    def forward(embeds, new, policy, key_filter=None, layer_hook=None):
        for layer in range(policy.geometry.num_layers):
            _, k, v = tokens.take(len(new))
            policy.append(layer, k, v, new)
        return embeds

    adapter.forward = forward
    try:
        yield
    finally:
        adapter.forward = real


# -- memory ---------------------------------------------------------------------------------------
class Memory:
    """Peak minus steady bytes around a piece of work: torch's allocator on a GPU, the process's
    resident set on a CPU (VmHWM, reset through /proc/self/clear_refs)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.source = "torch allocator" if device.type == "cuda" else "process RSS"

    def start(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return torch.cuda.memory_allocated(self.device)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return self._status("VmRSS")

    def peak(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        return self._status("VmHWM")

    @staticmethod
    def _status(key: str) -> int:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0


def watch_phases(adapter, policy, memory: Memory, record: dict) -> None:
    """Split a chunk into its phases, each with its own peak and CPU time: encode (the replay: the
    chunk's embeddings), prefill (every block through the decoder), compression (the guidance the
    policy asks for, then ``after_chunk``), by wrapping the calls that start each phase."""
    encode, after_chunk, guidance_request = adapter.encode, policy.after_chunk, policy.guidance_request
    forward = adapter.forward

    def counted(*args, **kwargs):  # the decoder's forwards during a prefill (its blocks)
        if "prefill_start" in record and "prefill_peak" not in record:
            record["prefill_forwards"] = record.get("prefill_forwards", 0) + 1
        return forward(*args, **kwargs)

    def encoded(inputs):
        out = encode(inputs)
        record["encode_peak"] = memory.peak()
        record["prefill_start"], record["prefill_cpu"] = memory.start(), time.process_time()
        return out

    def prefill_done():
        if "prefill_peak" not in record:  # the first of guidance_request and after_chunk
            record["prefill_peak"], record["prefill_cpu"] = memory.peak(), time.process_time() - record["prefill_cpu"]
            record["compress_start"], record["compress_cpu"] = memory.start(), time.process_time()

    def asked(history, context=None):
        prefill_done()
        return guidance_request(history, context)

    def compressed(context):
        prefill_done()
        out = after_chunk(context)
        record["compress_peak"], record["compress_cpu"] = memory.peak(), time.process_time() - record["compress_cpu"]
        return out

    adapter.encode, adapter.forward, policy.after_chunk, policy.guidance_request = encoded, counted, compressed, asked


# -- one policy's stream ---------------------------------------------------------------------------
def policy_stream(make_adapter, label: str, block: int, policy, encoded, chunks, lengths, stop_at: int, args, device):
    """Feed a session (prefill blocks of ``block`` tokens, 0: one forward) chunk by chunk; yields a
    record per chunk (with the answers at each length)."""
    adapter = make_adapter()
    adapter.preprocess = Memo(adapter.preprocess)
    adapter.vision_encoder = Replay(encoded, args.seed)
    session = Session(adapter, policy, SessionConfig(chunk_frames=args.chunk_frames, max_question_tokens=args.max_question,
                                                     max_new_tokens=args.new_tokens, prefill_block_tokens=block))
    geometry = policy.geometry
    per_token = 2 * geometry.head_dim * torch.finfo(geometry.dtype).bits // 8  # K and V of one head
    tokens = RandomTokens(geometry, adapter.preprocess(chunks[0]).tokens_per_unit * len(chunks[0]), False, args.seed)
    memory = Memory(device)
    record: dict = {}
    watch_phases(adapter, policy, memory, record)
    measured = {length // args.chunk_frames - i for length in lengths for i in range(args.measure_chunks)}
    copies = store_copies(policy)
    for index in range(1, max(lengths) // args.chunk_frames + 1):
        frames = index * args.chunk_frames
        if frames > stop_at:
            return
        batch = chunks[(index - 1) % len(chunks)]
        model = args.fill == "model" or index in measured
        for j, frame in enumerate(batch[:-1]):
            session.add_frame(frame, stamp=float(frames - len(batch) + j))
        record.clear()
        held_before = policy.stats().kv_bytes
        steady = memory.start()
        started = time.perf_counter()
        try:
            with contextlib.nullcontext() if model else synthetic_prefill(adapter, tokens):
                report = session.add_frame(batch[-1], stamp=float(frames - 1))
        except ChunkError as err:
            if not err.position_range:
                raise
            yield {"policy": label, "block_tokens": block, "frames": frames, "stopped": str(err)}
            return
        wall_ms = (time.perf_counter() - started) * 1e3
        stats = policy.stats()
        chunk_kv = report.tokens * geometry.num_layers * geometry.num_kv_heads * per_token
        out = {"policy": label, "block_tokens": block, "frames": frames, "prefill": "model" if model else "synthetic",
               "wall_ms": wall_ms,
               "encode_ms": report.encode_ms, "prefill_ms": report.prefill_ms, "compress_ms": report.compress_ms,
               "kv_bytes": stats.kv_bytes, "kv_bytes_before": held_before, "chunk_kv_bytes": chunk_kv,
               "kv_tokens": stats.kv_tokens, "max_position": stats.max_position,
               "reindexed": report.outcome.reindexed, "store_copies": store_copies(policy) - copies}
        copies = store_copies(policy)
        if "compress_peak" in record:
            # the phases' own peaks (each from its start), and the whole chunk's from before the encode
            out["extra_encode_bytes"] = record["encode_peak"] - steady
            out["extra_prefill_bytes"] = record["prefill_peak"] - record["prefill_start"]
            out["extra_compress_bytes"] = record["compress_peak"] - record["compress_start"]
            out["extra_bytes"] = max(record["encode_peak"], record["prefill_peak"], record["compress_peak"]) - steady
            out["prefill_cpu_ms"], out["compress_cpu_ms"] = 1e3 * record["prefill_cpu"], 1e3 * record["compress_cpu"]
            out["prefill_forwards"] = record.get("prefill_forwards", 0)  # (0 where synthetic_prefill stood in)
        if frames in lengths:
            out["answers"] = [answer_record(session.ask(QUESTION, max_new_tokens=args.new_tokens))
                              for _ in range(args.asks)]
            out["frames_in_memory"] = session.status().frames_in_memory
        yield out


def answer_record(answer) -> dict:
    decode_ms = answer.total_ms - answer.ttft_ms
    steps = max(answer.answer_tokens - 1, 0)
    return {"ttft_ms": answer.ttft_ms, "total_ms": answer.total_ms, "tokens": answer.answer_tokens,
            "decode_tok_s": steps / decode_ms * 1e3 if steps and decode_ms > 0 else None}


def store_copies(policy) -> int:
    """Times the policy's KV stores have copied their tokens into a new buffer so far."""
    return sum(store.copied for layer in policy.layer_stores() for _, store in layer)


def lock_step(streams: dict) -> dict[str, list[dict]]:
    records = {name: [] for name in streams}
    active = dict(streams)
    started = time.perf_counter()
    while active:
        for name, stream in list(active.items()):
            record = next(stream, None)
            if record is None:
                del active[name]
                continue
            records[name].append(record)
            if "answers" in record or "stopped" in record:
                ttft = None if "stopped" in record else common.median(a["ttft_ms"] for a in record["answers"])
                what = "stopped (position range)" if "stopped" in record else \
                    f"prefill {record.get('prefill_ms', 0):.0f} ms, compress {record.get('compress_ms', 0):.0f} ms" + \
                    (f", ttft {ttft:.0f} ms" if ttft is not None else "")
                print(f"  {name}: {record['frames']} frames, {what}, {time.perf_counter() - started:.0f} s",
                      flush=True)
    return records


# -- one family ---------------------------------------------------------------------------------------
def variants(make_adapter, args, budget: int) -> dict[str, object]:
    """Each policy at the defaults a robot would use (budget 6000 tokens; H2SVC 4/16/64), checked by
    the factory against the model's position range: label -> a function making a new one."""
    adapter = make_adapter()
    out = {}
    for name in args.policies:
        params = {"chunk_frames": args.chunk_frames, "max_question_tokens": args.max_question,
                  "max_new_tokens": args.new_tokens, "budget_tokens": budget}
        if name == "h2svc":
            out["h2svc"] = lambda: make_policy("h2svc", head_map=random_head_map(adapter))
            continue
        out[name if name == "full" else f"{name}-{budget}"] = functools.partial(build_policy, adapter, name, params)
    return out


def stream_name(label: str, block: int, blocks: list[int]) -> str:
    """A policy's stream, named by its prefill block size when several are swept."""
    if len(blocks) == 1:
        return label
    return f"{label} blocks of {block}" if block else f"{label} one forward"


def random_head_map(adapter):
    """Random head scores split 10/40/50 by SAP's rule (the data are random: what STCE keeps means nothing)."""
    from streamcache_ros.engine.cache.sap import HeadMap  # noqa: PLC0415

    geometry = adapter.geometry()
    gen = torch.Generator().manual_seed(0)
    shape = (geometry.num_layers, geometry.num_kv_heads)
    return HeadMap.build(adapter.model_id, adapter.config_hash, torch.rand(shape, generator=gen, dtype=torch.float64),
                         torch.rand(shape, generator=gen, dtype=torch.float64), profile={"source": "random"})


def full_limit(make_adapter, args, lengths: list[int], device) -> tuple[int, str]:
    """The frames the full cache is run to: the position range (each chunk must leave room for the
    largest question, Session) and the memory at hand; returns (frames, why)."""
    adapter = make_adapter()
    geometry = adapter.geometry()
    frame = world.world_frame(0, *FRAME)
    shape = chunk_shape(adapter, args.chunk_frames, adapter.preprocess([frame] * adapter.frames_per_unit))
    config = SessionConfig(chunk_frames=args.chunk_frames, max_question_tokens=args.max_question,
                           max_new_tokens=args.new_tokens)
    room = geometry.max_position_embeddings - config.largest_question(geometry.max_position_embeddings)
    prefix, frames = len(adapter.prefix_ids), 0
    while prefix - 1 + (frames // args.chunk_frames + 1) * shape.chunk_positions < room and frames < max(lengths):
        frames += args.chunk_frames
    why = "position range" if frames < max(lengths) else ""
    per_frame = shape.chunk_tokens // args.chunk_frames * kv_bytes_per_token(geometry)
    # one full cache per prefill block size swept: together they stay within the share
    share = args.memory_fraction / len(args.block_tokens)
    fits = int(share * common.available_memory(device) // per_frame) // args.chunk_frames * args.chunk_frames
    if fits < frames:
        frames, why = fits, "memory"
    return frames, why


def kv_bytes_per_token(geometry) -> int:
    return geometry.num_layers * geometry.num_kv_heads * 2 * geometry.head_dim * torch.finfo(geometry.dtype).bits // 8


def run_family(spec: Family, args, device, dtype) -> dict:
    started = time.perf_counter()
    make_adapter = build_adapter(spec, device, dtype, args.attention)
    adapter = make_adapter()
    frames = [world.world_frame(i, *FRAME) for i in range(args.encode_chunks * args.chunk_frames)]
    chunks = [frames[i:i + args.chunk_frames] for i in range(0, len(frames), args.chunk_frames)]
    encoded, encode = encode_once(adapter, chunks, device)
    lengths = sorted(set(args.lengths))
    limit, why = full_limit(make_adapter, args, lengths, device)
    if why == "position range" and limit not in lengths:
        lengths = sorted({*lengths, limit})  # compare with full at the longest length it reaches
    geometry = adapter.geometry()
    tokens_per_frame = encode["tokens_per_chunk"] // args.chunk_frames
    print(f"# {spec.name}: {encode['tokens_per_chunk']} tokens a chunk of {args.chunk_frames} frames, encode "
          f"{encode['encode_ms']:.0f} ms a chunk; full to {limit} frames ({why or 'the whole stream'})", flush=True)
    policies = {(label, block): make() for label, make in variants(make_adapter, args, args.budget).items()
                for block in args.block_tokens}
    streams = {stream_name(label, block, args.block_tokens): policy_stream(
        make_adapter, label, block, policy, encoded, chunks, lengths, limit if label == "full" else max(lengths), args,
        device) for (label, block), policy in policies.items()}
    records = lock_step(streams)
    rows = summarize(spec, records, lengths, geometry, len(adapter.prefix_ids), tokens_per_frame, args, why)
    h2svc = next((policy for (label, _), policy in policies.items() if label == "h2svc"), None)
    h2svc_stores = sum(len(groups) for groups in h2svc.groups) if h2svc is not None else 0
    units_per_chunk = -(-args.chunk_frames // adapter.frames_per_unit)
    del streams, policies, adapter, make_adapter
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"shape": {"text": spec.text, "vision": spec.vision, "depth_used_of_real": spec.real_depth},
            "encode": encode, "full_limit_frames": limit, "full_limit_reason": why, "lengths": lengths,
            "max_position_embeddings": geometry.max_position_embeddings, "rows": rows, "per_chunk": records,
            "h2svc_stores": h2svc_stores, "units_per_chunk": units_per_chunk,
            "seconds": time.perf_counter() - started}


def encode_once(adapter, chunks, device) -> tuple[list[torch.Tensor], dict]:
    """Every chunk through the preprocessor and the vision tower, timed (after one warm-up)."""
    preprocess_ms, encode_ms, out = [], [], []
    adapter.encode(adapter.preprocess(chunks[0]))  # warm-up
    for chunk in chunks:
        with common.Stopwatch(device) as pre:
            inputs = adapter.preprocess(chunk)
        with common.Stopwatch(device) as enc:
            out.append(adapter.encode(inputs))
        preprocess_ms.append(pre.ms)
        encode_ms.append(enc.ms)
    return out, {"chunks": len(chunks), "tokens_per_chunk": int(out[0].shape[0]),
                 "preprocess_ms": common.median(preprocess_ms), "encode_ms": common.median(encode_ms)}


# -- summary ------------------------------------------------------------------------------------------
def summarize(spec: Family, records: dict, lengths: list[int], geometry, prefix: int, tokens_per_frame: int,
              args, why: str = "") -> list[dict]:
    rows = []
    for stream, chunks in records.items():
        stopped = next((r for r in chunks if "stopped" in r), None)
        for length in lengths:
            mine = [r for r in chunks if r["frames"] <= length and "stopped" not in r]
            at = next((r for r in mine if r["frames"] == length), None)
            row = {"family": spec.name, "stream": stream, "policy": chunks[0]["policy"],
                   "block_tokens": chunks[0]["block_tokens"], "frames": length}
            if at is None:  # past the full cache's range or memory: its bytes from the formula
                row.update(source="computed", kv_bytes=(prefix + length * tokens_per_frame) * kv_bytes_per_token(
                    geometry), note="not run: " + ("position range" if stopped else why or "memory"))
                rows.append(row)
                continue
            window = [r for r in mine if r["prefill"] == "model" and r["frames"] > length - args.measure_chunks *
                      args.chunk_frames]
            previous = max((x for x in lengths if x < length), default=0)
            # the chunks stored by the policy alone (synthetic prefill): the cache's own extra memory
            alone = [r.get("extra_bytes", 0) for r in mine if r["prefill"] == "synthetic" and r["frames"] > previous]
            prefill = common.median(r["prefill_ms"] for r in window)
            compress = common.median(r["compress_ms"] for r in window)
            extra = max((r.get("extra_bytes", 0) for r in window), default=0)
            cache = at["kv_bytes"]
            bound = at["chunk_kv_bytes"] + TARGETS["extra_cache_share"] * cache
            answers = at["answers"]
            prefill_cpu = common.median(r["prefill_cpu_ms"] for r in window)
            compress_cpu = common.median(r["compress_cpu_ms"] for r in window)
            row.update(source="measured", kv_bytes=cache, kv_tokens=at["kv_tokens"],
                       frames_in_memory=at["frames_in_memory"], encode_ms=common.median(r["encode_ms"] for r in window),
                       prefill_ms=prefill, compress_ms=compress, compress_pct=100 * compress / prefill,
                       prefill_cpu_ms=prefill_cpu, compress_cpu_ms=compress_cpu,
                       compress_cpu_pct=100 * compress_cpu / prefill_cpu,
                       extra_bytes=extra, extra_share=extra / cache, extra_bound_bytes=bound,
                       extra_encode_bytes=max(r.get("extra_encode_bytes", 0) for r in window),
                       extra_prefill_bytes=max(r.get("extra_prefill_bytes", 0) for r in window),
                       extra_compress_bytes=max(r.get("extra_compress_bytes", 0) for r in window),
                       extra_compress_share=max(r.get("extra_compress_bytes", 0) for r in window) / cache,
                       extra_cache_alone_bytes=max(alone) if alone else None,
                       prefill_forwards=max(r["prefill_forwards"] for r in window),
                       ttft_ms=common.median(a["ttft_ms"] for a in answers),
                       decode_tok_s=common.median(a["decode_tok_s"] for a in answers),
                       max_position=max(r["max_position"] for r in mine),
                       reindex_chunks=sum(r["reindexed"] for r in mine),
                       # the first chunk fills empty stores unit by unit: copies until its first reserve
                       store_copies_per_chunk=max((r["store_copies"] for r in window
                                                   if r["frames"] > args.chunk_frames), default=0))
            rows.append(row)
    # a block size against one forward (block 0) of the same policy at the same length, when swept
    whole = {(r["policy"], r["frames"]): r for r in rows if r["source"] == "measured" and r["block_tokens"] == 0}
    for row in rows:
        one = whole.get((row["policy"], row["frames"]))
        if row["source"] == "measured" and one is not None:
            row["prefill_vs_one_forward"] = row["prefill_ms"] / one["prefill_ms"]
            row["prefill_cpu_vs_one_forward"] = row["prefill_cpu_ms"] / one["prefill_cpu_ms"]
    return rows


def targets(result: dict) -> list[dict]:
    """The targets per family and stream (a policy at a prefill block size): figure, bound, met."""
    out = []
    for family, data in result.items():
        rows = data["rows"]
        measured = [r for r in rows if r["source"] == "measured"]
        for stream in dict.fromkeys(r["stream"] for r in rows):
            mine = {r["frames"]: r for r in measured if r["stream"] == stream}
            if not mine:
                continue
            policy, block = next(iter(mine.values()))["policy"], next(iter(mine.values()))["block_tokens"]
            full = {r["frames"]: r for r in measured if r["policy"] == "full" and r["block_tokens"] == block}
            longest = max(full) if full else None
            first, last = min(mine), max(mine)
            worst = max(mine.values(), key=lambda r: r["compress_pct"])
            out.append(target(family, stream, "compress <= 5% of prefill", worst["compress_pct"], TARGETS["compress_pct"],
                              f"{worst['compress_pct']:.2f}% at {worst['frames']} frames (CPU time "
                              f"{worst['compress_cpu_pct']:.2f}%)"))
            for key, name in (("extra_prefill_bytes", "prefill"), ("extra_bytes", "whole chunk")):
                over = max(mine.values(), key=lambda r: r[key] - r["extra_bound_bytes"])
                out.append(target(family, stream, f"extra memory ({name}) <= chunk KV + 20% of cache", over[key],
                                  over["extra_bound_bytes"], f"{common.human_bytes(over[key])} vs "
                                  f"{common.human_bytes(over['extra_bound_bytes'])} at {over['frames']} frames"))
            if block and all("prefill_vs_one_forward" in r for r in mine.values()):
                slowest = max(mine.values(), key=lambda r: r["prefill_vs_one_forward"])
                out.append(target(family, stream, f"prefill in blocks <= {TARGETS['block_prefill']}x one forward",
                                  slowest["prefill_vs_one_forward"], TARGETS["block_prefill"],
                                  f"{slowest['prefill_vs_one_forward']:.2f}x at {slowest['frames']} frames (CPU time "
                                  f"{slowest['prefill_cpu_vs_one_forward']:.2f}x)"))
            if policy == "full" or mine[first]["ttft_ms"] is None:  # (no questions asked: --asks 0)
                continue
            growth = mine[last]["ttft_ms"] / mine[first]["ttft_ms"]
            out.append(target(family, stream, f"TTFT at {last} <= 1.1x at {first}", growth, TARGETS["ttft_growth"],
                              f"{mine[last]['ttft_ms']:.0f} / {mine[first]['ttft_ms']:.0f} ms = {growth:.2f}x"))
            at = last if last in full else longest
            if at is not None and at in mine and full[at]["decode_tok_s"] and mine[at]["decode_tok_s"]:
                speedup = mine[at]["decode_tok_s"] / full[at]["decode_tok_s"]
                out.append(target(family, stream, "decode >= 1.5x full", TARGETS["decode_speedup"], speedup,
                                  f"{mine[at]['decode_tok_s']:.2f} / {full[at]['decode_tok_s']:.2f} tok/s = "
                                  f"{speedup:.2f}x at {at} frames"))
            if policy.startswith("h2svc"):  # at most one copy a store a chunk (its reserve), none a unit
                copies = max(r["store_copies_per_chunk"] for r in mine.values())
                stores = data["h2svc_stores"]
                out.append(target(family, stream, "H2SVC store: no copy per unit", copies, stores,
                                  f"at most {copies:.0f} store copies a chunk after the first ({stores} stores x "
                                  f"{data['units_per_chunk']} units a chunk appended)"))
    return out


def target(family, policy, name, value, bound, text) -> dict:
    return {"family": family, "policy": policy, "target": name, "figure": text, "met": bool(value <= bound)}


def report(result: dict, device_label: str) -> str:
    lines = []
    columns = [("stream", "policy"), ("frames", "frames"), ("source", "source"), ("kv", "KV held"),
               ("prefill_ms", f"prefill ms ({device_label})"), ("compress_ms", "compress ms"),
               ("compress_pct", "compress % prefill"), ("extra", "extra memory in chunk (share of cache)"),
               ("ttft_ms", "TTFT ms"), ("decode_tok_s", "decode tok/s"), ("position", "max position / range")]
    blocks = [("stream", "policy"), ("block", "prefill block (tokens)"), ("frames", "frames"),
              ("prefill_extra", "extra memory: prefill"), ("compress_extra", "compression"),
              ("chunk_extra", "whole chunk (with its embeddings)"), ("bound", "chunk KV + 20% of cache"),
              ("vs_one", "prefill / one forward (CPU time)")]
    for family, data in result.items():
        for row in data["rows"]:
            row["kv"] = common.human_bytes(row["kv_bytes"]) + (" (computed)" if row["source"] == "computed" else "")
            row["block"] = row["block_tokens"] or "one forward"
            if row["source"] == "measured":
                row["extra"] = f"{common.human_bytes(row['extra_bytes'])} ({row['extra_share']:.0%})"
                row["position"] = f"{row['max_position']:.0f} / {data['max_position_embeddings']}"
                row["prefill_extra"] = common.human_bytes(row["extra_prefill_bytes"])
                row["compress_extra"] = common.human_bytes(row["extra_compress_bytes"])
                row["chunk_extra"] = common.human_bytes(row["extra_bytes"])
                row["bound"] = common.human_bytes(row["extra_bound_bytes"])
                if "prefill_vs_one_forward" in row:
                    row["vs_one"] = f"{row['prefill_vs_one_forward']:.2f} ({row['prefill_cpu_vs_one_forward']:.2f})"
        encode = data["encode"]
        lines += [f"\n{family}: encode {encode['encode_ms']:.0f} ms + preprocess {encode['preprocess_ms']:.0f} ms a chunk "
                  f"of {encode['tokens_per_chunk']} tokens (once, every policy alike)",
                  common.table(data["rows"], columns),
                  f"\n{family}: memory and prefill time per prefill block size",
                  common.table([r for r in data["rows"] if r["source"] == "measured"], blocks)]
    return "\n".join(lines)


def plot(result: dict, path: pathlib.Path, device_label: str) -> bool:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    metrics = [("ttft_ms", f"TTFT (ms, {device_label})"), ("decode_tok_s", "decode tokens/s"),
               ("compress_pct", "compression, % of the chunk's prefill")]
    fig, axes = plt.subplots(len(result), len(metrics), figsize=(5.5 * len(metrics), 4 * len(result)), squeeze=False)
    for row_axes, (family, data) in zip(axes, result.items()):
        for ax, (key, label) in zip(row_axes, metrics):
            for index, policy in enumerate(dict.fromkeys(r.get("stream", r["policy"]) for r in data["rows"])):
                mine = [r for r in data["rows"] if r.get("stream", r["policy"]) == policy and r["source"] == "measured"
                        and r.get(key) is not None]
                if key == "compress_pct" and policy.startswith("full") or not mine:
                    continue
                ax.plot([r["frames"] for r in mine], [r[key] for r in mine], marker="o", label=policy,
                        color=f"C{index}")  # a policy's colour the same in every panel
            if key == "compress_pct":
                ax.axhline(TARGETS["compress_pct"], color="grey", linestyle=":", label="target 5%")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("frames in the stream (640x480)")
            ax.set_ylabel(label)
            ax.set_title(family)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(parser)
    parser.set_defaults(out=REPORTED)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--policies", nargs="+", default=POLICIES, choices=POLICIES)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 512], help="frames (640x480)")
    parser.add_argument("--chunk-frames", type=int, default=8)
    parser.add_argument("--block-tokens", type=int, nargs="+", default=[SessionConfig().prefill_block_tokens],
                        help="prefill block sizes (SessionConfig.prefill_block_tokens; 0: one forward a chunk): "
                             "each policy runs once per size, and the sizes are compared with 0 when it is among them")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); with 1, the "
                                                               "CPU times in the JSON are the work itself")
    parser.add_argument("--budget", type=int, default=6000, help="budget_tokens of fifo, uniform and hermes")
    parser.add_argument("--fill", choices=["model", "synthetic"], default=None,
                        help="prefill every chunk through the decoder, or only the measured ones (default: model "
                             "on a GPU, synthetic on a CPU)")
    parser.add_argument("--measure-chunks", type=int, default=2, help="decoder-prefilled chunks before each length")
    parser.add_argument("--encode-chunks", type=int, default=2, help="chunks of frames encoded (then replayed)")
    parser.add_argument("--new-tokens", type=int, default=16, help="answer tokens (decode rate)")
    parser.add_argument("--max-question", type=int, default=512, help="max_question_tokens")
    parser.add_argument("--asks", type=int, default=2, help="questions at each length (medians; 0: none, and no "
                                                             "TTFT or decode figures)")
    parser.add_argument("--dtype", default="auto", help="auto: float32 on a CPU, bfloat16 on a GPU")
    parser.add_argument("--attention", default="auto", help="auto: flash-attn on CUDA when it imports, else SDPA")
    parser.add_argument("--memory-fraction", type=float, default=0.3, help="run full while it fits in this share "
                                                                           "of the free memory (its caches of every "
                                                                           "block size together)")
    parser.add_argument("--name", default=None, help="base name of the JSON / PNG (default real_shapes-cpu|gpu)")
    parser.add_argument("--figure", type=pathlib.Path, default=None, help="the PNG (default bench/figures/NAME.png)")
    parser.add_argument("--shared", default="", help="say in the JSON how the machine was shared")
    parser.add_argument("--quick", action="store_true", help="toy widths, 16 and 32 frames: the smoke test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replot", type=pathlib.Path, default=None, help="only redraw the plot from this JSON")
    args = parser.parse_args(argv)
    if args.replot:  # (a run cut short writes its JSON after each family, the plot only at the end)
        import json  # noqa: PLC0415

        data = json.loads(args.replot.read_text())
        figure = args.figure or (FIGURES / f"{args.replot.stem}.png")
        label = data["machine"]["device"] if data["machine"].get("cuda") else "CPU"
        print(f"wrote {figure}" if plot(data["families"], figure, label) else "matplotlib is not installed: no plot")
        return
    device = torch.device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.block_tokens = list(dict.fromkeys(args.block_tokens))
    args.fill = args.fill or ("model" if device.type == "cuda" else "synthetic")
    if args.quick:
        args.lengths, args.encode_chunks, args.new_tokens, args.asks = [16, 32], 1, 4, 1
    kind = "gpu" if device.type == "cuda" else "cpu"
    name = args.name or f"real_shapes-{kind}" + ("-quick" if args.quick else "")
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    started, load_start = time.perf_counter(), os.getloadavg()
    result = {}
    for family in args.families:
        spec = quick_family(FAMILIES[family]) if args.quick else FAMILIES[family]
        result[spec.name] = run_family(spec, args, device, dtype)
        goals = targets(result)
        # written after each family: a run cut short keeps the families it finished
        payload = {"args": {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items()},
                   "dtype": str(dtype).replace("torch.", ""), "memory_source": Memory(device).source,
                   "shared_machine": args.shared, "load_average": {"start": load_start, "end": os.getloadavg()},
                   # how the thread pools were told to wait (a busy CPU makes spinning threads wait for cores)
                   "environment": {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                                                           "GOMP_SPINCOUNT", "MKL_NUM_THREADS")},
                   "families": result, "targets": goals, "complete": len(result) == len(args.families),
                   "seconds": time.perf_counter() - started}
        path = common.write_json(name, payload, args.out, args.device)
    print(report(result, label))
    print("\nTargets:\n" + common.table(goals, [("family", "family"), ("policy", "policy"), ("target", "target"),
                                              ("figure", "figure"), ("met", "met")]))
    print(f"\nwrote {path}")
    figure = args.figure or (FIGURES / f"{name}.png")
    figure.parent.mkdir(parents=True, exist_ok=True)
    print(f"wrote {figure}" if plot(result, figure, label) else "matplotlib is not installed: no plot")


if __name__ == "__main__":
    main()
