"""The vision encoder through onnxruntime: an ONNX file written by ``streamcache-export-encoder``.

The file's sidecar (``vision_encoder.json`` next to it) names the model and config it was exported
from; an encoder from another model or config is refused at start. Inputs whose shape the export
does not support (another frame grid on Qwen2.5-VL) are refused per chunk with the reason.
onnxruntime is imported only when this backend is chosen.
"""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import torch

from ..errors import ConfigError
from .base import ModelAdapter, VisionEncoder
from .onnx_export import ONNX_NAME, SIDECAR_FORMAT, encoder_config_hash, sidecar_path

# Preferred first; each is used only when the installed onnxruntime has it.
PROVIDER_PREFERENCE = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
PROVIDER_ALIASES = {"tensorrt": "TensorrtExecutionProvider", "trt": "TensorrtExecutionProvider",
                    "cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


def _onnxruntime():
    try:
        import onnxruntime  # noqa: PLC0415
    except ImportError:
        raise ConfigError("vision_backend", "'onnxruntime' needs the onnxruntime package (pip install "
                                            "onnxruntime, or onnxruntime-gpu for CUDA/TensorRT)") from None
    return onnxruntime


def resolve_providers(spec: str | list[str] | tuple[str, ...], available: list[str]) -> list[str]:
    """'auto' -> TensorRT, CUDA, CPU as available; else the named ones in the given order
    (comma-separated string or list; short names tensorrt|cuda|cpu or onnxruntime's full names)."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not names or names == ["auto"]:
        return [p for p in PROVIDER_PREFERENCE if p in available]
    chosen = []
    for name in names:
        full = PROVIDER_ALIASES.get(name.lower(), name)
        if full not in available:
            raise ConfigError("vision_onnx_providers", f"'{name}' is not available in this onnxruntime "
                                                       f"(available: {', '.join(available)})")
        chosen.append(full)
    return chosen


def resolve_onnx_path(path: str) -> pathlib.Path:
    """The .onnx file itself, or the export directory holding vision_encoder.onnx."""
    if not path:
        raise ConfigError("vision_onnx_path", "is empty; vision_backend 'onnxruntime' needs the file "
                                              "written by streamcache-export-encoder")
    resolved = pathlib.Path(os.path.expanduser(path))
    if resolved.is_dir():
        resolved = resolved / ONNX_NAME
    if not resolved.is_file():
        raise ConfigError("vision_onnx_path", f"no ONNX encoder at '{path}' (export one with "
                                              f"streamcache-export-encoder --model MODEL --out DIR)")
    return resolved


def read_sidecar(onnx_path: pathlib.Path) -> dict:
    side = sidecar_path(onnx_path)
    try:
        sidecar = json.loads(side.read_text())
    except FileNotFoundError:
        raise ConfigError("vision_onnx_path", f"'{onnx_path}' has no sidecar '{side.name}' next to it; "
                                              f"re-export it with streamcache-export-encoder") from None
    except (OSError, ValueError) as err:
        raise ConfigError("vision_onnx_path", f"sidecar '{side}' cannot be read: {err}") from None
    if not isinstance(sidecar, dict) or sidecar.get("format") != SIDECAR_FORMAT:
        raise ConfigError("vision_onnx_path", f"sidecar '{side}' is not a streamcache encoder sidecar "
                                              f"(format {SIDECAR_FORMAT})")
    return sidecar


def check_sidecar(sidecar: dict, adapter: ModelAdapter, onnx_path: pathlib.Path) -> None:
    """Refuse an encoder exported from another model or config, naming both."""
    mine = {"model_id": adapter.model_id, "config_hash": encoder_config_hash(adapter)}
    theirs = {key: sidecar.get(key) for key in mine}
    if theirs != mine:
        raise ConfigError("vision_onnx_path", (
            f"'{onnx_path}' was exported from model '{theirs['model_id']}' (config {theirs['config_hash']}), "
            f"but this node runs model '{mine['model_id']}' (config {mine['config_hash']}); re-export with "
            f"streamcache-export-encoder --model {mine['model_id']}"))


class OnnxVisionEncoder(VisionEncoder):
    """``VisionInputs.tensors`` -> [N, hidden] through an onnxruntime InferenceSession (float32)."""

    name = "onnxruntime"

    def __init__(self, onnx_path: str, adapter: ModelAdapter, providers: str | list[str] = "auto",
                 threads: int = 0):
        ort = _onnxruntime()
        self.path = resolve_onnx_path(onnx_path)
        self.sidecar = read_sidecar(self.path)
        check_sidecar(self.sidecar, adapter, self.path)
        self.family = adapter.family
        self.fixed = self.sidecar.get("fixed", {})
        wanted = resolve_providers(providers, ort.get_available_providers())
        options = ort.SessionOptions()
        if threads > 0:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(self.path), options,
                                                providers=[self._provider_entry(p) for p in wanted])
        except Exception as err:  # onnxruntime raises its own exception types (invalid graph, EP failure)
            raise ConfigError("vision_onnx_path", f"onnxruntime cannot load '{self.path}': "
                                                  f"{str(err).splitlines()[0]}") from None
        self.providers = self.session.get_providers()
        explicit = not isinstance(providers, str) or providers.strip() not in ("", "auto")
        missing = [p for p in wanted if p not in self.providers]
        if explicit and missing:  # onnxruntime falls back silently when a provider's libraries are absent
            raise ConfigError("vision_onnx_providers", f"onnxruntime could not start {', '.join(missing)} "
                                                       f"(running: {', '.join(self.providers)})")
        self.input_names = [i.name for i in self.session.get_inputs()]

    def _provider_entry(self, provider: str):
        if provider == "TensorrtExecutionProvider":
            # TensorRT builds an engine per input shape: keep them next to the ONNX file across starts
            cache = self.path.parent / "trt_cache"
            return provider, {"trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache)}
        return provider

    def check_inputs(self, tensors: dict[str, torch.Tensor]) -> None:
        """Raise ValueError when a chunk's tensors are of a shape this export does not take."""
        pixels = tensors["pixel_values_videos"]
        if self.family == "qwen2_5_vl":
            grid = tensors["video_grid_thw"]
            gh, gw = self.fixed["grid_hw"]
            if grid.shape[0] != 1 or [int(grid[0, 1]), int(grid[0, 2])] != [gh, gw]:
                width, height = self.fixed["frame_size"]
                got = "x".join(str(int(x)) for x in grid[0, 1:]) if grid.shape[0] == 1 else f"{grid.shape[0]} grids"
                raise ValueError(f"the ONNX encoder '{self.path}' takes a {gh}x{gw} patch grid (frames of "
                                 f"{width}x{height} at export); this chunk's frames give {got}: re-export "
                                 f"with --frame-size set to this camera's WIDTHxHEIGHT, or use vision_backend torch")
            if pixels.shape[1] != self.fixed["patch_dim"]:
                raise ValueError(f"pixel_values_videos has {pixels.shape[1]} values per patch; the ONNX "
                                 f"encoder takes {self.fixed['patch_dim']}")
        else:
            size = self.fixed["image_size"]
            if pixels.dim() != 5 or pixels.shape[0] != 1 or tuple(pixels.shape[2:]) != (3, size, size):
                raise ValueError(f"the ONNX encoder '{self.path}' takes frames [1, F, 3, {size}, {size}]; "
                                 f"got {list(pixels.shape)}")

    def __call__(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        self.check_inputs(tensors)
        feed = {name: tensors[name].detach().to("cpu", torch.float32).numpy() for name in self.input_names}
        (embeds,) = self.session.run(None, feed)
        return torch.from_numpy(np.ascontiguousarray(embeds))
