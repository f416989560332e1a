"""Train the bundled shape-world dual encoder (the archive's index, docs/archive.md "The index").

    python scripts/train_retrieval_model.py --minutes 30            # CPU minutes; log in <work>/train.log
    python scripts/train_retrieval_model.py --resume --minutes 20   # continues from <work>/checkpoint.pt
    python scripts/train_retrieval_model.py --half-identities --minutes 10 --work build/retrieval-half \
        --out bench/encoders/world-retrieval-half  # an encoder never taught half the identities (a bench's)

A small real CLIPModel (transformers): a ViT over the frame resized to 64x64 (no crop: an object
near a 16:9 frame's edge must stay in view), a text transformer over a word-level tokenizer of the
world's words. Trained with a sigmoid loss (SigLIP's) on every frame against every question text of
the world's 18 identities, and the 6 colours and 3 shapes alone, each in one of several phrasings:
a text is true of a frame when what it names is in view. Every identity is asked of every frame, so
the hard negatives (the asked colour on another shape, the asked shape in another colour) are in
each batch. Frames come from world streams of random looks over the whole range docs/world.md
allows (size, aspect, background, noise, jitter, JPEG). Streams' seeds start at 700 000 000: no
benchmark draws them (they use 510 000 000 ...).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine.recall.index.encoder import RETRIEVAL_FILE  # noqa: E402

TRAIN_SEED = 700_000_000
HELD_OUT_SEED = 710_000_000
IMAGE_SIZE = 64
SPECIAL = ["[PAD]", "[BOS]", "[UNK]", "[EOS]"]  # eos at 3: CLIP's text model pools at the first eos
TEMPLATES = ("Did you see a {name}?", "When did you last see the {name}?", "When did you first see the {name}?",
             "Is there a {name}?", "{name}")
WORDS = sorted({w for t in TEMPLATES for w in t.replace("?", " ").replace("{name}", "").lower().split()}
               | set(world.COLOUR_NAMES) | set(world.SHAPES) | {"object", "an", "in", "view", "the", "a", "shape"})


# the identities --half-identities never teaches: every other one of the 18, so each colour and each
# shape keeps some taught identities
HALF_LEFT_OUT = tuple((s, c) for i, (s, c) in enumerate((s, c) for s in world.SHAPES for c in world.COLOUR_NAMES)
                      if i % 2 == 1)


def names() -> list[tuple[str, tuple[str | None, str | None]]]:
    """Every text subject: (words, (shape or None, colour or None))."""
    out = [(f"{c} {s}", (s, c)) for s in world.SHAPES for c in world.COLOUR_NAMES]
    out += [(f"{c} object", (None, c)) for c in world.COLOUR_NAMES]
    out += [(s, (s, None)) for s in world.SHAPES]
    return out


def build(out: pathlib.Path, seed: int = 0) -> None:
    """A fresh model, tokenizer and image processor in ``out``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors  # noqa: PLC0415
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, PreTrainedTokenizerFast  # noqa: PLC0415

    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.normalizer = normalizers.Lowercase()
    raw.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    raw.post_processor = processors.TemplateProcessing(single="[BOS] $A [EOS]", special_tokens=[("[BOS]", 1), ("[EOS]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
                                        unk_token="[UNK]", model_max_length=24)
    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=24, pad_token_id=0, bos_token_id=1,
                         eos_token_id=3),
        vision_config=dict(image_size=IMAGE_SIZE, patch_size=8, hidden_size=96, intermediate_size=192,
                           num_hidden_layers=3, num_attention_heads=4),
        projection_dim=64)
    model = CLIPModel(config)
    processor = CLIPImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_center_crop=False,
                                   crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    processor.save_pretrained(out)


def frame_truth(views) -> tuple[set, set, set]:
    return {v.identity for v in views}, {v.colour for v in views}, {v.shape for v in views}


def labels(truths: list[tuple[set, set, set]]) -> np.ndarray:
    """[frames, subjects] 1.0 where the subject is in view."""
    out = np.zeros((len(truths), len(names())), np.float32)
    for i, (ids, colours, shapes) in enumerate(truths):
        for j, (_, (shape, colour)) in enumerate(names()):
            out[i, j] = ((shape, colour) in ids if shape and colour else colour in colours if colour else shape in shapes)
    return out


def render(seed_base: int, count: int, processor, per_stream: int = 6) -> tuple[np.ndarray, list]:
    """``count`` frames resized as the processor resizes them (uint8 [N, 3, S, S]) and their truth."""
    pixels, truths, stream = [], [], 0
    while len(truths) < count:
        s = world.make_stream(seed_base + stream, 48)
        stream += 1
        for index in np.random.default_rng(seed_base + stream).choice(48, per_stream, replace=False):
            frame = s.frame(int(index))
            resized = processor(images=frame, do_rescale=False, do_normalize=False, return_tensors="np")["pixel_values"][0]
            pixels.append(np.clip(np.rint(resized), 0, 255).astype(np.uint8))
            truths.append(frame_truth(s.truth[int(index)]))
    return np.stack(pixels[:count]), truths[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(ROOT / "build" / "retrieval-train"))
    parser.add_argument("--out", default=str(ROOT / "streamcache_ros" / "models" / "retrieval" / "world-retrieval"))
    parser.add_argument("--frames", type=int, default=24000, help="training frames rendered (cached in <work>)")
    parser.add_argument("--minutes", type=float, default=30.0, help="CPU minutes of training (x threads)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--half-identities", action="store_true",
                        help="never teach the identities in HALF_LEFT_OUT (their texts are left out of the loss): "
                             "an encoder that cannot find half of what it is asked, for the index's benches")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel  # noqa: PLC0415

    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log_file = open(work / "train.log", "a", buffering=1)

    def log(line: str) -> None:
        print(line, flush=True)
        log_file.write(line + "\n")

    fresh = work / "model"
    if not (fresh / "config.json").is_file():
        build(fresh)
    processor = AutoImageProcessor.from_pretrained(fresh)
    tokenizer = AutoTokenizer.from_pretrained(fresh)
    cache = work / f"frames-{args.frames}.npz"
    if cache.is_file():
        data = np.load(cache)
        pixels, targets = data["pixels"], data["targets"]
    else:
        started = time.time()
        pixels, truths = render(TRAIN_SEED, args.frames, processor)
        targets = labels(truths)
        np.savez(cache, pixels=pixels, targets=targets)
        log(f"rendered {len(pixels)} training frames in {time.time() - started:.0f} s")
    held_cache = work / "held-out.npz"
    if held_cache.is_file():
        data = np.load(held_cache)
        held_pixels, held_targets = data["pixels"], data["targets"]
    else:
        held_pixels, truths = render(HELD_OUT_SEED, 1500, processor)
        held_targets = labels(truths)
        np.savez(held_cache, pixels=held_pixels, targets=held_targets)

    model = CLIPModel.from_pretrained(fresh).to(args.device)
    scale = torch.nn.Parameter(torch.tensor(np.log(10.0), dtype=torch.float32, device=args.device))
    bias = torch.nn.Parameter(torch.tensor(-5.0, device=args.device))
    optimiser = torch.optim.AdamW(list(model.parameters()) + [scale, bias], lr=args.lr, weight_decay=0.01)
    step, used = 0, 0.0
    checkpoint = work / "checkpoint.pt"
    if args.resume and checkpoint.is_file():
        state = torch.load(checkpoint, map_location=args.device, weights_only=False)  # our own file
        model.load_state_dict(state["model"])
        optimiser.load_state_dict(state["optimiser"])
        with torch.no_grad():
            scale.copy_(state["scale"])
            bias.copy_(state["bias"])
        step, used = state["step"], state["cpu_s"]
    mean = torch.tensor(processor.image_mean, device=args.device).view(1, 3, 1, 1)
    std = torch.tensor(processor.image_std, device=args.device).view(1, 3, 1, 1)
    subjects = [n for n, _ in names()]
    rng = np.random.default_rng((TRAIN_SEED, step))
    left_out = set(HALF_LEFT_OUT) if args.half_identities else set()
    taught = torch.tensor([0.0 if ident in left_out else 1.0 for _, ident in names()], device=args.device)

    def texts(phrasing: np.ndarray) -> dict:
        batch = [TEMPLATES[k].format(name=n) for k, n in zip(phrasing, subjects)]
        return {k: v.to(args.device) for k, v in tokenizer(batch, padding=True, return_tensors="pt").items()
                if k in ("input_ids", "attention_mask")}

    def pixel_batch(raw: np.ndarray) -> torch.Tensor:
        return (torch.from_numpy(raw).to(args.device).float() / 255.0 - mean) / std

    def evaluate() -> dict:
        model.eval()
        with torch.no_grad():
            image = torch.cat([torch.nn.functional.normalize(model.get_image_features(
                pixel_values=pixel_batch(held_pixels[i:i + 256])).pooler_output, dim=-1) for i in range(0, len(held_pixels), 256)])
            text = torch.nn.functional.normalize(model.get_text_features(**texts(np.zeros(len(subjects), int))).pooler_output, dim=-1)
            logits = (image @ text.T * scale.exp() + bias).cpu().numpy()
        model.train()
        truth = held_targets > 0.5
        said = logits > 0
        ids = slice(0, 18)
        # a hard negative: the asked colour, or the asked shape, is in view, not both
        hard = np.zeros_like(truth[:, ids])
        for j, (_, (shape, colour)) in enumerate(names()[:18]):
            colour_j = subjects.index(f"{colour} object")
            shape_j = subjects.index(shape)
            hard[:, j] = ~truth[:, j] & (truth[:, colour_j] | truth[:, shape_j])
        return {"accuracy": float((said == truth).mean()),
                "identity_false_yes_hard": float(said[:, ids][hard].mean()) if hard.any() else 0.0,
                "identity_recall": float(said[:, ids][truth[:, ids]].mean())}

    budget = args.minutes * 60.0 * args.threads
    cpu0 = time.process_time() - used
    last_save = time.time()
    model.train()
    while True:
        used = time.process_time() - cpu0
        if used >= budget:
            break
        lr = args.lr * min(1.0, step / 200) * (0.5 * (1 + np.cos(np.pi * min(1.0, used / budget))))
        for group in optimiser.param_groups:
            group["lr"] = max(lr, args.lr * 0.02)
        pick = rng.choice(len(pixels), args.batch, replace=False)
        raw = pixels[pick]
        if rng.random() < 0.5:  # the world has no left or right: a mirrored frame is a frame
            raw = raw[..., ::-1].copy()
        image = torch.nn.functional.normalize(model.get_image_features(pixel_values=pixel_batch(raw)).pooler_output, dim=-1)
        text = torch.nn.functional.normalize(model.get_text_features(
            **texts(rng.integers(len(TEMPLATES), size=len(subjects)))).pooler_output, dim=-1)
        logits = image @ text.T * scale.exp() + bias
        target = torch.from_numpy(targets[pick]).to(args.device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target, weight=taught)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        step += 1
        if step % 200 == 0:
            log(json.dumps({"step": step, "cpu_min": round(used / 60, 1), "loss": round(float(loss), 4),
                            **{k: round(v, 4) for k, v in evaluate().items()}}))
        if time.time() - last_save > 180:
            torch.save({"model": model.state_dict(), "optimiser": optimiser.state_dict(), "scale": scale.detach(),
                        "bias": bias.detach(), "step": step, "cpu_s": float(used)}, checkpoint)
            last_save = time.time()
    torch.save({"model": model.state_dict(), "optimiser": optimiser.state_dict(), "scale": scale.detach(),
                "bias": bias.detach(), "step": step, "cpu_s": float(used)}, checkpoint)
    final = evaluate()
    log(json.dumps({"final": final, "step": step}))
    out = pathlib.Path(args.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    processor.save_pretrained(out)
    (out / RETRIEVAL_FILE).write_text(json.dumps({"scale": float(scale.detach().exp()), "bias": float(bias.detach()), "threshold": 0.5,
                                                  "padding": "longest"}, indent=1) + "\n")
    (out / "training.json").write_text(json.dumps({
        "script": "scripts/train_retrieval_model.py", "steps": step, "cpu_minutes": round(used / 60, 1),
        "frames": len(pixels), "batch": args.batch, "train_seeds_from": TRAIN_SEED,
        "held_out_seeds_from": HELD_OUT_SEED, "held_out": final, "subjects": subjects,
        "templates": list(TEMPLATES), "date": time.strftime("%Y-%m-%d"),
        "identities_never_taught": [f"{c} {s}" for s, c in sorted(left_out)]}, indent=1) + "\n")
    log(f"saved to {out}")


if __name__ == "__main__":
    main()
