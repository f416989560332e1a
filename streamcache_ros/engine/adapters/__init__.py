"""Model adapters (one file per family) and the loader that picks one from a model's config."""
from __future__ import annotations

import importlib
import json
import os

import torch

from ..errors import ConfigError, ModelLoadError
from ..stream.layout import OPTIONS_PROMPTS
from .models import resolve_model_path
from .vocabulary import AnswerVocabulary
from .base import ModelAdapter, VisionEncoder, VisionInputs, match_option
from .llava_onevision import LlavaOnevisionAdapter
from .onnx_vision import OnnxVisionEncoder, resolve_onnx_path
from .qwen2_5_vl import Qwen25VLAdapter

ADAPTERS: dict[str, type[ModelAdapter]] = {
    "qwen2_5_vl": Qwen25VLAdapter,
    "llava_onevision": LlavaOnevisionAdapter,
}
VISION_BACKENDS = ("torch", "onnxruntime")
PIL_IMAGE_PROCESSORS = {
    "qwen2_5_vl": ("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl", "Qwen2VLImageProcessorPil"),
    "llava_onevision": ("transformers.models.llava_onevision.image_processing_pil_llava_onevision",
                        "LlavaOnevisionImageProcessorPil"),
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("device", f"'{device}' requested but CUDA is not available "
                                        f"(torch {torch.__version__}); use 'cpu' or 'auto'")
        return torch.device(device)
    raise ConfigError("device", f"unknown device '{device}' (cpu|cuda|auto)")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype not in DTYPES:
        raise ConfigError("dtype", f"unknown dtype '{dtype}' (auto|{'|'.join(DTYPES)})")
    return DTYPES[dtype]


def _looks_like_path(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or os.sep + os.sep in path or path.count("/") > 1


def load_adapter(model_path: str, device: str = "auto", dtype: str = "auto", attention: str = "auto",
                 sample_fps: float = 1.0, vision_backend: str = "torch", vision_onnx_path: str = "",
                 vision_onnx_providers: str | list[str] = "auto") -> ModelAdapter:
    """Load a Qwen2.5-VL or LLaVA-OneVision model (a bundled tiny model name, a local directory or
    a Hugging Face hub id) with its tokenizer and image processor, wrapped in its adapter.

    ``vision_backend='onnxruntime'`` runs the vision encoder from ``vision_onnx_path`` (written by
    streamcache-export-encoder) on ``vision_onnx_providers`` ('auto': TensorRT, CUDA, CPU)."""
    from transformers import AutoConfig, AutoTokenizer  # noqa: PLC0415

    if vision_backend not in VISION_BACKENDS:
        raise ConfigError("vision_backend", f"unknown vision backend '{vision_backend}' "
                                            f"({'|'.join(VISION_BACKENDS)})")
    if vision_backend == "onnxruntime":  # before the model loads: a wrong path fails fast
        resolve_onnx_path(vision_onnx_path)
    resolved = resolve_model_path(model_path)
    if not os.path.isdir(os.path.expanduser(resolved)) and _looks_like_path(resolved):
        raise ModelLoadError(f"model_path '{model_path}' does not exist")
    resolved = os.path.expanduser(resolved)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    try:
        config = AutoConfig.from_pretrained(resolved)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"model_path '{model_path}' is not a local model directory and could not be "
                             f"loaded as a Hugging Face hub id: {str(err).splitlines()[0]}") from None
    adapter_cls = ADAPTERS.get(config.model_type)
    if adapter_cls is None:
        raise ModelLoadError(f"model_path '{model_path}' is a '{config.model_type}' model; supported: "
                             f"{', '.join(ADAPTERS)}")
    model_cls = _model_class(config.model_type)
    backend_attn = "flash_attention_2" if (attention in ("auto", "flash") and torch_device.type == "cuda"
                                           and _flash_available()) else "sdpa"
    try:
        model = model_cls.from_pretrained(resolved, dtype=torch_dtype, attn_implementation=backend_attn)
        tokenizer = AutoTokenizer.from_pretrained(resolved)
        image_processor = load_image_processor(resolved, config.model_type)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"model_path '{model_path}': {str(err).splitlines()[0]}") from None
    model.to(torch_device).eval()
    model_id = _model_id(model_path, resolved)
    model_settings = read_model_settings(resolved)
    adapter = adapter_cls(model, tokenizer, image_processor, model_id, attention=attention, sample_fps=sample_fps,
                          options_prompt=model_settings.get("options_prompt", "letter"))
    adapter.model_settings = model_settings
    adapter.model_dir = resolved if os.path.isdir(resolved) else ""
    if vision_backend == "onnxruntime":
        adapter.vision_encoder = OnnxVisionEncoder(vision_onnx_path, adapter, providers=vision_onnx_providers)
    return adapter


MODEL_SETTINGS_FILE = "streamcache.json"


def read_model_settings(path: str) -> dict:
    """Settings a model's folder carries for this package (``streamcache.json``), e.g. the bundled
    world models' ``options_prompt: words``; empty for a hub id or real weights without the file."""
    file = os.path.join(path, MODEL_SETTINGS_FILE)
    if not os.path.isfile(file):
        return {}
    try:
        with open(file, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{file} is not valid JSON: {err}") from None
    style = settings.get("options_prompt", "letter")
    if style not in OPTIONS_PROMPTS:
        raise ModelLoadError(f"{file}: options_prompt must be one of {', '.join(OPTIONS_PROMPTS)}, got '{style}'")
    budget = settings.get("budget_tokens", 0)
    if not isinstance(budget, int) or budget < 0:
        raise ModelLoadError(f"{file}: budget_tokens must be a whole number >= 0, got {budget!r}")
    try:  # the words the model answers with, by kind (docs/interfaces.md "Free-text answers")
        AnswerVocabulary.from_settings(settings, file)
    except ValueError as err:
        raise ModelLoadError(str(err)) from None
    return settings


def load_image_processor(path: str, model_type: str, **overrides):
    """The model's image processor. Without torchvision, transformers 5.24 falls back to the PIL
    processors by itself; 5.17's AutoImageProcessor refuses to load, so take the PIL class here."""
    from transformers import AutoImageProcessor  # noqa: PLC0415

    try:
        return AutoImageProcessor.from_pretrained(path, **overrides)
    except ImportError:
        module, name = PIL_IMAGE_PROCESSORS[model_type]
        return getattr(importlib.import_module(module), name).from_pretrained(path, **overrides)


def _model_class(model_type: str):
    from transformers import LlavaOnevisionForConditionalGeneration, Qwen2_5_VLForConditionalGeneration  # noqa

    return {"qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
            "llava_onevision": LlavaOnevisionForConditionalGeneration}[model_type]


def _flash_available() -> bool:
    from ..cache.attention import flash_attn_func  # noqa: PLC0415

    return flash_attn_func() is not None


def _model_id(model_path: str, resolved: str) -> str:
    """A stable name: the bundled name or hub id as given, else the directory's name."""
    if resolved != os.path.expanduser(model_path) or not os.path.isdir(resolved):
        return model_path
    return os.path.basename(os.path.normpath(resolved))


__all__ = ["ADAPTERS", "VISION_BACKENDS", "ModelAdapter", "OnnxVisionEncoder", "VisionEncoder", "VisionInputs",
           "load_adapter", "load_image_processor", "match_option", "resolve_device", "resolve_dtype"]
