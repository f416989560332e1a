"""Shared fixtures: the bundled tiny models (loaded once per test session) and camera frames
(one fixed shape-world stream, docs/world.md)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys

import numpy as np
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
from streamcache_ros.engine.adapters.models import BUNDLED_DIR  # noqa: E402

FAMILIES = ["tiny-qwen2_5_vl", "tiny-llava_onevision"]
REAL_TOKEN_FAMILIES = ["qwen2_5_vl", "llava_onevision"]
REAL_FRAME = (480, 640)  # a camera frame: what the real processors' token counts are for


@pytest.fixture(scope="session", params=FAMILIES)
def adapter(request):
    return load_adapter(request.param, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def qwen_adapter():
    return load_adapter("tiny-qwen2_5_vl", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def llava_adapter():
    return load_adapter("tiny-llava_onevision", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def real_token_models(tmp_path_factory) -> dict[str, str]:
    """family -> folder of a tiny model with the real processor's tokens per frame (391 per 2 frames
    of 640x480 on Qwen2.5-VL, 196 per frame on LLaVA-OneVision) and a small position range, built
    now from the real config classes (scripts/make_tiny_models.py --real-tokens; docs/setup.md)."""
    spec = importlib.util.spec_from_file_location("make_tiny_models", ROOT / "scripts" / "make_tiny_models.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    out = tmp_path_factory.mktemp("real_token_models")
    return {family: str(builder.build_real_tokens(out, family, BUNDLED_DIR / f"tiny-{family}" / "h2svc_head_map.json"))
            for family in REAL_TOKEN_FAMILIES}


class Memo:
    """An adapter's ``preprocess`` and ``encode`` run once per distinct list of frames: tests feed the
    same clip to many sessions, and at 640x480 the real Qwen2.5-VL preprocessor and the vision tower
    are the slowest part of a test (encoding is tested for itself: test_adapters, test_onnx_vision)."""

    def __init__(self, adapter):
        self.preprocess_frames, self.encode_inputs = adapter.preprocess, adapter.encode
        self.inputs, self.embeds = {}, {}

    def preprocess(self, frames):
        key = tuple(hashlib.sha1(f.tobytes()).hexdigest() for f in frames)
        if key not in self.inputs:
            self.inputs[key] = self.preprocess_frames(frames)
        return self.inputs[key]

    def encode(self, inputs):
        if id(inputs) not in self.embeds:
            self.embeds[id(inputs)] = (inputs, self.encode_inputs(inputs))  # keeps ``inputs`` (and its id) alive
        return self.embeds[id(inputs)][1]


@pytest.fixture(scope="session")
def real_token_adapters(real_token_models):
    """family -> the real-token model's adapter (CPU, float32), preprocessing and encoding memoised."""
    adapters = {}
    for family, path in real_token_models.items():
        adapter = load_adapter(path, device="cpu", dtype="float32")
        memo = Memo(adapter)
        adapter.preprocess, adapter.encode = memo.preprocess, memo.encode
        adapters[family] = adapter
    return adapters


@pytest.fixture(scope="session")
def camera_frames():
    """camera_frames(n, start=0) -> n frames of the fixed world stream at 640x480, made once."""
    made: dict[int, np.ndarray] = {}

    def take(n, start=0):
        for i in range(start, start + n):
            if i not in made:
                made[i] = world.world_frame(i, *REAL_FRAME)
        return [made[i] for i in range(start, start + n)]
    return take


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


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_install: runs `ros2 launch` / `ros2 run` (node_procs.needs_install)")


def pytest_runtest_setup(item):
    """A test marked needs_install is skipped where `ros2 launch` / `ros2 run` cannot run this
    checkout, with the reason (node_procs.installed_here names the absence: no ros2 CLI, no
    launch_ros, not installed the ROS way, another checkout's); on CI (CI=true), whose set-up
    installs them, it fails instead. Anything else going wrong there is an error, never a skip."""
    if item.get_closest_marker("needs_install") is None:
        return
    from node_procs import ON_CI, installed_here  # noqa: PLC0415 - ROS is imported only where a node test runs

    reason = installed_here()
    if reason and ON_CI:
        pytest.fail(f"CI=true, where scripts/setup.sh installs `ros2 launch`, yet it cannot run here: {reason}",
                    pytrace=False)
    if reason:
        pytest.skip(f"cannot run here: {reason}")


# -- streamcache_node as a real process (node_procs.py) ----------------------------------------------
# A test module that runs the node names its namespace NS and defines the fixture ``node`` (the
# process); these give it a ROS domain of its own, a client of the node and a probe. A module
# overrides one by defining its own (a ``probe`` that adds to this one takes ``probe`` itself).
@pytest.fixture(scope="module")
def domain():
    """A ROS domain of the module's own (localhost only)."""
    from node_procs import new_domain  # noqa: PLC0415 - ROS is imported only where a node test runs

    return new_domain()


@pytest.fixture(scope="module")
def client(node, domain, request):
    """A StreamCacheClient of the module's ``node`` in its namespace ``NS`` (None: the one node found)."""
    from node_procs import client_of  # noqa: PLC0415

    with client_of(node, domain, request.module.NS) as c:
        yield c


@pytest.fixture(scope="module")
def probe(domain, client, request):
    """This test process's own participant (node_procs.Probe), made once the node answers: it collects
    the node's frame acknowledgements (``acks``), memory statuses (``statuses``) and /diagnostics."""
    from diagnostic_msgs.msg import DiagnosticArray  # noqa: PLC0415
    from node_procs import RELIABLE, Probe  # noqa: PLC0415
    from rclpy.qos import QoSProfile  # noqa: PLC0415
    from std_msgs.msg import Header  # noqa: PLC0415
    from streamcache_ros_interfaces.msg import MemoryStatus  # noqa: PLC0415

    p = Probe(domain)
    p.acks = p.collect(Header, f"{request.module.NS}/frame_acks", RELIABLE)
    p.statuses = p.collect(MemoryStatus, f"{request.module.NS}/memory_status", RELIABLE)
    p.diagnostics = p.collect(DiagnosticArray, "/diagnostics", QoSProfile(depth=100))
    yield p
    p.close()
