"""Dual encoders other than the bundled one, for the tests and the index's benchmarks (real weights
cannot be downloaded here): tiny random CLIP and SigLIP of real classes and configs, and the bundled
one with its scale or bias set far off (docs/archive.md "Calibrating the index")."""
from __future__ import annotations

import json
import pathlib
import shutil

from ..engine.adapters.models import RETRIEVAL_DIR, WORLD_RETRIEVAL
from ..engine.recall.index.encoder import RETRIEVAL_FILE


def tiny_dual_encoder(kind: str, folder: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """A random CLIP (``kind`` "clip") or SigLIP ("siglip") of real classes and configs, with the
    bundled tokenizer's words, saved in ``folder``."""
    import torch  # noqa: PLC0415
    from transformers import (AutoTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel, SiglipConfig,  # noqa: PLC0415
                              SiglipImageProcessor, SiglipModel)

    bundled = RETRIEVAL_DIR / WORLD_RETRIEVAL
    tokenizer = AutoTokenizer.from_pretrained(bundled)
    text = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, max_position_embeddings=24, pad_token_id=0, bos_token_id=1, eos_token_id=3)
    vision = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2)
    torch.manual_seed(seed)
    if kind == "siglip":
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
        processor = SiglipImageProcessor(size={"height": 32, "width": 32})
    else:
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
        processor = CLIPImageProcessor(size={"height": 32, "width": 32}, do_center_crop=False)
    folder = pathlib.Path(folder)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def shifted_encoder(folder: pathlib.Path, **settings) -> pathlib.Path:
    """The bundled encoder in ``folder`` with ``settings`` (``scale``, ``bias``) set as given, its
    weights as they are and its shipped calibration dropped."""
    folder = pathlib.Path(folder)
    shutil.copytree(RETRIEVAL_DIR / WORLD_RETRIEVAL, folder)
    saved = json.loads((folder / RETRIEVAL_FILE).read_text())
    saved.update(settings, calibration=None)
    (folder / RETRIEVAL_FILE).write_text(json.dumps(saved))
    return folder
