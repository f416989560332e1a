"""A dual encoder through transformers: frames and questions into one space.

    encoder = RetrievalEncoder.load("streamcache_ros/models/world-retrieval")
    vectors = encoder.embed_frames([rgb, rgb, ...])      # [frames, dim] float32, unit length
    query = encoder.embed_text("Did you see a red circle?")  # [dim]
    p = encoder.probability(vectors @ query)             # P(the frame shows what the text names)

Any transformers model with ``get_image_features`` and ``get_text_features`` serves: CLIP and
SigLIP weights through ``retrieval_model_path``, and the bundled shape-world one (a small CLIPModel
trained by scripts/train_retrieval_model.py). Similarity becomes a probability through a sigmoid of
``scale * cosine + bias``: the bundled model was trained with exactly that (a SigLIP loss) and keeps
its two numbers in ``streamcache_retrieval.json``; SigLIP weights carry their own; CLIP weights,
trained with a softmax, get ``scale`` from the model and a bias that puts the threshold at a cosine of
0.25 unless the file says otherwise (docs/archive.md "The index").
"""
from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass

import numpy as np
import torch

from ...errors import ConfigError

RETRIEVAL_FILE = "streamcache_retrieval.json"


@dataclass
class RetrievalSettings:
    scale: float = 10.0
    bias: float = -2.5
    threshold: float = 0.5  # a frame is a candidate when its probability reaches this
    min_run: int = 2  # ... in a run of this many consecutive frames at least (ranking.sightings)
    padding: str = "longest"  # SigLIP was trained on text padded to its full length: "max_length"


def _features(output) -> torch.Tensor:
    """transformers 4 returns the projected features, 5 a model output holding them."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class RetrievalEncoder:
    def __init__(self, model, image_processor, tokenizer, settings: RetrievalSettings, model_id: str):
        self.model, self.image_processor, self.tokenizer = model.eval(), image_processor, tokenizer
        self.settings, self.model_id = settings, model_id
        self.device = next(model.parameters()).device

    @classmethod
    def load(cls, path: str, device: str = "cpu") -> "RetrievalEncoder":
        """The dual encoder saved in ``path``; ConfigError naming the path when it is not one."""
        from transformers import AutoImageProcessor, AutoModel, AutoTokenizer  # noqa: PLC0415

        folder = pathlib.Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise ConfigError("retrieval_model_path", f"'{path}' is not a model folder (no config.json there)")
        try:
            model = AutoModel.from_pretrained(str(folder)).to(device)
            image_processor = AutoImageProcessor.from_pretrained(str(folder))
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError("retrieval_model_path", f"'{path}' cannot be loaded: {err}") from None
        if not (hasattr(model, "get_image_features") and hasattr(model, "get_text_features")):
            raise ConfigError("retrieval_model_path", f"'{path}' holds a {type(model).__name__}, not a dual encoder "
                              "(CLIP, SigLIP or the bundled world-retrieval)")
        settings = cls._settings(folder, model)
        return cls(model, image_processor, tokenizer, settings, folder.name)

    @staticmethod
    def _settings(folder: pathlib.Path, model) -> RetrievalSettings:
        saved = folder / RETRIEVAL_FILE
        if saved.is_file():
            return RetrievalSettings(**json.loads(saved.read_text()))
        scale = float(model.logit_scale.detach().exp()) if hasattr(model, "logit_scale") else 10.0
        if hasattr(model, "logit_bias"):  # SigLIP: trained as a sigmoid already
            return RetrievalSettings(scale, float(model.logit_bias.detach()), padding="max_length")
        return RetrievalSettings(scale, -0.25 * scale)

    @property
    def dim(self) -> int:
        config = self.model.config
        return int(getattr(config, "projection_dim", 0) or config.text_config.hidden_size)

    @torch.inference_mode()
    def embed_frames(self, frames: list[np.ndarray], batch: int = 64) -> np.ndarray:
        """Unit vectors [len(frames), dim] of RGB uint8 frames [H, W, 3] of any size."""
        out = []
        for start in range(0, len(frames), batch):
            pixels = self.image_processor(images=list(frames[start:start + batch]), return_tensors="pt")
            features = _features(self.model.get_image_features(pixel_values=pixels["pixel_values"].to(self.device)))
            out.append(torch.nn.functional.normalize(features.float(), dim=-1).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)

    @torch.inference_mode()
    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Unit vectors [len(texts), dim]."""
        tokens = self.tokenizer(list(texts), padding=self.settings.padding, truncation=True, return_tensors="pt")
        tokens = {k: v.to(self.device) for k, v in tokens.items() if k in ("input_ids", "attention_mask")}
        if self.settings.padding == "max_length":
            tokens.pop("attention_mask", None)  # SigLIP reads its padding as tokens
        features = _features(self.model.get_text_features(**tokens))
        return torch.nn.functional.normalize(features.float(), dim=-1).cpu().numpy()

    def embed_text(self, text: str) -> np.ndarray:
        return self.embed_texts([text])[0]

    def probability(self, cosine: np.ndarray) -> np.ndarray:
        """P(the frame shows what the text names) from the cosine of their vectors."""
        logits = self.settings.scale * np.asarray(cosine, dtype=np.float64) + self.settings.bias
        return 1.0 / (1.0 + np.exp(-np.clip(logits, -60, 60)))

    def cosine_at(self, probability: float) -> float:
        """The cosine at which ``probability`` is reached (the threshold in the vectors' units)."""
        p = min(max(probability, 1e-6), 1 - 1e-6)
        return (math.log(p / (1 - p)) - self.settings.bias) / self.settings.scale
