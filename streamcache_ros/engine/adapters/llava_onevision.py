"""LLaVA-OneVision: 1D RoPE (Qwen2 language model), one frame is one stream unit.

Frames are resized to the vision tower's square input, rescaled and normalised as the
LLaVA-OneVision video processor does (that processor needs torchvision, which is not usable next to
the CPU torch build), then the model's own ``get_video_features`` runs the SigLIP tower, the
projector and the 2x2 bilinear pooling. docs/hermes.md §4.1 / D9: no image_newline token is cached.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

from ..cache import FamilyTraits
from ..stream.layout import sequential_positions
from .base import ModelAdapter, VisionEncoder, VisionInputs

# 1D RoPE; HERMES's mid-layer schedule of the LLaVA reference, omega = 1 - 0.9p and k = 20 - 19.5p,
# and its rounding of the guidance attention after the float32 softmax (docs/hermes.md §6, §7)
TRAITS = FamilyTraits(rope_layout="1d", presets={"hermes": {"mid_omega": (1.0, 0.9), "mid_k": (20.0, 19.5),
                                                            "score_rounding": "softmax"}})


def video_features(model, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    config = model.config
    pixels = tensors["pixel_values_videos"]
    # pixels positional: the keyword is pixel_values in transformers 5.17, pixel_values_videos in 5.24
    out = model.model.get_video_features(
        pixels.to(model.device, model.dtype),
        vision_feature_layer=config.vision_feature_layer,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
    )
    feats = getattr(out, "pooler_output", out)
    feats = feats.reshape(-1, feats.shape[-1])
    # transformers appends one image_newline per video; the reference caches none (docs/hermes.md, D9)
    frames, side = pixels.shape[1], config.vision_config.image_size // config.vision_config.patch_size
    if feats.shape[0] == frames * math.ceil(side / 2) ** 2 + 1:
        feats = feats[:-1]
    return feats


class LlavaTorchVisionEncoder(VisionEncoder):
    def __init__(self, model):
        self.model = model

    @torch.inference_mode()
    def __call__(self, tensors):
        return video_features(self.model, tensors)


class LlavaOnevisionAdapter(ModelAdapter):
    family = "llava_onevision"
    traits = TRAITS
    setting_aliases = {"hermes.llava_mid_omega": "hermes.mid_omega", "hermes.llava_mid_k": "hermes.mid_k"}
    # docs/hermes.md §1: the LLaVA system prompt (note the space before "\n", as the reference has it)
    system_prompt = "<|im_start|>system \nYou are a helpful assistant.<|im_end|><|im_start|>user "
    frames_per_unit = 1

    def __init__(self, model, tokenizer, image_processor, model_id, attention="auto", sample_fps=1.0,
                 options_prompt="letter"):
        super().__init__(model, tokenizer, image_processor, model_id, attention, options_prompt)
        vision = model.config.vision_config
        self.image_size = int(vision.image_size)
        side = self.image_size // int(vision.patch_size)
        self.tokens_per_frame = math.ceil(side / 2) ** 2
        ip = image_processor
        self.mean = np.asarray(ip.image_mean, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(ip.image_std, dtype=np.float32).reshape(3, 1, 1)
        self.rescale = float(getattr(ip, "rescale_factor", 1 / 255))
        self.resample = int(getattr(ip, "resample", Image.BICUBIC))

    def input_size(self, height: int, width: int) -> tuple[int, int]:
        return self.image_size, self.image_size  # the tower's square input (normalise)

    def _text_model(self):
        return self.model.model.language_model

    def _torch_vision_encoder(self):
        return LlavaTorchVisionEncoder(self.model)

    def vision_features(self, tensors):
        return video_features(self.model, tensors)

    def normalise(self, frame: np.ndarray) -> np.ndarray:
        """[H, W, 3] uint8 -> [3, S, S] float32, the vision tower's input."""
        size = (self.image_size, self.image_size)
        if frame.shape[:2] != size:
            frame = np.asarray(Image.fromarray(frame).resize(size, self.resample))
        pixels = frame.astype(np.float32).transpose(2, 0, 1) * self.rescale
        return (pixels - self.mean) / self.std

    def preprocess(self, frames):
        if not frames:
            raise ValueError("no frames")
        pixels = torch.from_numpy(np.stack([self.normalise(f) for f in frames]))[None]
        side = int(math.isqrt(self.tokens_per_frame))
        return VisionInputs({"pixel_values_videos": pixels}, num_units=len(frames),
                            tokens_per_unit=self.tokens_per_frame,
                            unit_frames=[(i,) for i in range(len(frames))], grid=(len(frames), side, side))

    def batch_vision_inputs(self, inputs):
        # frames are encoded and pooled one by one: one long video gives each frame's own tokens
        return {"pixel_values_videos": torch.cat([i.tensors["pixel_values_videos"] for i in inputs], dim=1)}

    def chunk_rel_positions(self, inputs):
        return sequential_positions(inputs.num_units * inputs.tokens_per_unit, self.device)
