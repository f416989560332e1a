"""Export a model's vision path (preprocessed pixels -> the embeddings the language model takes) to ONNX.

What each exported file fixes and what stays dynamic (also written into its sidecar):

- Qwen2.5-VL: the vision transformer with its patch merger. Its attention never crosses a temporal
  patch (full-attention blocks attend within one temporal patch, window blocks within a window of
  one), so a chunk is a batch of independent units: the graph takes ``pixel_values_videos``
  [units · gh · gw, C · T · P · P] with the number of units dynamic. The frame grid (gh, gw) is fixed
  per file: window indices and rotary positions depend on it through Python control flow, so they are
  computed here once, by transformers' own helpers, and baked in as constants. ``video_grid_thw`` is
  therefore not a graph input; OnnxVisionEncoder checks it against the fixed grid before each run.
- LLaVA-OneVision: SigLIP tower up to ``vision_feature_layer`` with the select strategy, projector and
  the 2x2 bilinear pooling, through the model's own ``get_video_features``. The graph takes
  ``pixel_values_videos`` [1, frames, 3, S, S] with frames dynamic; S is the tower's image size
  (the adapter always resizes to it). The image_newline token is dropped (docs/hermes.md, D9), as
  LlavaTorchVisionEncoder does.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .base import ModelAdapter, config_fingerprint

SIDECAR_FORMAT = 1
ONNX_NAME = "vision_encoder.onnx"
DEFAULT_OPSET = 18
# Fields of a config that change with how a model is loaded, not with what it is: an encoder exported
# in float32 serves a language model loaded in bfloat16 on a GPU.
RUNTIME_CONFIG_KEYS = ("dtype", "torch_dtype", "_attn_implementation", "attn_implementation")


def encoder_config_hash(adapter: ModelAdapter) -> str:
    """The model's config hash without the load-time fields (dtype, attention implementation)."""
    return config_fingerprint(adapter.model.config, ignore=RUNTIME_CONFIG_KEYS)


def sidecar_path(onnx_path: str | os.PathLike) -> pathlib.Path:
    return pathlib.Path(onnx_path).with_suffix(".json")


class QwenVisionGraph(nn.Module):
    """Qwen2.5-VL's vision tower and merger over a batch of temporal patches of one fixed grid.

    Same arithmetic as ``Qwen2_5_VisionTransformerPretrainedModel.forward`` with the per-unit
    attention segments made a batch axis: window attention gathers each window (padded to the
    longest, padding masked) and scatters back; full attention spans one unit.
    """

    def __init__(self, visual: nn.Module, grid_hw: tuple[int, int]):
        super().__init__()
        from transformers.vision_utils import get_vision_position_ids, get_vision_window_index  # noqa: PLC0415

        self.visual = visual
        gh, gw = grid_hw
        cfg = visual.config
        self.unit_patches = gh * gw
        merge_unit = visual.spatial_merge_unit
        grid = torch.tensor([[1, gh, gw]])
        window_index, cu_windows = get_vision_window_index(
            grid, spatial_merge_size=visual.spatial_merge_size, window_size=visual.window_size,
            patch_size=visual.patch_size)
        # window_index orders merge groups; patches move with their group
        patch_order = (window_index[:, None] * merge_unit + torch.arange(merge_unit)).reshape(-1)
        self.register_buffer("patch_order", patch_order, persistent=False)
        self.register_buffer("group_restore", torch.argsort(window_index), persistent=False)
        position_ids = get_vision_position_ids(grid, visual.spatial_merge_size)
        dummy = torch.zeros(self.unit_patches, cfg.hidden_size)
        cos, sin = visual.rotary_pos_emb(dummy, position_ids)
        self.register_buffer("cos", cos.float()[patch_order], persistent=False)
        self.register_buffer("sin", sin.float()[patch_order], persistent=False)
        for kind, bounds in (("window", cu_windows.tolist()), ("full", [0, self.unit_patches])):
            gather, valid, scatter = _segments(bounds)
            self.register_buffer(f"{kind}_gather", gather, persistent=False)
            self.register_buffer(f"{kind}_scatter", scatter, persistent=False)
            # a padded window needs a mask; decided here, where the tensor has values (not in tracing)
            self.register_buffer(f"{kind}_mask", None if bool(valid.all()) else valid[:, None, None, :],
                                 persistent=False)
        self.full_blocks = {int(i) for i in visual.fullatt_block_indexes}

    def forward(self, pixel_values_videos: torch.Tensor) -> torch.Tensor:
        visual = self.visual
        hidden = visual.patch_embed(pixel_values_videos)  # [units·S, E]
        hidden = hidden.reshape(-1, self.unit_patches, hidden.shape[-1])[:, self.patch_order]
        for index, block in enumerate(visual.blocks):
            segments = ((self.full_gather, self.full_mask, self.full_scatter) if index in self.full_blocks
                        else (self.window_gather, self.window_mask, self.window_scatter))
            hidden = hidden + self._attention(block.attn, block.norm1(hidden), *segments)
            hidden = hidden + block.mlp(block.norm2(hidden))
        merged = visual.merger(hidden.reshape(-1, hidden.shape[-1]))  # [units·S/4, D]
        merged = merged.reshape(-1, self.group_restore.shape[0], merged.shape[-1])[:, self.group_restore]
        return merged.reshape(-1, merged.shape[-1])

    def _attention(self, attn, hidden, gather, mask, scatter):
        units, length, dim = hidden.shape
        heads = attn.num_heads
        qkv = attn.qkv(hidden).reshape(units, length, 3, heads, -1).permute(2, 0, 1, 3, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # [units, S, heads, d]
        q, k = _rotate(q, self.cos, self.sin), _rotate(k, self.cos, self.sin)
        windows, width = gather.shape
        # [units · windows, heads, width, d]: the exporter's attention takes 4D tensors only
        q, k, v = (x[:, gather.reshape(-1)].reshape(units * windows, width, heads, -1).transpose(1, 2)
                   for x in (q, k, v))
        if mask is not None:
            mask = mask.expand(units, windows, 1, 1, width).reshape(units * windows, 1, 1, width)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
        out = out.transpose(1, 2).reshape(units, windows * width, dim)[:, scatter]
        return attn.proj(out)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_pos_emb_vision: rotate in float32, cast back."""
    dtype = x.dtype
    x = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos[:, None] + rotated * sin[:, None]).to(dtype)


def _segments(bounds: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contiguous segments [bounds[i], bounds[i+1]) of a sequence as a padded batch: gather indices
    [segments, width], which of them are real, and for each position its index in the flat batch."""
    lengths = [b - a for a, b in zip(bounds, bounds[1:]) if b > a]
    starts = [a for a, b in zip(bounds, bounds[1:]) if b > a]
    width = max(lengths)
    offsets = torch.arange(width)
    valid = offsets[None, :] < torch.tensor(lengths)[:, None]
    gather = torch.where(valid, torch.tensor(starts)[:, None] + offsets[None, :], 0)
    scatter = torch.cat([i * width + torch.arange(n) for i, n in enumerate(lengths)])
    return gather, valid, scatter


class LlavaVisionGraph(nn.Module):
    """LLaVA-OneVision's get_video_features (tower, projector, pooling) without the image_newline."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        vision = model.config.vision_config
        side = vision.image_size // vision.patch_size
        self.tokens_per_frame = math.ceil(side / 2) ** 2

    def forward(self, pixel_values_videos: torch.Tensor) -> torch.Tensor:
        cfg = self.model.config
        # positional: the keyword is pixel_values in transformers 5.17, pixel_values_videos in 5.24
        out = self.model.model.get_video_features(
            pixel_values_videos, vision_feature_layer=cfg.vision_feature_layer,
            vision_feature_select_strategy=cfg.vision_feature_select_strategy)
        feats = getattr(out, "pooler_output", out)
        feats = feats.reshape(-1, feats.shape[-1])
        return feats[: pixel_values_videos.shape[1] * self.tokens_per_frame]


def vision_graph(adapter: ModelAdapter, frame_size: tuple[int, int]) -> tuple[nn.Module, dict]:
    """The family's export module and what the export fixes; ``frame_size`` is (width, height)."""
    width, height = frame_size
    probe = adapter.preprocess([np.zeros((height, width, 3), np.uint8)] * adapter.frames_per_unit)
    if adapter.family == "qwen2_5_vl":
        _, gh, gw = (int(x) for x in probe.tensors["video_grid_thw"][0])
        graph = QwenVisionGraph(adapter.model.model.visual, (gh, gw))
        patch_dim = int(probe.tensors["pixel_values_videos"].shape[1])
        fixed = {"frame_size": [width, height], "grid_hw": [gh, gw], "patch_dim": patch_dim,
                 "frames_per_unit": adapter.frames_per_unit,
                 "note": "the patch grid (gh, gw) is fixed by the frame size; the number of temporal "
                         "patches (units) per chunk is dynamic; video_grid_thw is checked, not fed"}
    elif adapter.family == "llava_onevision":
        graph = LlavaVisionGraph(adapter.model)
        size = adapter.image_size
        fixed = {"image_size": size, "batch": 1,
                 "note": "frames are resized to the tower's image size by the adapter; the number of "
                         "frames per chunk is dynamic"}
    else:  # pragma: no cover - ADAPTERS lists the families
        raise ValueError(f"no ONNX export for family '{adapter.family}'")
    return graph.eval(), fixed


def _example(adapter: ModelAdapter, frame_size: tuple[int, int], units: int) -> dict[str, torch.Tensor]:
    width, height = frame_size
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
              for _ in range(units * adapter.frames_per_unit)]
    return adapter.preprocess(frames).tensors


def export_vision_encoder(adapter: ModelAdapter, out_dir: str | os.PathLike, frame_size=(640, 480),
                          opset: int = DEFAULT_OPSET) -> pathlib.Path:
    """Write ``out_dir/vision_encoder.onnx`` (float32) and its sidecar ``vision_encoder.json``;
    returns the ONNX path. The adapter must hold its model in float32 on the CPU."""
    if adapter.dtype != torch.float32 or adapter.device.type != "cpu":
        raise ValueError("export from a float32 model on the CPU (load_adapter(..., device='cpu', "
                         "dtype='float32'))")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    onnx_path = out / ONNX_NAME
    graph, fixed = vision_graph(adapter, frame_size)
    # three units: a dynamic size the exporter cannot confuse with 1 or with another dimension
    example = _example(adapter, frame_size, units=3)
    pixels = example["pixel_values_videos"]
    units = torch.export.Dim("units", min=1, max=4096)
    if adapter.family == "qwen2_5_vl":
        patches_per_unit = fixed["grid_hw"][0] * fixed["grid_hw"][1]
        dynamic = {"pixel_values_videos": {0: units * patches_per_unit}}
        input_shapes = {"pixel_values_videos": [f"units*{patches_per_unit}", fixed["patch_dim"]]}
        output_shape = [f"units*{patches_per_unit // adapter.merge_size ** 2}", int(adapter.text_config.hidden_size)]
    else:
        dynamic = {"pixel_values_videos": {1: units}}
        input_shapes = {"pixel_values_videos": [1, "frames", *pixels.shape[2:]]}
        output_shape = [f"frames*{graph.tokens_per_frame}", int(adapter.text_config.hidden_size)]
    started = time.perf_counter()
    with torch.no_grad():
        program = torch.onnx.export(graph, (pixels,), dynamo=True, input_names=["pixel_values_videos"],
                                    output_names=["vision_embeds"], dynamic_shapes=dynamic,
                                    opset_version=opset, optimize=True, verbose=False)
    for stale in (onnx_path, pathlib.Path(str(onnx_path) + ".data")):
        stale.unlink(missing_ok=True)
    program.save(str(onnx_path))
    sidecar = {
        "format": SIDECAR_FORMAT,
        "family": adapter.family,
        "model_id": adapter.model_id,
        "config_hash": encoder_config_hash(adapter),
        "config_hash_excludes": list(RUNTIME_CONFIG_KEYS),
        "inputs": input_shapes,
        "outputs": {"vision_embeds": output_shape},
        "dtype": "float32",
        "opset": opset,
        "fixed": fixed,
        "exported_with": {"torch": torch.__version__, "transformers": _transformers_version()},
        "export_seconds": round(time.perf_counter() - started, 1),
    }
    sidecar_path(onnx_path).write_text(json.dumps(sidecar, indent=2) + "\n")
    return onnx_path


def quiet_exporter_logs() -> None:
    """Silence the exporter's notes that do not concern this graph ("torchvision is not installed.
    Skipping torchvision::nms", a deprecation warning from torch.export's pytree)."""
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    import torch.onnx  # noqa: F401, PLC0415 - first: importing it resets the torch.* log levels

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


def _transformers_version() -> str:
    import transformers  # noqa: PLC0415

    return transformers.__version__
