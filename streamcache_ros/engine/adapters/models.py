"""The models bundled with the package: `world-*` trained here on the shape world (docs/world-models.md),
the default; `tiny-*` with random weights, for tests that need a model of a given shape."""
from __future__ import annotations

import pathlib

BUNDLED_DIR = pathlib.Path(__file__).resolve().parents[2] / "models"
DEFAULT_MODEL = "world-qwen2_5_vl"
# the archive's dual encoders (docs/archive.md "The index"): apart, so they are never taken for a VLM
RETRIEVAL_DIR = BUNDLED_DIR / "retrieval"
WORLD_RETRIEVAL = "world-retrieval"


def bundled_model_names() -> list[str]:
    return sorted(p.name for p in BUNDLED_DIR.glob("*") if (p / "config.json").is_file())


def resolve_model_path(model_path: str) -> str:
    """A bundled model's name ('tiny-qwen2_5_vl') becomes its directory; anything else is returned
    unchanged (a local directory or a Hugging Face hub id)."""
    if model_path in bundled_model_names():
        return str(BUNDLED_DIR / model_path)
    return model_path


# what turns the index off, from a launch argument, a params file or `-p` (where a shell's `off`
# reaches ROS as the YAML boolean false, which the node reads back as "off")
RETRIEVAL_OFF = ("", "off", "none", "false")


def is_world_model(model_id: str) -> bool:
    """A bundled shape-world model: its cameras show the shape world (docs/world-models.md)."""
    return model_id.startswith("world-")


def resolve_retrieval_path(retrieval_model_path: str, model_id: str) -> str:
    """The dual encoder the archive's index uses: 'auto' is the bundled shape-world one for a
    bundled world model and none ('') for any other (its frames are not the shape world's); 'off'
    or 'none' is none; a bundled dual encoder's name becomes its directory; anything else is
    returned unchanged."""
    if str(retrieval_model_path).strip().lower() in RETRIEVAL_OFF:
        return ""
    if retrieval_model_path == "auto":
        return str(RETRIEVAL_DIR / WORLD_RETRIEVAL) if is_world_model(model_id) else ""
    if retrieval_model_path and (RETRIEVAL_DIR / retrieval_model_path / "config.json").is_file():
        return str(RETRIEVAL_DIR / retrieval_model_path)
    return retrieval_model_path
