"""Qwen2.5-VL: 3D M-RoPE, a temporal patch of 2 frames is one stream unit.

Video inputs are assembled here from the image processor's output, because transformers' video
processors need torchvision, which cannot load next to the CPU torch build: each frame is normalised and patchified by
the image processor (which repeats a still image over the temporal patch), and the two frames of a
unit are interleaved on the temporal axis of every patch, as the video processor lays them out.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from ..cache import FamilyTraits
from ..stream.layout import mrope_chunk_positions, padded_members, unit_members
from .base import ModelAdapter, VisionEncoder, VisionInputs

# M-RoPE (t, h, w); HERMES's mid-layer schedule of the Qwen reference, omega = 0.75 - 0.6p and
# k = 20 - 12p, and its fp16 rounding of the guidance logits (docs/hermes.md §6, §7)
TRAITS = FamilyTraits(rope_layout="mrope", presets={"hermes": {"mid_omega": (0.75, 0.6), "mid_k": (20.0, 12.0),
                                                               "score_rounding": "logits"}})


def video_features(visual, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    pixels = tensors["pixel_values_videos"].to(visual.device, visual.dtype)
    out = visual(pixels, grid_thw=tensors["video_grid_thw"].to(visual.device))
    return getattr(out, "pooler_output", out)


class QwenTorchVisionEncoder(VisionEncoder):
    def __init__(self, model):
        self.visual = model.model.visual

    @torch.inference_mode()
    def __call__(self, tensors):
        return video_features(self.visual, tensors)


class Qwen25VLAdapter(ModelAdapter):
    family = "qwen2_5_vl"
    traits = TRAITS
    setting_aliases = {"hermes.qwen_mid_omega": "hermes.mid_omega", "hermes.qwen_mid_k": "hermes.mid_k"}
    # docs/hermes.md §1: the Qwen system prompt (the prefix, kept forever)
    system_prompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"

    def __init__(self, model, tokenizer, image_processor, model_id, attention="auto", sample_fps=1.0,
                 options_prompt="letter"):
        super().__init__(model, tokenizer, image_processor, model_id, attention, options_prompt)
        vision = model.config.vision_config
        self.patch_size = int(vision.patch_size)
        self.merge_size = int(vision.spatial_merge_size)
        self.frames_per_unit = int(vision.temporal_patch_size)
        self.set_sample_fps(sample_fps)

    def set_sample_fps(self, sample_fps: float) -> None:
        # docs/hermes.md §4.2 / transformers get_rope_index: t advances (temporal_patch / fps) ·
        # tokens_per_second per temporal patch, within a chunk (chunks start at max + 1 over all axes)
        tokens_per_second = float(self.model.config.vision_config.tokens_per_second)
        self.t_stride = self.frames_per_unit / float(sample_fps) * tokens_per_second

    def _text_model(self):
        return self.model.model.language_model

    def _torch_vision_encoder(self):
        return QwenTorchVisionEncoder(self.model)

    def vision_features(self, tensors):
        return video_features(self.model.model.visual, tensors)

    def input_size(self, height: int, width: int) -> tuple[int, int]:
        """The processor's resize of a frame of this size (within its pixel bounds, to whole merged
        patches), read once per size from its grid."""
        sizes = self.__dict__.setdefault("_input_sizes", {})
        if (height, width) not in sizes:
            grid = self.image_processor(images=[np.zeros((height, width, 3), np.uint8)],
                                        return_tensors="pt")["image_grid_thw"][0]
            sizes[(height, width)] = (int(grid[1]) * self.patch_size, int(grid[2]) * self.patch_size)
        return sizes[(height, width)]

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
        unit_frames = unit_members(len(frames), self.frames_per_unit)
        units = [torch.stack([per_frame[i][0] for i in padded_members(members, self.frames_per_unit)], dim=2)
                 for members in unit_frames]  # each [gh·gw, C, T, P, P]
        pixels = torch.cat(units).reshape(len(units) * gh * gw, -1)
        grid = torch.tensor([[len(units), gh, gw]], dtype=torch.long)
        rows, cols = gh // self.merge_size, gw // self.merge_size
        return VisionInputs({"pixel_values_videos": pixels, "video_grid_thw": grid}, num_units=len(units),
                            tokens_per_unit=rows * cols, unit_frames=unit_frames, grid=(len(units), rows, cols))

    def batch_vision_inputs(self, inputs):
        # each chunk a video of its own: the tower's attention keeps to its own grid
        return {"pixel_values_videos": torch.cat([i.tensors["pixel_values_videos"] for i in inputs]),
                "video_grid_thw": torch.cat([i.tensors["video_grid_thw"] for i in inputs])}

    def chunk_rel_positions(self, inputs):
        return mrope_chunk_positions(*inputs.grid, self.t_stride, self.device)
