"""Shared fixtures: the bundled tiny models (loaded once per test session) and camera frames
(one fixed shape-world stream, docs/world.md)."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests run against this checkout, installed or not
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine import load_adapter  # noqa: E402
from streamcache_ros.engine.adapters import ADAPTERS  # noqa: E402
from streamcache_ros.engine.models import BUNDLED_DIR  # noqa: E402

FAMILIES = ["tiny-qwen2_5_vl", "tiny-llava_onevision"]


@pytest.fixture(scope="session", params=FAMILIES)
def adapter(request):
    return load_adapter(request.param, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def qwen_adapter():
    return load_adapter("tiny-qwen2_5_vl", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def llava_adapter():
    return load_adapter("tiny-llava_onevision", device="cpu", dtype="float32")


@pytest.fixture
def frames():
    """frames(n, start=0) -> list of RGB uint8 160x120 frames of the fixed world stream."""
    return lambda n, start=0: list(world.world_frames(n, start=start))


def family_traits(family: str):
    """The FamilyTraits a model family's adapter gives its cache policies ("qwen2_5_vl", ...)."""
    return ADAPTERS[family].traits


def policy_for(adapter, name: str, **settings):
    """``make_policy(name, **settings)`` for ``adapter``'s model: H2SVC gets the head map in the
    model's folder, as the factory finds it."""
    from streamcache_ros.engine.cache import make_policy  # noqa: PLC0415
    from streamcache_ros.engine.factory import resolve_head_map  # noqa: PLC0415

    if name == "h2svc" and "head_map" not in settings:
        settings["head_map"] = resolve_head_map(settings.get("head_map_path", ""), adapter)[0]
    return make_policy(name, **settings)


def make_variant(tmp_path: pathlib.Path, name: str, **text_overrides) -> str:
    """A copy of a bundled tiny model with some text-config fields changed (same weights)."""
    out = tmp_path / f"{name}-variant"
    shutil.copytree(BUNDLED_DIR / name, out)
    config = json.loads((out / "config.json").read_text())
    config["text_config"].update(text_overrides)
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


def states_equal(a, b) -> bool:
    """Two cache states (nested dicts / lists of tensors) are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    return a == b
