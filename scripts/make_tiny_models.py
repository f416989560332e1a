"""Build the bundled tiny models: real Qwen2.5-VL and LLaVA-OneVision classes, random weights.

No weights can be downloaded here, so tests and the demo run the real transformers code paths on
tiny randomly initialised models built from the real config classes. Their answers are meaningless.
The tokenizer is a small byte-level BPE trained here on a fixed corpus (any UTF-8 text encodes),
with the chat special tokens of the real models. Deterministic: the same files every run.

``--real-tokens`` builds the other pair instead: the same tiny widths, but the real processors'
tokens per frame (``REAL_TOKENS``) and a small position range, so that a 640x480 stream evicts and
re-indexes at the token counts of a real deployment (docs/setup.md#test-models). The tests build
them at test time (conftest.py); they are not committed.

    python scripts/make_tiny_models.py [--out streamcache_ros/models] [--real-tokens]
"""
from __future__ import annotations

import argparse
import json
import pathlib

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
)

VOCAB_SIZE = 640
# Generated weights are this much wider than the configs' default 0.02, so random logits are not
# all ties (greedy answers then differ between streams, which the tests rely on).
INIT_RANGE = 0.2

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>", "<|video_pad|>"]
LLAVA_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]

CORPUS = """
You are a helpful assistant. Describe the current scene in detail, focusing on specific objects,
fine-grained actions, and spatial relationships. Summarize the video narrative, identifying main
characters, key events, timeline changes, and the overall theme. Question: what is on the table?
Answer: a red cup, a blue box and a green ball. Where did the robot leave the keys? Options: (A) on
the shelf (B) in the drawer (C) on the floor (D) next to the door. Only give the best option.
Best option: (A). How many people walked past the camera? Is the door open or closed? What colour is
the car that moved to the left? The yellow square moves right, the circle turns purple, the scene
changes to a kitchen with a sink, a fridge, a window and a chair. 0 1 2 3 4 5 6 7 8 9 yes no
"""


def build_tokenizer(special: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tok.add_special_tokens(special)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )


def text_config(tokenizer, max_position_embeddings: int) -> dict:
    return dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        initializer_range=INIT_RANGE,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        tie_word_embeddings=False,
    )


# The real processors' tokens per frame at tiny widths (--real-tokens): Qwen2.5-VL's preprocessor
# bounds (min_pixels 56*56, max_pixels 28*28*16384: a 640x480 frame is resized to 476x644, 34x46
# patches, merged 2x2 to 17x23 = 391 tokens a temporal patch of 2 frames) and window size; LLaVA-
# OneVision's SigLIP at 384 px, patch 14 (27x27 patches, pooled to 14x14 = 196 tokens a frame).
# The position ranges are small, so a stream of a few dozen frames passes them again and again.
REAL_TOKENS = {
    "qwen2_5_vl": {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 16384, "window_size": 112,
                   "max_position_embeddings": 2048},
    "llava_onevision": {"image_size": 384, "max_position_embeddings": 4096},
}


def build_qwen(out: pathlib.Path, real_tokens: bool = False) -> None:
    tokenizer = build_tokenizer(QWEN_SPECIAL)
    ids = tokenizer.convert_tokens_to_ids
    real = REAL_TOKENS["qwen2_5_vl"] if real_tokens else {}
    text = text_config(tokenizer, max_position_embeddings=real.get("max_position_embeddings", 4096))
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [2, 3, 3]}
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=2,
            window_size=real.get("window_size", 56), fullatt_block_indexes=[1], initializer_range=INIT_RANGE,
        ),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # Frames resized to 112x112 (within [min, max] pixels): 8x8 patches, 16 tokens per 2 frames;
    # with real_tokens the real model's bounds: 391 tokens per 2 frames of 640x480.
    pixels = (real["min_pixels"], real["max_pixels"]) if real else (112 * 112, 112 * 112)
    _write_json(out / "preprocessor_config.json", {
        "image_processor_type": "Qwen2VLImageProcessor",
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": True, "resample": 3,
        "size": {"shortest_edge": pixels[0], "longest_edge": pixels[1]},
        "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    })


def build_llava(out: pathlib.Path, real_tokens: bool = False) -> None:
    tokenizer = build_tokenizer(LLAVA_SPECIAL)
    ids = tokenizer.convert_tokens_to_ids
    real = REAL_TOKENS["llava_onevision"] if real_tokens else {}
    text = text_config(tokenizer, max_position_embeddings=real.get("max_position_embeddings", 4096))
    text.update(model_type="qwen2", rope_theta=1_000_000.0)
    size = real.get("image_size", 56)
    config = LlavaOnevisionConfig(
        text_config=text,
        vision_config=dict(
            model_type="siglip_vision_model", image_size=size, patch_size=14, hidden_size=32,
            intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        ),
        image_token_index=ids("<image>"),
        video_token_index=ids("<video>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        image_grid_pinpoints=[[size, size]],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlavaOnevisionForConditionalGeneration(config).eval()
    # SigLIP and the projector ignore text initializer_range: widen them too, so frames matter.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ("vision_tower" in name or "multi_modal_projector" in name) and param.dim() > 1:
                param.normal_(0.0, INIT_RANGE)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _write_json(out / "preprocessor_config.json", {
        "image_processor_type": "LlavaOnevisionImageProcessor",
        "do_resize": True, "size": {"height": size, "width": size}, "resample": 3,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
        "do_pad": False, "image_grid_pinpoints": [[size, size]],
    })


def _write_json(path: pathlib.Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def build_real_tokens(out: pathlib.Path, family: str, head_map: pathlib.Path | None = None) -> pathlib.Path:
    """The tiny model of ``family`` with the real processor's tokens per frame in ``out/real-<family>``,
    with ``head_map`` (the bundled tiny model's: the same layers and KV heads) as its H2SVC head map."""
    folder = out / f"real-{family}"
    (build_qwen if family == "qwen2_5_vl" else build_llava)(folder, real_tokens=True)
    if head_map is not None:
        data = json.loads(head_map.read_text())
        data["model_id"] = folder.name
        _write_json(folder / head_map.name, data)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = pathlib.Path(__file__).resolve().parents[1] / "streamcache_ros" / "models"
    parser.add_argument("--out", type=pathlib.Path, default=default_out)
    parser.add_argument("--real-tokens", action="store_true",
                        help="the real processors' tokens per frame and a small position range (test models)")
    args = parser.parse_args()
    if args.real_tokens:
        for family in REAL_TOKENS:
            bundled = default_out / f"tiny-{family}" / "h2svc_head_map.json"
            print(build_real_tokens(args.out, family, bundled if bundled.exists() else None))
        return
    build_qwen(args.out / "tiny-qwen2_5_vl")
    build_llava(args.out / "tiny-llava_onevision")
    for path in sorted(args.out.glob("tiny-*")):
        size = sum(f.stat().st_size for f in path.iterdir())
        print(f"{path}: {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
