"""Qwen2.5-VL: 3D M-RoPE, a temporal patch of 2 frames is one stream unit.

Video inputs are assembled here from the image processor's output, because transformers' video
processors need torchvision (notes/models_offline.md): each frame is normalised and patchified by
the image processor (which repeats a still image over the temporal patch), and the two frames of a
unit are interleaved on the temporal axis of every patch, as the video processor lays them out.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

from .base import ModelAdapter, VisionEncoder, VisionInputs


class QwenTorchVisionEncoder(VisionEncoder):
    def __init__(self, model):
        self.visual = model.model.visual

    @torch.inference_mode()
    def __call__(self, tensors):
        pixels = tensors["pixel_values_videos"].to(self.visual.device, self.visual.dtype)
        out = self.visual(pixels, grid_thw=tensors["video_grid_thw"].to(self.visual.device))
        return getattr(out, "pooler_output", out)


class Qwen25VLAdapter(ModelAdapter):
    family = "qwen2_5_vl"
    # hermes_spec §1: the Qwen system prompt (the prefix, kept forever)
    system_prompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"

    def __init__(self, model, tokenizer, image_processor, model_id, attention="auto", sample_fps=1.0):
        super().__init__(model, tokenizer, image_processor, model_id, attention)
        vision = model.config.vision_config
        self.patch_size = int(vision.patch_size)
        self.merge_size = int(vision.spatial_merge_size)
        self.frames_per_unit = int(vision.temporal_patch_size)
        # hermes_spec §4.2 / transformers get_rope_index: t advances (temporal_patch / fps) ·
        # tokens_per_second per temporal patch
        self.t_stride = self.frames_per_unit / float(sample_fps) * float(vision.tokens_per_second)

    def _text_model(self):
        return self.model.model.language_model

    def _torch_vision_encoder(self):
        return QwenTorchVisionEncoder(self.model)

    def _frame_patches(self, frame: np.ndarray) -> tuple[torch.Tensor, int, int]:
        """[gh·gw, C, P, P] normalised patches of one frame, in the processor's patch order."""
        out = self.image_processor(images=[frame], return_tensors="pt")
        _, gh, gw = (int(x) for x in out["image_grid_thw"][0])
        patches = out["pixel_values"].view(gh * gw, 3, self.frames_per_unit, self.patch_size, self.patch_size)
        return patches[:, :, 0], gh, gw

    def preprocess(self, frames):
        if not frames:
            raise ValueError("no frames")
        height, width = frames[0].shape[:2]
        # every frame of a chunk must share one grid: later frames follow the first frame's size
        frames = [f if f.shape[:2] == (height, width)
                  else np.asarray(Image.fromarray(f).resize((width, height), Image.BICUBIC)) for f in frames]
        per_frame = [self._frame_patches(f) for f in frames]
        _, gh, gw = per_frame[0]
        units, unit_frames = [], []
        for start in range(0, len(frames), self.frames_per_unit):
            members = list(range(start, min(start + self.frames_per_unit, len(frames))))
            # an odd last frame fills its temporal patch by repetition, as the image path does
            padded = members + [members[-1]] * (self.frames_per_unit - len(members))
            units.append(torch.stack([per_frame[i][0] for i in padded], dim=2))  # [gh·gw, C, T, P, P]
            unit_frames.append(tuple(members))
        pixels = torch.cat(units).reshape(len(units) * gh * gw, -1)
        grid = torch.tensor([[len(units), gh, gw]], dtype=torch.long)
        rows, cols = gh // self.merge_size, gw // self.merge_size
        return VisionInputs({"pixel_values_videos": pixels, "video_grid_thw": grid}, num_units=len(units),
                            tokens_per_unit=rows * cols, unit_frames=unit_frames, grid=(len(units), rows, cols))

    def chunk_rel_positions(self, inputs):
        units, rows, cols = inputs.grid
        t = torch.tensor([math.floor(k * self.t_stride) for k in range(units)], dtype=torch.float32)
        t = t.view(units, 1, 1).expand(units, rows, cols)
        h = torch.arange(rows, dtype=torch.float32).view(1, rows, 1).expand(units, rows, cols)
        w = torch.arange(cols, dtype=torch.float32).view(1, 1, cols).expand(units, rows, cols)
        return torch.stack([t.reshape(-1), h.reshape(-1), w.reshape(-1)]).to(self.device)
