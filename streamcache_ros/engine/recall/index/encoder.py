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
0.25 unless the file says otherwise (docs/archive.md "The index"). Whatever they say, ``calibrate``
checks them on the calibration set the node ships, and fits them when they fail there
(calibration.py; docs/archive.md "Calibrating the index").

An encoder is known by its ``identity``: its folder's name and a hash of what makes its vectors
(weights, config, processor, tokenizer; not its scale and bias), so two models in folders of one
name are never taken for one index.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import pathlib
from dataclasses import dataclass

import numpy as np
import torch

from ...errors import ConfigError
from .calibration import Calibration, CalibrationSet, choose, fit, own

RETRIEVAL_FILE = "streamcache_retrieval.json"
# what makes an encoder's vectors: hashed into its identity (its scale and bias are not: they score)
IDENTITY_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "preprocessor_config.json",
                  "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "spiece.model")
log = logging.getLogger("streamcache_ros.archive")


@dataclass
class RetrievalSettings:
    scale: float = 10.0
    bias: float = -2.5
    threshold: float = 0.5  # a frame is a candidate when its probability reaches this
    min_run: int = 2  # ... in a run of this many consecutive frames at least (ranking.sightings)
    padding: str = "longest"  # SigLIP was trained on text padded to its full length: "max_length"
    # the operator's word that scale and bias were calibrated on this robot's own frames (a real
    # encoder is checked on the shape world, which says little of its threshold on real pictures)
    calibrated_on: str = ""
    calibration: dict | None = None  # the last calibration's result, with what it was computed for


def _features(output) -> torch.Tensor:
    """transformers 4 returns the projected features, 5 a model output holding them."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class RetrievalEncoder:
    def __init__(self, model, image_processor, tokenizer, settings: RetrievalSettings, model_id: str,
                 identity: str = ""):
        self.model, self.image_processor, self.tokenizer = model.eval(), image_processor, tokenizer
        self.settings, self.model_id = settings, model_id
        self.identity = identity or model_id
        self.device = next(model.parameters()).device
        self.calibration: Calibration | None = None  # set by ``calibrate``
        self.trusted = False  # whether its "nothing here" may be taken as an answer (``calibrate``)

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
        except (OSError, ValueError, KeyError, RuntimeError) as err:  # RuntimeError: weights that do not fit
            raise ConfigError("retrieval_model_path", f"'{path}' cannot be loaded: {str(err).splitlines()[0]}") from None
        if not (hasattr(model, "get_image_features") and hasattr(model, "get_text_features")):
            raise ConfigError("retrieval_model_path", f"'{path}' holds a {type(model).__name__}, not a dual encoder "
                              "(CLIP, SigLIP or the bundled world-retrieval)")
        settings = cls._settings(folder, model)
        return cls(model, image_processor, tokenizer, settings, folder.name, f"{folder.name}@{content_hash(folder)}")

    @staticmethod
    def _settings(folder: pathlib.Path, model) -> RetrievalSettings:
        saved = folder / RETRIEVAL_FILE
        if saved.is_file():
            try:
                return RetrievalSettings(**json.loads(saved.read_text()))
            except (ValueError, TypeError) as err:
                raise ConfigError("retrieval_model_path", f"'{saved}' is not a retrieval settings file: {err}") from None
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

    def calibrate(self, calibration_set, shape_world: bool) -> Calibration:
        """Check the scale and bias on ``calibration_set``: kept when they meet calibration.py's
        targets there, else fitted to it. ``shape_world``: the node's frames are the shape world's
        (a bundled world model), so the check says how the index does on them; otherwise it is
        trusted only where ``calibrated_on`` names the operator's own calibration. The result is
        reused while the encoder, its scale and bias and the set are the same (kept with the
        settings in ``calibration``, which a folder may ship)."""
        if not isinstance(calibration_set, CalibrationSet):  # a path: read only when the cache does not serve
            path = pathlib.Path(calibration_set)
            calibration_set = _Lazy(path.name, lambda: CalibrationSet.load(path))
        key = {"identity": self.identity, "set": calibration_set.name, "scale": self.settings.scale,
               "bias": self.settings.bias, "threshold": self.settings.threshold}
        cached = self.settings.calibration
        if cached and cached.get("for") == key:
            calibration = Calibration(**cached["result"])
        else:
            calibration_set = calibration_set.load() if isinstance(calibration_set, _Lazy) else calibration_set
            vectors = self.embed_frames(calibration_set.frames)
            cosines = vectors @ self.embed_texts(calibration_set.texts).T
            mine = own(cosines, calibration_set.truth, self.cosine_at(self.settings.threshold), self.settings.scale)
            calibration = choose(mine, fit(cosines, calibration_set.truth))
            self.settings.calibration = {"for": key, "result": calibration.to_dict()}
        if calibration.source == "fitted":  # P(yes) crosses the threshold where the set says
            self.settings = dataclasses.replace(self.settings, scale=calibration.slope, bias=calibration.bias)
        self.calibration = calibration
        self.trusted = calibration.trusted and (shape_world or bool(self.settings.calibrated_on))
        return calibration

    def save_settings(self, folder: str | pathlib.Path) -> None:
        """The scale, bias and last calibration into ``folder``'s RETRIEVAL_FILE (a bundled encoder
        ships its calibration, so the node need not compute it at every start)."""
        (pathlib.Path(folder) / RETRIEVAL_FILE).write_text(json.dumps(dataclasses.asdict(self.settings), indent=1) + "\n")

    def describe(self) -> str:
        """One line for the log: which index, and how far its answers can be trusted."""
        calibration = self.calibration
        if calibration is None:
            return f"index {self.identity}: not calibrated"
        how = ("its own scale and bias" if calibration.source == "own" else
               f"scale and bias fitted to the calibration set (its own: {calibration.replaced})")
        trust = ("trusted: a window it finds nothing in is answered not found" if self.trusted else
                 "not trusted: a window it finds nothing in is searched further, and an answer that could not "
                 "read all of it says so (search_complete false)")
        return f"index {self.identity}: {how}; {calibration.describe()}; {trust}"

    def cosine_at(self, probability: float) -> float:
        """The cosine at which ``probability`` is reached (the threshold in the vectors' units)."""
        p = min(max(probability, 1e-6), 1 - 1e-6)
        return (math.log(p / (1 - p)) - self.settings.bias) / self.settings.scale


def content_hash(folder: pathlib.Path) -> str:
    """12 hex digits of a sha256 over the files that make an encoder's vectors (IDENTITY_FILES)."""
    digest = hashlib.sha256()
    for name in IDENTITY_FILES:
        path = folder / name
        if path.is_file():
            digest.update(name.encode())
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:12]


@dataclass
class _Lazy:
    """A calibration set named, read only when needed."""

    name: str
    read: object

    def load(self) -> CalibrationSet:
        return self.read()
