"""Train a bundled shape-world model from scratch: a small real Qwen2.5-VL or LLaVA-OneVision.

    python scripts/train_world_model.py --family qwen2_5_vl --minutes 60
    python scripts/train_world_model.py --family llava_onevision --minutes 60 --resume

The model is built from the real transformers config classes with a tokenizer that holds the
world's words, then trained on seeded world streams (streamcache_ros/world.py) laid out exactly as
the Session asks them (engine/layout.py, engine/training.py): chunks of 8 frames at 1 fps,
questions after any number of frames, several questions per stream, each seeing the stream as it
was when asked. The target is the right option's words, then the end-of-turn token.

A log line (loss, held-out accuracy) goes to <work>/train.log; a checkpoint to <work>/checkpoint.pt
every few minutes, from which --resume continues (same seed, same stream order). The finished model
is written with save_pretrained to --out. Deterministic for a given seed and thread count.

--minutes is CPU time: the run stops once the process has used minutes x --threads CPU-minutes
(60 minutes on 2 cores = 120 CPU-minutes), so other work on the machine does not shorten training.
Wall time is logged beside it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine.adapters import MODEL_SETTINGS_FILE, load_adapter  # noqa: E402
from streamcache_ros.engine.cache.hermes_rules import GLOBAL_PROMPT, LOCAL_PROMPT  # noqa: E402
from streamcache_ros.engine.layout import question_prompt  # noqa: E402
from streamcache_ros.engine.training import AskedQuestion, example_loss, lay_out_example  # noqa: E402

FAMILIES = ("qwen2_5_vl", "llava_onevision")
BUNDLED_NAMES = {"qwen2_5_vl": "world-qwen2_5_vl", "llava_onevision": "world-llava_onevision"}
VOCAB_SIZE = 640
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>", "<|video_pad|>"]
LLAVA_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]
CHUNK_FRAMES = 8  # the node's default chunk_frames, at its default sample_fps 1.0
HELD_OUT_SEED = 900_000_000  # validation streams; the accuracy benchmark's seeds lie elsewhere again
TRAIN_SEED = 100_000_000

# sizes: small enough to train on two CPU cores within an hour, wide enough to learn the world
TEXT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096)


# -- the tokenizer -----------------------------------------------------------------------------------
def world_corpus() -> list[str]:
    """Every text the world's prompts hold, so each word of the world becomes a token of its own."""
    rng = np.random.default_rng(0)
    texts = [LOCAL_PROMPT, GLOBAL_PROMPT, "You are a helpful assistant."]
    for seed in range(300):
        stream = world.make_stream(seed, 48, question_points=[24])
        for n in (24, 48):
            for q in stream.questions(n, rng):
                texts.append(question_prompt(q.text, q.options, "words") + (q.answer or "now"))
                texts.append(f"Context summary: Question: {q.text} Answer: {q.answer}.")
    texts += [" ".join(world.COLOUR_NAMES + world.SHAPES + ("yes", "no", "left", "right", "0", "1", "2"))] * 50
    return texts


def build_tokenizer(special: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - len(special), show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(world_corpus(), trainer=trainer)
    tok.add_special_tokens(special)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)


# -- the models --------------------------------------------------------------------------------------
def text_config(tokenizer) -> dict:
    ids = tokenizer.convert_tokens_to_ids
    return dict(TEXT, vocab_size=VOCAB_SIZE, bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                pad_token_id=ids("<|endoftext|>"), tie_word_embeddings=False)


def build_qwen(out: pathlib.Path, seed: int) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration  # noqa: PLC0415

    tokenizer = build_tokenizer(QWEN_SPECIAL)
    ids = tokenizer.convert_tokens_to_ids
    text = text_config(tokenizer)
    head_dim = TEXT["hidden_size"] // TEXT["num_attention_heads"]
    # M-RoPE: a quarter of the rotary pairs for time, the rest split between rows and columns
    t = head_dim // 8
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0,
                               "mrope_section": [t, (head_dim // 2 - t) // 2, (head_dim // 2 - t) // 2]}
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
                           out_hidden_size=TEXT["hidden_size"], patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, tokens_per_second=2, window_size=112, fullatt_block_indexes=[1]),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # frames become at most 84x84 pixels (56x84 for 4:3 and 16:9): 6-8 tokens per 2-frame unit
    _write_json(out / "preprocessor_config.json", {
        "image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True, "resample": 3,
        "size": {"shortest_edge": 56 * 56, "longest_edge": 84 * 84},
        "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2})


def build_llava(out: pathlib.Path, seed: int) -> None:
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration  # noqa: PLC0415

    tokenizer = build_tokenizer(LLAVA_SPECIAL)
    ids = tokenizer.convert_tokens_to_ids
    text = text_config(tokenizer)
    text.update(model_type="qwen2", rope_theta=1_000_000.0)
    # 84x84 frames in 21-pixel patches: 4x4 patches, pooled 2x2 to 4 tokens per frame
    config = LlavaOnevisionConfig(
        text_config=text,
        vision_config=dict(model_type="siglip_vision_model", image_size=84, patch_size=21, hidden_size=64,
                           intermediate_size=128, num_hidden_layers=2, num_attention_heads=2),
        image_token_index=ids("<image>"), video_token_index=ids("<video>"), vision_feature_layer=-1,
        vision_feature_select_strategy="full", image_grid_pinpoints=[[84, 84]], tie_word_embeddings=False)
    torch.manual_seed(seed)
    LlavaOnevisionForConditionalGeneration(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _write_json(out / "preprocessor_config.json", {
        "image_processor_type": "LlavaOnevisionImageProcessor", "do_resize": True,
        "size": {"height": 84, "width": 84}, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True, "do_pad": False, "image_grid_pinpoints": [[84, 84]]})


# 6 tokens per 2 frames on the Qwen model, 4 per frame on LLaVA: 300 and 400 tokens in the demo's stream
DEFAULT_BUDGET = {"qwen2_5_vl": 96, "llava_onevision": 128}


def build_model(family: str, out: pathlib.Path, seed: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (build_qwen if family == "qwen2_5_vl" else build_llava)(out, seed)
    # these models answer a multiple-choice question with the option's words (layout.options_query);
    # their default budget is about a third of the demo's 100-frame stream, so it binds there (docs/world-models.md)
    _write_json(out / MODEL_SETTINGS_FILE, {"options_prompt": "words", "budget_tokens": DEFAULT_BUDGET[family],
                                            "trained_on": "shape world (docs/world.md)"})


def _write_json(path: pathlib.Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


# -- the data ----------------------------------------------------------------------------------------
TRAINED_KINDS = world.OPTION_KINDS


def stream_length(rng: np.random.Generator, progress: float) -> int:
    """A curriculum: streams of 4-16 frames first, so the vision tower and the question's attention
    learn to read one frame (cheap, many steps); then the longest stream grows to 512 frames by 70%
    of the run, lengths drawn log-uniformly so short streams stay common."""
    grow = min(1.0, max(0.0, (progress - 0.15) / 0.55))
    longest = int(16 * (512 / 16) ** grow)
    return int(np.exp(rng.uniform(np.log(4), np.log(longest + 1))))


def sample_example(seed: int, progress: float, questions_per_stream: int = 12):
    """(frames, questions) of one seeded training stream."""
    rng = np.random.default_rng((seed, 7))
    length = stream_length(rng, progress)
    look = world.random_look(rng)
    if length > 48 and look.width * look.height > 320 * 240:
        # long streams at the cheaper sizes (rendering dominates); short ones cover the whole range
        look = world.Look(**{**look.__dict__, "width": 320, "height": 240 if rng.random() < 0.5 else 180})
    # a few points fixed in advance (so they are still), the rest wherever the stream happens to be still
    fixed = sorted(set(int(x) for x in rng.integers(4, length + 1, size=2)))
    stream = world.make_stream(seed, length, question_points=fixed, look=look,
                               one_object_first=float(rng.uniform(0.5, 0.9)))
    points = stream.question_points()
    chosen = sorted(set(fixed) | set(int(p) for p in rng.choice(points, size=min(4, len(points)), replace=False)))
    pool = [q for n in chosen for q in stream.questions(n, rng, TRAINED_KINDS)]
    # long-memory and rarer kinds are worth more than another now_count
    weights = np.asarray([0.5 if q.kind in ("now_count",) else 1.0 for q in pool])
    take = rng.choice(len(pool), size=min(questions_per_stream, len(pool)), replace=False, p=weights / weights.sum())
    asked = [pool[i] for i in sorted(take)]
    frames = [stream.frame(i) for i in range(length)]
    return frames, [AskedQuestion(q.after_frames, q.text, q.options, q.answer) for q in asked], asked


# -- training ----------------------------------------------------------------------------------------
def evaluate(adapter, seeds: list[int]) -> dict:
    adapter.model.eval()
    per_kind: dict[str, list[bool]] = {}
    with torch.no_grad():
        for seed in seeds:
            frames, asked, raw = sample_example(seed, 1.0)
            _, correct = example_loss(adapter, lay_out_example(adapter, frames, asked, CHUNK_FRAMES))
            for q, ok in zip(raw, correct):
                per_kind.setdefault(q.kind, []).append(ok)
    adapter.model.train()
    total = [ok for oks in per_kind.values() for ok in oks]
    return {"accuracy": float(np.mean(total)) if total else 0.0,
            **{k: round(float(np.mean(v)), 3) for k, v in sorted(per_kind.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=FAMILIES, required=True)
    parser.add_argument("--out", type=pathlib.Path, help="where the finished model goes "
                        "(default: the bundled models folder)")
    parser.add_argument("--work", type=pathlib.Path, help="log and checkpoint folder (default: data/train-<family>)")
    parser.add_argument("--minutes", type=float, default=60.0, help="training time, resumed runs included")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-4,
                        help="peak learning rate (2e-3 never learned to read the frames in a trial here)")
    parser.add_argument("--accumulate", type=int, default=2, help="streams per optimizer step")
    parser.add_argument("--eval-every", type=float, default=5.0, help="minutes between held-out evaluations")
    parser.add_argument("--eval-streams", type=int, default=24)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cpu-per-wall", type=float, default=None,
                        help="resuming a checkpoint that predates CPU accounting: CPU cores it used on average")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or ROOT / "streamcache_ros" / "models" / BUNDLED_NAMES[args.family]
    work = args.work or ROOT / "data" / f"train-{args.family}"
    work.mkdir(parents=True, exist_ok=True)
    init_dir, checkpoint, log_path = work / "init", work / "checkpoint.pt", work / "train.log"
    if not args.resume or not checkpoint.exists():
        build_model(args.family, init_dir, args.seed)
    adapter = load_adapter(str(init_dir), device="cpu", dtype="float32")
    model = adapter.model
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, betas=(0.9, 0.99))
    state = {"step": 0, "elapsed": 0.0, "streams": 0, "cpu_seconds": 0.0}
    if args.resume and checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
        if "cpu_seconds" not in state:  # wall-clock accounting before: all cores busy, unless measured
            state["cpu_seconds"] = state["elapsed"] * (args.cpu_per_wall or args.threads)
        print(f"resumed at step {state['step']} after {state['cpu_seconds'] / 60:.1f} CPU-min", flush=True)
    budget = args.minutes * 60 * args.threads  # CPU-seconds
    held_out = [HELD_OUT_SEED + i for i in range(args.eval_streams)]
    log = open(log_path, "a", encoding="utf-8")

    def write(record: dict) -> None:
        line = json.dumps(record)
        log.write(line + "\n")
        log.flush()
        print(line, flush=True)

    write({"event": "start", "family": args.family, "seed": args.seed, "threads": args.threads,
           "params": sum(p.numel() for p in params), **state})
    started = time.perf_counter() - state["elapsed"]
    cpu_started = time.process_time() - state["cpu_seconds"]
    last_save = last_eval = time.perf_counter()
    losses, hits = [], []
    while True:
        state["cpu_seconds"] = time.process_time() - cpu_started
        if state["cpu_seconds"] >= budget:
            break
        progress = state["cpu_seconds"] / budget
        lr = args.lr * min(1.0, (state["step"] + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        for _ in range(args.accumulate):
            seed = TRAIN_SEED + args.seed * 10_000_000 + state["streams"]
            state["streams"] += 1
            try:
                frames, asked, _ = sample_example(seed, progress)
                example = lay_out_example(adapter, frames, asked, CHUNK_FRAMES)
            except Exception as err:  # noqa: BLE001 - one bad stream must not end an hour's run
                write({"step": state["step"], "skipped_stream": seed, "error": f"{type(err).__name__}: {err}"})
                continue
            loss, correct = example_loss(adapter, example)
            (loss / args.accumulate).backward()
            losses.append(loss.item())
            hits += correct
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        state["step"] += 1
        state["elapsed"] = time.perf_counter() - started
        if state["step"] % 20 == 0:
            write({"step": state["step"], "minutes": round(state["elapsed"] / 60, 2),
                   "cpu_minutes": round(state["cpu_seconds"] / 60, 2), "lr": round(lr, 6),
                   "loss": round(float(np.mean(losses)), 4), "train_accuracy": round(float(np.mean(hits)), 3)})
            losses, hits = [], []
        now = time.perf_counter()
        if now - last_eval > args.eval_every * 60:
            write({"step": state["step"], "minutes": round(state["elapsed"] / 60, 2), "held_out": evaluate(adapter, held_out)})
            last_eval = time.perf_counter()
        if now - last_save > 180:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, checkpoint)
            last_save = now
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, checkpoint)
    final = evaluate(adapter, held_out)
    write({"event": "done", "step": state["step"], "minutes": round(state["elapsed"] / 60, 2), "held_out": final})
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    written_by_save = {"model.safetensors", "config.json", "generation_config.json"}
    for name in os.listdir(init_dir):  # tokenizer (its config names the end-of-turn token), processor, settings
        if name not in written_by_save:
            (out / name).write_bytes((init_dir / name).read_bytes())
    _write_json(out / "training.json", {"family": args.family, "seed": args.seed, "steps": state["step"],
                                        "streams": state["streams"], "wall_minutes": round(state["elapsed"] / 60, 1),
                                        "cpu_minutes": round(state["cpu_seconds"] / 60, 1),
                                        "threads": args.threads, "held_out": final})
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
