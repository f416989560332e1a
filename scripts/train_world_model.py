"""Train a bundled shape-world model: a small real Qwen2.5-VL or LLaVA-OneVision, in two stages.

    python scripts/train_world_model.py --family qwen2_5_vl --vision-minutes 20 --minutes 100
    python scripts/train_world_model.py --family llava_onevision --init-from <model folder> --resume
    python scripts/train_world_model.py --family qwen2_5_vl --text-layers 6 --text-heads 8 --text-kv-heads 4 \
        --vision-from streamcache_ros/models/world-qwen2_5_vl --stages streams --curriculum grow-honest

1. **vision** (docs/world-models.md "Vision first"): the vision tower and projector alone, on single
   frames against dense per-frame targets (each half's shape and colour, the count), through a
   linear head that is thrown away afterwards. Its result is kept in <work>/vision/ on its own.
2. **streams**: the whole model on seeded world streams (streamcache_ros/world/) laid out exactly
   as the Session asks them (engine/stream/layout.py, engine/training/examples.py): chunks of 8 frames at 1 fps,
   questions after any number of frames, each seeing the stream as it was when asked, a share of
   them over a time window (masked as a windowed ask is). The target is the right option's words,
   then the end-of-turn token. The frame targets stay on as an auxiliary loss.

The model is built from the real transformers config classes with a tokenizer that holds the
world's words (its language model shaped by --text-layers, --text-heads, --text-kv-heads), or taken
from --init-from (a model folder this script wrote: its weights, tokenizer and processor). With
--vision-from a new language model gets a trained model's vision tower and projector, tokenizer and
processor; the vision stage is then only a frame head fitted on the frozen tokens (docs/world-models.md
"A wider pair"). A log line (loss, held-out accuracy) goes to <work>/train.log; checkpoints to
<work>/vision.pt and <work>/checkpoint.pt every few minutes, from which --resume continues. The
finished model is written with save_pretrained to --out.

Budgets are CPU time: a stage stops once the process has used minutes x --threads CPU-minutes, so
other work on the machine does not shorten training; --wall-minutes caps the whole run's wall time
as well (the learning-rate schedule follows whichever budget runs out first). --device cuda trains
on a GPU (budgets then count wall minutes).
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import multiprocessing
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
from streamcache_ros.engine.training.frame_targets import FrameHead, frame_loss, frame_targets, pooled_halves  # noqa: E402
from streamcache_ros.engine.stream.layout import question_prompt, stream_chunks, unit_members  # noqa: E402
from streamcache_ros.engine.training.examples import AskedQuestion, example_loss, lay_out_example  # noqa: E402

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
def text_shape(layers: int | None = None, heads: int | None = None, kv_heads: int | None = None) -> dict:
    """TEXT with another depth or head count; the width stays, so a head is hidden / heads wide."""
    shape = dict(TEXT)
    for key, value in (("num_hidden_layers", layers), ("num_attention_heads", heads),
                       ("num_key_value_heads", kv_heads)):
        if value is not None:
            shape[key] = value
    hidden, heads, kv_heads = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    if hidden % heads or heads % kv_heads or (hidden // heads) % 2:
        raise ValueError(f"hidden {hidden} with {heads} heads and {kv_heads} KV heads: the width must split "
                         "into heads of an even size, and the heads into KV groups")
    return shape


def text_config(tokenizer, shape: dict) -> dict:
    ids = tokenizer.convert_tokens_to_ids
    return dict(shape, vocab_size=VOCAB_SIZE, bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                pad_token_id=ids("<|endoftext|>"), tie_word_embeddings=False)


def build_qwen(out: pathlib.Path, seed: int, shape: dict, tokenizer=None) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration  # noqa: PLC0415

    tokenizer = tokenizer or build_tokenizer(QWEN_SPECIAL)
    ids = tokenizer.convert_tokens_to_ids
    text = text_config(tokenizer, shape)
    pairs = shape["hidden_size"] // shape["num_attention_heads"] // 2
    # M-RoPE: a quarter of the rotary pairs for time, the rest split between rows and columns
    t = pairs // 4
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0,
                               "mrope_section": [t, (pairs - t) // 2, pairs - t - (pairs - t) // 2]}
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2,
                           out_hidden_size=shape["hidden_size"], patch_size=14, spatial_merge_size=2,
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


def build_llava(out: pathlib.Path, seed: int, shape: dict, tokenizer=None) -> None:
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration  # noqa: PLC0415

    tokenizer = tokenizer or build_tokenizer(LLAVA_SPECIAL)
    ids = tokenizer.convert_tokens_to_ids
    text = text_config(tokenizer, shape)
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


def build_model(family: str, out: pathlib.Path, seed: int, shape: dict | None = None, tokenizer=None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (build_qwen if family == "qwen2_5_vl" else build_llava)(out, seed, shape or TEXT, tokenizer)
    # these models answer a multiple-choice question with the option's words (layout.options_query);
    # their default budget is about a third of the demo's 100-frame stream, so it binds there (docs/world-models.md)
    _write_json(out / MODEL_SETTINGS_FILE, {"options_prompt": "words", "budget_tokens": DEFAULT_BUDGET[family],
                                            "trained_on": "shape world (docs/world.md)"})


# what belongs to one set of weights, so a folder's other files (tokenizer, processor, settings) can go with another
WEIGHTS_OWN = ("model.safetensors", "config.json", "generation_config.json", "h2svc_head_map.json",
               "evidence_layers.json", "training.json")


def _model_class(family: str):
    import transformers  # noqa: PLC0415

    name = "Qwen2_5_VLForConditionalGeneration" if family == "qwen2_5_vl" else "LlavaOnevisionForConditionalGeneration"
    return getattr(transformers, name)


def build_with_vision_from(family: str, source: pathlib.Path, out: pathlib.Path, seed: int, shape: dict) -> dict:
    """A new model of ``shape`` in ``out`` with ``source``'s trained vision tower, and its projector
    where the widths match; ``source``'s tokenizer, processor and settings, so token ids and frame
    sizes are the ones that vision was trained with. What was copied is returned for the record."""
    from transformers import AutoConfig, AutoTokenizer  # noqa: PLC0415

    if AutoConfig.from_pretrained(source).model_type != family:
        raise ValueError(f"--vision-from {source} is not a {family} model")
    build_model(family, out, seed, shape, AutoTokenizer.from_pretrained(source))
    for name in os.listdir(source):
        if name not in WEIGHTS_OWN and (source / name).is_file():
            (out / name).write_bytes((source / name).read_bytes())
    model_cls = _model_class(family)
    trained = model_cls.from_pretrained(source, dtype=torch.float32).state_dict()
    model = model_cls.from_pretrained(out, dtype=torch.float32)
    state = model.state_dict()
    copied, left = [], []
    for name, tensor in trained.items():
        if not _is_vision(name):
            continue
        if name in state and state[name].shape == tensor.shape:
            state[name].copy_(tensor)
            copied.append(name)
        elif _is_projector(name):  # a projector into another width starts new and learns in the streams stage
            left.append(name)
        else:
            raise ValueError(f"--vision-from {source}: its vision tower differs from the one built here at {name}")
    model.save_pretrained(out, safe_serialization=True)
    return {"vision_from": str(source), "tensors_copied": len(copied), "projector_left_new": left}


def _write_json(path: pathlib.Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


# -- the data ----------------------------------------------------------------------------------------
TRAINED_KINDS = world.OPTION_KINDS
WINDOW_SHARE = 0.4  # of a stream's questions, asked over a time window


# each curriculum's question-kind weights (stream lengths: stream_length). Under "long" the kinds that
# stayed short after a "grow" run (before_color, moved, first_shape at 128 frames; docs/world-models.md)
# are asked more; under both, now_count (always right) less
KIND_WEIGHTS = {"grow": {"now_count": 0.5},
                "long": {"now_count": 0.5, "before_color": 2.0, "moved": 2.0, "first_shape": 1.5},
                "honest": {"now_count": 0.5, "before_color": 2.0, "moved": 2.0, "first_shape": 1.5},
                "grow-honest": {"now_count": 0.5, "before_color": 2.0, "moved": 2.0, "first_shape": 1.5}}
CURRICULA = tuple(KIND_WEIGHTS)
# "grow-honest", for a new language model: honest's questions on grow's lengths, since a new model on
# long streams from the start never learned to read the frames (docs/world-models.md "What the trainer
# does, and why"); held out on honest's mix, so its accuracy compares with the v4 models'
HONEST = ("honest", "grow-honest")
HELD_OUT_MIX = {"grow-honest": "honest"}
# "honest" (docs/world-models.md "Free text, hard negatives, comparisons"): streams drawn as under
# "long", and besides the option questions
FREE_TEXT_SHARE = 0.3  # of the questions asked without options: the target is the answer's word
HARD_NEGATIVES_PER_POINT = 1  # windowed seen, no, about an identity sharing a colour or a shape in view
COMPARISONS_PER_POINT = 1  # moved / before_color over a short window around the event


def stream_length(rng: np.random.Generator, progress: float, curriculum: str = "grow") -> int:
    """``grow``: streams of 4-16 frames first, so the vision tower and the question's attention
    learn to read one frame (cheap, many steps); then the longest stream grows to 512 frames by 70%
    of the run, lengths drawn log-uniformly so short streams stay common.
    ``long``, to continue a model that has had a ``grow`` run: half the streams 128-512 frames (a
    ``grow`` run meets them only in its last third, and its answers fade with length), the other half
    4-512 so short streams are not forgotten."""
    if curriculum in ("long", "honest"):
        shortest = 128 if rng.random() < 0.5 else 4
        return int(np.exp(rng.uniform(np.log(shortest), np.log(513))))
    grow = min(1.0, max(0.0, (progress - 0.15) / 0.55))
    longest = int(16 * (512 / 16) ** grow)
    return int(np.exp(rng.uniform(np.log(4), np.log(longest + 1))))


def stream_units(length: int, points: list[int], frames_per_unit: int) -> list[tuple[int, ...]]:
    """The frames of every stream unit, in order, when questions are asked after ``points`` frames
    (the Session's chunks and units: layout.stream_chunks, layout.unit_members)."""
    units = []
    for chunk in stream_chunks(length, points, CHUNK_FRAMES):
        units += [tuple(chunk[i] for i in members) for members in unit_members(len(chunk), frames_per_unit)]
    return units


def random_window(rng: np.random.Generator, units: list[tuple[int, ...]], frames_per_unit: int) -> tuple[int, int]:
    """A window (first frame, last frame) made of whole units, of the kinds a robot and the when
    search ask: one chunk's frames (standing questions), from some time up to now, one unit or two
    (the when timeline), or any stretch."""
    count = len(units)
    r = rng.random()
    if r < 0.35:
        length = min(count, CHUNK_FRAMES // frames_per_unit)
    elif r < 0.6:
        first = int(rng.integers(count))
        return units[first][0], units[-1][-1]
    elif r < 0.8:
        length = min(count, int(rng.integers(1, 3)))
    else:
        length = int(np.exp(rng.uniform(0, np.log(count + 1))))
        length = max(1, min(count, length))
    first = int(rng.integers(count - length + 1))
    return units[first][0], units[first + length - 1][-1]


def sample_example(seed: int, progress: float, frames_per_unit: int, questions_per_stream: int = 12,
                   curriculum: str = "grow"):
    """(frames, questions, their labels) of one seeded training stream; about WINDOW_SHARE of the
    questions are asked over a time window. Under "honest", hard negatives and comparisons join the
    windowed pool, and FREE_TEXT_SHARE of the questions lose their options."""
    rng = np.random.default_rng((seed, 7))
    length = stream_length(rng, progress, curriculum)
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
    plain = [q for n in chosen for q in stream.questions(n, rng, TRAINED_KINDS)]
    units = stream_units(length, chosen, frames_per_unit)
    windowed = []
    for n in chosen:
        before = [u for u in units if u[-1] < n]
        for _ in range(2):
            first, last = random_window(rng, before, frames_per_unit)
            # seen is what a window is asked most (the when search, standing questions)
            kinds = ("seen",) if rng.random() < 0.5 else world.WINDOW_KINDS
            windowed += stream.window_questions(n, first, last, rng, kinds)
        if curriculum in HONEST:
            for _ in range(HARD_NEGATIVES_PER_POINT):
                first, last = random_window(rng, before, frames_per_unit)
                hard = world.ask_seen_hard_negative(stream, n, first, last, rng)
                windowed += [hard] if hard is not None else []
            for _ in range(COMPARISONS_PER_POINT):
                windowed += world.comparison_questions(stream, n, rng)
    # long-memory and rarer kinds are worth more than another now_count
    want_windowed = min(len(windowed), int(round(WINDOW_SHARE * questions_per_stream)))
    weights = KIND_WEIGHTS[curriculum]
    asked = (_pick(rng, windowed, want_windowed, weights)
             + _pick(rng, plain, min(len(plain), questions_per_stream - want_windowed), weights))
    asked.sort(key=lambda q: q.after_frames)
    frames = [stream.frame(i) for i in range(length)]
    free = [curriculum in HONEST and rng.random() < FREE_TEXT_SHARE for _ in asked]
    questions = [AskedQuestion(q.after_frames, q.text, [] if f else q.options, q.answer, q.window)
                 for q, f in zip(asked, free)]
    return frames, questions, [label(q, f) for q, f in zip(asked, free)]


def _pick(rng: np.random.Generator, pool: list, count: int, kind_weights: dict[str, float]) -> list:
    if not count:
        return []
    weights = np.asarray([kind_weights.get(q.kind, 1.0) for q in pool])
    return [pool[i] for i in rng.choice(len(pool), size=count, replace=False, p=weights / weights.sum())]


def label(question, free_text: bool = False) -> str:
    """A question's kind as the log reports it: windowed and free-text questions apart, and the
    questions a trainer drew for a purpose (hard negatives, comparisons) apart again."""
    name = f"{question.kind}@window" if question.window else question.kind
    name = f"{name}@{question.tag}" if question.tag else name
    return f"{name}@free" if free_text else name


class FramePool:
    """Single world frames, preprocessed, with their targets, drawn over the whole range of looks;
    a few are replaced by fresh ones every step, so the pool never goes stale."""

    def __init__(self, adapter, seed: int, size: int):
        self.adapter, self.seed, self.size = adapter, seed, size
        self.rng = np.random.default_rng((seed, 3))
        self.drawn = 0
        self.items = [self._draw() for _ in range(size)]

    def _draw(self):
        self.drawn += 1
        rng = np.random.default_rng((self.seed, self.drawn))
        stream = world.make_stream(self.seed + self.drawn, 16, look=world.random_look(rng),
                                   one_object_first=float(rng.uniform(0.3, 0.9)))
        index = int(rng.integers(len(stream)))
        frame = stream.frame(index)
        targets = frame_targets(stream.truth[index], stream.look.width, world.SHAPES, world.COLOUR_NAMES)
        return frame, targets

    def batch(self, count: int, refresh: int = 4):
        for slot in self.rng.choice(self.size, size=refresh, replace=False):
            self.items[slot] = self._draw()
        picked = [self.items[i] for i in self.rng.choice(self.size, size=count, replace=False)]
        return [f for f, _ in picked], [t for _, t in picked]


class StreamFeed:
    """The training streams in seed order. With ``workers``, processes render them ahead (on a GPU
    the rendering, not the model, is what a step waits for); each is drawn at the schedule's
    progress when it was asked for, a few streams early."""

    def __init__(self, first_seed: int, frames_per_unit: int, workers: int, curriculum: str = "grow"):
        self.next_seed, self.frames_per_unit, self.curriculum = first_seed, frames_per_unit, curriculum
        self.pool = multiprocessing.get_context("spawn").Pool(workers) if workers else None
        self.ahead = 2 * workers
        self.pending: collections.deque = collections.deque()
        self.last_seed = first_seed

    def take(self, progress: float):
        """The next stream's (frames, questions, the world's questions), its seed in ``last_seed``;
        a stream that failed to render raises here, as it would have without workers."""
        if self.pool is None:
            self.last_seed, self.next_seed = self.next_seed, self.next_seed + 1
            return sample_example(self.last_seed, progress, self.frames_per_unit, curriculum=self.curriculum)
        while len(self.pending) < self.ahead:
            self.pending.append((self.next_seed, self.pool.apply_async(
                sample_example, (self.next_seed, progress, self.frames_per_unit), {"curriculum": self.curriculum})))
            self.next_seed += 1
        self.last_seed, result = self.pending.popleft()
        return result.get(timeout=600)  # a worker that cannot start must not hang the run

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()


def new_frame_head(adapter) -> FrameHead:
    return FrameHead(adapter.text_config.hidden_size, len(world.SHAPES), len(world.COLOUR_NAMES)).to(adapter.device)


# -- the budget ---------------------------------------------------------------------------------------
class Budget:
    """How far a stage is: CPU-seconds used against its budget (wall seconds on a GPU), capped by
    the run's wall deadline. Resumable: ``used`` is saved in the checkpoint."""

    def __init__(self, seconds: float, used: float, on_gpu: bool, deadline: float | None):
        self.seconds, self.on_gpu, self.deadline = seconds, on_gpu, deadline
        self.stage_start = time.time()
        self._clock_start = self._clock() - used
        self._wall_left_at_start = (deadline - time.time()) if deadline else None

    def _clock(self) -> float:
        return time.perf_counter() if self.on_gpu else time.process_time()

    @property
    def used(self) -> float:
        return self._clock() - self._clock_start

    @property
    def progress(self) -> float:
        done = self.used / self.seconds if self.seconds > 0 else 1.0
        if self.deadline is not None:
            span = max(self._wall_left_at_start, 1e-9)
            done = max(done, (time.time() - self.stage_start) / span)
        return min(done, 1.0)


def lr_at(peak: float, step: int, progress: float, warmup: int = 100) -> float:
    return peak * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# -- evaluation --------------------------------------------------------------------------------------
def evaluate(adapter, seeds: list[int], curriculum: str = "grow") -> dict:
    curriculum = HELD_OUT_MIX.get(curriculum, curriculum)
    adapter.model.eval()
    per_kind: dict[str, list[bool]] = {}
    with torch.no_grad():
        for seed in seeds:
            frames, asked, labels = sample_example(seed, 1.0, adapter.frames_per_unit, curriculum=curriculum)
            _, correct = example_loss(adapter, lay_out_example(adapter, frames, asked, CHUNK_FRAMES))
            for name, ok in zip(labels, correct):
                per_kind.setdefault(name, []).append(ok)
    adapter.model.train()
    total = [ok for oks in per_kind.values() for ok in oks]
    return {"accuracy": round(float(np.mean(total)), 4) if total else 0.0,
            **{k: round(float(np.mean(v)), 3) for k, v in sorted(per_kind.items())}}


def evaluate_frames(adapter, head: FrameHead, pool: FramePool) -> dict:
    """The frame head's reading of held-out frames (a pool of its own seeds)."""
    adapter.model.eval()
    with torch.no_grad():
        frames, targets = zip(*pool.items)
        right: dict[str, list[float]] = {}
        for start in range(0, len(frames), 64):
            _, r = frame_loss(head, pooled_halves(adapter, list(frames[start:start + 64])), list(targets[start:start + 64]))
            for k, v in r.items():
                right.setdefault(k, []).append(v)
    adapter.model.train()
    return {k: round(float(np.mean(v)), 3) for k, v in right.items()}


# -- the stages --------------------------------------------------------------------------------------
class Run:
    def __init__(self, args, adapter, work: pathlib.Path):
        self.args, self.adapter, self.work = args, adapter, work
        self.log = open(work / "train.log", "a", encoding="utf-8")
        self.on_gpu = adapter.device.type == "cuda"
        self.deadline = time.time() + args.wall_minutes * 60 if args.wall_minutes else None

    def write(self, record: dict) -> None:
        line = json.dumps(record)
        self.log.write(line + "\n")
        self.log.flush()
        print(line, flush=True)

    def budget(self, minutes: float, state: dict) -> Budget:
        """A checkpoint resumes at the same point of its schedule (its saved progress), so a run
        moved to another device or given other --minutes stretches what is left of it rather than
        restarting or ending it."""
        seconds = minutes * 60 * (1 if self.on_gpu else self.args.threads)
        used = state["progress"] * seconds if "progress" in state else state["used"]
        return Budget(seconds, used, self.on_gpu, self.deadline)


def vision_stage(run: Run) -> None:
    """The vision tower and projector on single frames; the language model waits."""
    args, adapter, work = run.args, run.adapter, run.work
    model = adapter.model
    vision = [p for name, p in model.named_parameters() if _is_vision(name)]
    head = new_frame_head(adapter)
    params = vision + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.vision_lr, weight_decay=0.01, betas=(0.9, 0.99))
    state = {"step": 0, "used": 0.0}
    checkpoint = work / "vision.pt"
    if args.resume and checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False, map_location=adapter.device)
        model.load_state_dict(saved["model"])
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
    budget = run.budget(args.vision_minutes, state)
    pool = FramePool(adapter, TRAIN_SEED + 50_000_000 + args.seed * 1_000_000, 4096)
    held_out = FramePool(adapter, HELD_OUT_SEED + 50_000_000, 512)
    run.write({"event": "vision start", "params": sum(p.numel() for p in vision), **state,
               "held_out": evaluate_frames(adapter, head, held_out)})
    model.train()
    last_save = last_eval = time.perf_counter()
    losses, rights = [], []

    def save():
        state["used"], state["progress"] = budget.used, budget.progress
        torch.save({"model": model.state_dict(), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
                    "state": state}, checkpoint)

    while budget.progress < 1.0:
        lr = lr_at(args.vision_lr, state["step"], budget.progress, warmup=50)
        for group in optimizer.param_groups:
            group["lr"] = lr
        frames, targets = pool.batch(args.frame_batch)
        loss, right = frame_loss(head, pooled_halves(adapter, frames), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        state["step"] += 1
        losses.append(loss.item())
        rights.append(right)
        if state["step"] % 50 == 0:
            run.write({"stage": "vision", "step": state["step"], "cpu_minutes": round(budget.used / 60, 2),
                       "lr": round(lr, 6), "loss": round(float(np.mean(losses)), 4),
                       **{f"train_{k}": round(float(np.mean([r[k] for r in rights])), 3) for k in rights[0]}})
            losses, rights = [], []
        now = time.perf_counter()
        if now - last_eval > args.eval_every * 60:
            run.write({"stage": "vision", "step": state["step"], "held_out": evaluate_frames(adapter, head, held_out)})
            last_eval = time.perf_counter()
        if now - last_save > 180:
            save()
            last_save = now
    save()
    final = evaluate_frames(adapter, head, held_out)
    run.write({"event": "vision done", "step": state["step"], "cpu_minutes": round(budget.used / 60, 2),
               "held_out": final})
    save_model(adapter, work / "init", work / "vision", {"stage": "vision", "steps": state["step"],
                                                         "held_out_frames": final})
    torch.save(head.state_dict(), work / "vision" / "frame_head.pt")


def _is_vision(name: str) -> bool:
    """The vision tower and the projector (Qwen: model.visual with its merger; LLaVA: the SigLIP
    tower and multi_modal_projector)."""
    return any(part in name for part in ("visual.", "vision_tower.", "multi_modal_projector."))


def _is_projector(name: str) -> bool:
    """What maps vision features into the text width (Qwen's merger, LLaVA's projector)."""
    return any(part in name for part in ("visual.merger.", "multi_modal_projector."))


HEAD_FIT_STEPS = 600  # of 256 frames' pooled tokens; a linear head on frozen tokens settles within a few hundred


def fitted_vision_stage(run: Run, copied: dict) -> None:
    """--vision-from: the vision tower came trained, so instead of the vision stage a frame head is
    fitted on its frozen tokens. The streams stage's auxiliary loss then starts from a head that reads
    them (a random head's gradients would pull the copied tokens about). <work>/vision/ is written as
    the vision stage writes it, so the streams stage and --resume find it alike."""
    args, adapter, work = run.args, run.adapter, run.work
    head = new_frame_head(adapter)
    pool = FramePool(adapter, TRAIN_SEED + 50_000_000 + args.seed * 1_000_000, args.head_frames)
    held_out = FramePool(adapter, HELD_OUT_SEED + 50_000_000, 512)
    started = time.process_time()
    adapter.model.eval()
    with torch.no_grad():
        frames, targets = zip(*pool.items)
        halves = torch.cat([pooled_halves(adapter, list(frames[i:i + 64])) for i in range(0, len(frames), 64)])
    adapter.model.train()
    run.write({"event": "vision copied", **copied, "frames": len(frames),
               "held_out_untrained_head": evaluate_frames(adapter, head, held_out)})
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2, weight_decay=0.01)
    rng = np.random.default_rng((args.seed, 5))
    for _ in range(HEAD_FIT_STEPS):
        picked = rng.choice(len(targets), size=min(256, len(targets)), replace=False)
        loss, _ = frame_loss(head, halves[torch.as_tensor(picked)], [targets[i] for i in picked])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    final = evaluate_frames(adapter, head, held_out)
    run.write({"event": "vision done", "head_fit_steps": HEAD_FIT_STEPS, "loss": round(loss.item(), 4),
               "cpu_minutes": round((time.process_time() - started) / 60, 2), "held_out": final})
    save_model(adapter, work / "init", work / "vision", {"stage": "vision", **copied, "head_fit_steps": HEAD_FIT_STEPS,
                                                         "held_out_frames": final})
    torch.save(head.state_dict(), work / "vision" / "frame_head.pt")


def streams_stage(run: Run, head: FrameHead) -> dict:
    args, adapter, work = run.args, run.adapter, run.work
    model = adapter.model
    model.train()
    params = [p for p in model.parameters() if p.requires_grad] + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, betas=(0.9, 0.99))
    state = {"step": 0, "streams": 0, "used": 0.0}
    warm_from = 0
    checkpoint = work / "checkpoint.pt"
    if args.resume and checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False, map_location=adapter.device)
        model.load_state_dict(saved["model"])
        head.load_state_dict(saved["head"])
        state = saved["state"]
        if "optimizer" in saved:
            optimizer.load_state_dict(saved["optimizer"])
        else:  # Adam's moments start again (a checkpoint slimmed to travel), so the rate warms up again
            warm_from = state["step"]
        run.write({"event": "streams resumed", "optimizer": "optimizer" in saved, **state})
    budget = run.budget(args.minutes, state)
    held_out = [HELD_OUT_SEED + i for i in range(args.eval_streams)]
    pool = FramePool(adapter, TRAIN_SEED + 60_000_000 + args.seed * 1_000_000, 1024) if args.aux_frames else None
    run.write({"event": "streams start", "family": args.family, "seed": args.seed, "threads": args.threads,
               "params": sum(p.numel() for p in model.parameters()), **state})
    feed = StreamFeed(TRAIN_SEED + args.seed * 10_000_000 + state["streams"], adapter.frames_per_unit, args.workers,
                      args.curriculum)
    last_save = last_eval = time.perf_counter()
    losses, hits, aux = [], [], []

    def save():
        state["used"], state["progress"] = budget.used, budget.progress
        torch.save({"model": model.state_dict(), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
                    "state": state}, checkpoint)

    while budget.progress < 1.0:
        progress = budget.progress
        lr = lr_at(args.lr, state["step"] - warm_from, progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        for _ in range(args.accumulate):
            state["streams"] += 1
            try:
                frames, asked, _ = feed.take(progress)
                example = lay_out_example(adapter, frames, asked, CHUNK_FRAMES)
            except Exception as err:  # noqa: BLE001 - one bad stream must not end an hour's run
                run.write({"step": state["step"], "skipped_stream": feed.last_seed, "error": f"{type(err).__name__}: {err}"})
                continue
            loss, correct = example_loss(adapter, example)
            (loss / args.accumulate).backward()
            losses.append(loss.item())
            hits += correct
        if pool is not None:  # the frame targets stay on, so the tokens keep what vision first taught
            frames, targets = pool.batch(args.aux_frames, refresh=2)
            frame_part, _ = frame_loss(head, pooled_halves(adapter, frames), targets)
            (args.aux_weight * frame_part).backward()
            aux.append(frame_part.item())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        state["step"] += 1
        if state["step"] % 20 == 0:
            run.write({"stage": "streams", "step": state["step"], "cpu_minutes": round(budget.used / 60, 2),
                       "wall_minutes": round((time.time() - budget.stage_start) / 60, 2), "lr": round(lr, 6),
                       "loss": round(float(np.mean(losses)), 4), "frame_loss": round(float(np.mean(aux)), 4) if aux else None,
                       "train_accuracy": round(float(np.mean(hits)), 3)})
            losses, hits, aux = [], [], []
        now = time.perf_counter()
        if now - last_eval > args.eval_every * 60:
            run.write({"stage": "streams", "step": state["step"],
                       "held_out": evaluate(adapter, held_out, args.curriculum)})
            last_eval = time.perf_counter()
        if now - last_save > 180:
            save()
            last_save = now
    feed.close()
    save()
    final = evaluate(adapter, held_out, args.curriculum)
    run.write({"event": "streams done", "step": state["step"], "cpu_minutes": round(budget.used / 60, 2),
               "held_out": final})
    return {"steps": state["step"], "streams": state["streams"], "cpu_minutes": round(budget.used / 60, 1),
            "held_out": final}


def save_model(adapter, source: pathlib.Path, out: pathlib.Path, record: dict) -> None:
    """The model with save_pretrained, the rest of ``source``'s folder beside it (tokenizer, whose
    config names the end-of-turn token; processor; the node's settings), and ``record``."""
    adapter.model.eval()
    out.mkdir(parents=True, exist_ok=True)
    adapter.model.save_pretrained(out, safe_serialization=True)
    written_by_save = {"model.safetensors", "config.json", "generation_config.json", "training.json"}
    for name in os.listdir(source):
        if name not in written_by_save and (source / name).is_file():
            (out / name).write_bytes((source / name).read_bytes())
    _write_json(out / "training.json", record)
    adapter.model.train()


def prepare_init(args, init_dir: pathlib.Path) -> dict:
    """The starting model: --init-from's folder (weights, tokenizer, processor, settings; what the
    node learned about it before, the H2SVC profile and evidence layers, is not carried over), a new
    language model with --vision-from's vision, or a new model from the config classes. With
    --vision-from, what was copied (also kept in <work>/vision_from.json, for a resumed run)."""
    record_file = init_dir.parent / "vision_from.json"
    if init_dir.exists() and args.resume:
        return json.loads(record_file.read_text()) if record_file.exists() else {}
    shape = text_shape(args.text_layers, args.text_heads, args.text_kv_heads)
    if args.vision_from:
        copied = build_with_vision_from(args.family, args.vision_from, init_dir, args.seed, shape)
        _write_json(record_file, copied)
        return copied
    if args.init_from:
        init_dir.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(args.init_from):
            if name not in ("h2svc_head_map.json", "evidence_layers.json", "training.json"):
                (init_dir / name).write_bytes((args.init_from / name).read_bytes())
    else:
        build_model(args.family, init_dir, args.seed, shape)
    return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=FAMILIES, required=True)
    parser.add_argument("--out", type=pathlib.Path, help="where the finished model goes "
                        "(default: the bundled models folder)")
    parser.add_argument("--work", type=pathlib.Path, help="log and checkpoint folder (default: data/train-<family>)")
    parser.add_argument("--init-from", type=pathlib.Path, help="start from this model folder instead of new weights")
    parser.add_argument("--vision-from", type=pathlib.Path, help="a new model whose vision tower (and projector, "
                        "where the widths match), tokenizer and processor come from this trained model folder; "
                        "the vision stage then only fits the frame head")
    parser.add_argument("--text-layers", type=int,
                        help=f"a new model's text layers (default {TEXT['num_hidden_layers']})")
    parser.add_argument("--text-heads", type=int,
                        help=f"a new model's attention heads (default {TEXT['num_attention_heads']}; "
                             f"the width stays {TEXT['hidden_size']})")
    parser.add_argument("--text-kv-heads", type=int,
                        help=f"a new model's KV heads (default {TEXT['num_key_value_heads']})")
    parser.add_argument("--head-frames", type=int, default=2048,
                        help="--vision-from: frames the frame head is fitted on")
    parser.add_argument("--stages", default="vision,streams", help="which stages run, in order")
    parser.add_argument("--curriculum", choices=CURRICULA, default="grow",
                        help="streams: how stream lengths and question kinds are drawn (long: to continue a trained "
                        "model; grow-honest: a new language model, e.g. with --vision-from)")
    parser.add_argument("--frame-head", type=pathlib.Path, help="streams: start the frame head from this file "
                        "(a frame_head.pt, or a run's checkpoint.pt)")
    parser.add_argument("--vision-minutes", type=float, default=20.0, help="vision stage: CPU-minutes per thread")
    parser.add_argument("--minutes", type=float, default=100.0, help="streams stage: CPU-minutes per thread")
    parser.add_argument("--wall-minutes", type=float, default=None, help="a cap on the whole run's wall time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vision-lr", type=float, default=1e-3)
    parser.add_argument("--frame-batch", type=int, default=64, help="vision stage: frames per step")
    parser.add_argument("--lr", type=float, default=3e-4,
                        help="streams: peak learning rate (2e-3 never learned to read the frames in a trial here)")
    parser.add_argument("--accumulate", type=int, default=2, help="streams per optimizer step")
    parser.add_argument("--aux-frames", type=int, default=16, help="streams: frames per step for the frame targets")
    parser.add_argument("--aux-weight", type=float, default=0.5)
    parser.add_argument("--eval-every", type=float, default=10.0, help="minutes between held-out evaluations")
    parser.add_argument("--eval-streams", type=int, default=24)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--workers", type=int, default=0, help="streams: processes that render streams ahead "
                        "(0: none; worth it on a GPU, where the model waits for the rendering)")
    args = parser.parse_args()
    shaped = any(v is not None for v in (args.text_layers, args.text_heads, args.text_kv_heads))
    if args.init_from and (args.vision_from or shaped):
        parser.error("--init-from keeps its model's shape and vision; --vision-from and --text-* make a new model")
    try:
        text_shape(args.text_layers, args.text_heads, args.text_kv_heads)
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(args.threads)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if not stages or any(s not in ("vision", "streams") for s in stages):
        parser.error(f"--stages takes vision and/or streams, got '{args.stages}'")
    out = args.out or ROOT / "streamcache_ros" / "models" / BUNDLED_NAMES[args.family]
    work = args.work or ROOT / "data" / f"train-{args.family}"
    work.mkdir(parents=True, exist_ok=True)
    init_dir = work / "init"
    copied = prepare_init(args, init_dir)
    vision_dir = work / "vision"
    vision_done = (vision_dir / "frame_head.pt").exists()
    start_dir = vision_dir if ("vision" not in stages or vision_done) and vision_dir.exists() else init_dir
    adapter = load_adapter(str(start_dir), device=args.device, dtype="float32")
    run = Run(args, adapter, work)
    run.write({"event": "start", "stages": stages, "from": str(start_dir), "device": str(adapter.device),
               "text": {k: getattr(adapter.text_config, k) for k in ("num_hidden_layers", "num_attention_heads",
                                                                      "num_key_value_heads", "hidden_size")}})
    resuming_streams = args.resume and (work / "checkpoint.pt").exists()  # it holds its own frame head
    if copied and not vision_done and not resuming_streams:
        fitted_vision_stage(run, copied)
    elif "vision" in stages and not vision_done and not copied:
        vision_stage(run)
    if "streams" not in stages:
        return
    head = new_frame_head(adapter)
    if args.frame_head:  # a trained model's own head, so the frame targets do not start from noise
        saved = torch.load(args.frame_head, weights_only=False, map_location=adapter.device)
        head.load_state_dict(saved.get("head", saved))
    elif (vision_dir / "frame_head.pt").exists():
        head.load_state_dict(torch.load(vision_dir / "frame_head.pt", map_location=adapter.device))
    streams_record = streams_stage(run, head)
    vision_record = {}
    if (vision_dir / "training.json").exists():
        vision_record = json.loads((vision_dir / "training.json").read_text())
    record = {"family": args.family, "seed": args.seed, "threads": args.threads, "device": str(adapter.device),
              "init_from": str(args.init_from or "new"), "vision_from": copied.get("vision_from"),
              "text": {k: getattr(adapter.text_config, k) for k in ("num_hidden_layers", "num_attention_heads",
                                                                     "num_key_value_heads", "hidden_size")},
              "curriculum": args.curriculum,
              "kind_weights": KIND_WEIGHTS[args.curriculum], "peak_lr": args.lr,
              "vision": vision_record, "streams": streams_record}
    if args.init_from and (args.init_from / "training.json").exists():  # how the starting weights were made
        record["continued_from"] = json.loads((args.init_from / "training.json").read_text())
    save_model(adapter, init_dir, out, record)
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
