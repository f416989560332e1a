"""The models bundled with the package: `world-*` trained here on the shape world (docs/world-models.md),
the default; `tiny-*` with random weights, for tests that need a model of a given shape."""
from __future__ import annotations

import pathlib

BUNDLED_DIR = pathlib.Path(__file__).resolve().parents[2] / "models"
DEFAULT_MODEL = "world-qwen2_5_vl"


def bundled_model_names() -> list[str]:
    return sorted(p.name for p in BUNDLED_DIR.glob("*") if (p / "config.json").is_file())


def resolve_model_path(model_path: str) -> str:
    """A bundled model's name ('tiny-qwen2_5_vl') becomes its directory; anything else is returned
    unchanged (a local directory or a Hugging Face hub id)."""
    if model_path in bundled_model_names():
        return str(BUNDLED_DIR / model_path)
    return model_path
