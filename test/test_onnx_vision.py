"""The vision encoder through onnxruntime on both tiny models: export, equal embeddings, equal answers,
clear errors. Tolerances (README "Vision encoder through onnxruntime"): embeddings atol 1e-4 in
float32; answer logits atol 1e-3, tokens compared while the torch top-2 margin exceeds that
(docs/performance.md: greedy tokens may flip where the top two logits are within the numeric error)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from streamcache_ros.engine import ChunkError, ConfigError, load_adapter
from streamcache_ros.engine.adapters import OnnxVisionEncoder
from streamcache_ros.engine.adapters.onnx_export import encoder_config_hash, export_vision_encoder
from streamcache_ros.engine.adapters.onnx_vision import resolve_providers
from streamcache_ros.engine.factory import ENGINE_DEFAULTS, build_session

from conftest import ROOT, make_variant

EMBED_ATOL = 1e-4
LOGIT_ATOL = 1e-3
FRAME_SIZE = (160, 120)  # the frames fixture (conftest.py): width x height


@pytest.fixture(scope="module")
def exported(tmp_path_factory, qwen_adapter, llava_adapter):
    """family -> export directory, both exported for the frames fixture's size."""
    out = {}
    for adapter in (qwen_adapter, llava_adapter):
        directory = tmp_path_factory.mktemp(adapter.family)
        export_vision_encoder(adapter, directory, frame_size=FRAME_SIZE)
        out[adapter.family] = directory
    return out


def _adapter_for(family, qwen_adapter, llava_adapter):
    return qwen_adapter if family == "qwen2_5_vl" else llava_adapter


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_onevision"])
def test_onnxruntime_embeddings_equal_torch(family, exported, qwen_adapter, llava_adapter, frames):
    adapter = _adapter_for(family, qwen_adapter, llava_adapter)
    encoder = OnnxVisionEncoder(str(exported[family]), adapter, providers="cpu")
    assert encoder.providers == ["CPUExecutionProvider"]
    # chunks of several sizes through one file: the number of frames / temporal patches is dynamic
    # (5 frames on Qwen2.5-VL: the odd last frame fills its temporal patch by repetition)
    for count in (1, 5, 8):
        inputs = adapter.preprocess(frames(count, start=10 * count))
        with torch.inference_mode():
            expected = adapter.vision_encoder(inputs.tensors)
        got = encoder(inputs.tensors)
        assert got.shape == expected.shape == (inputs.num_units * inputs.tokens_per_unit,
                                               adapter.text_config.hidden_size)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, atol=EMBED_ATOL, rtol=0)


def test_cli_exports_a_square_frame_grid_with_its_sidecar(tmp_path, qwen_adapter):
    """The console entry end to end, for a frame size whose windows tile the grid exactly (no padded
    window: the other attention path of the Qwen2.5-VL graph)."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    done = subprocess.run([sys.executable, "-m", "streamcache_ros.tools.export_encoder", "--model", "tiny-qwen2_5_vl",
                           "--out", str(tmp_path / "enc"), "--frame-size", "112x112"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "within atol" in done.stdout
    sidecar = json.loads((tmp_path / "enc" / "vision_encoder.json").read_text())
    # the tiny processor keeps 112x112 pixels: 8x8 patches of 14, merged 2x2 -> 16 tokens per unit
    assert sidecar["model_id"] == "tiny-qwen2_5_vl"
    assert sidecar["config_hash"] == encoder_config_hash(qwen_adapter)
    assert sidecar["fixed"]["grid_hw"] == [8, 8] and sidecar["fixed"]["frame_size"] == [112, 112]
    assert sidecar["inputs"] == {"pixel_values_videos": ["units*64", 3 * 2 * 14 * 14]}
    assert sidecar["outputs"] == {"vision_embeds": ["units*16", 64]}
    assert (sidecar["dtype"], sidecar["opset"]) == ("float32", 18)
    assert sidecar["verified"]["max_abs_diff"] <= EMBED_ATOL

    encoder = OnnxVisionEncoder(str(tmp_path / "enc" / "vision_encoder.onnx"), qwen_adapter, providers="auto")
    rng = np.random.default_rng(3)
    for count in (2, 8):
        inputs = qwen_adapter.preprocess([rng.integers(0, 256, (112, 112, 3), dtype=np.uint8) for _ in range(count)])
        with torch.inference_mode():
            expected = qwen_adapter.vision_encoder(inputs.tensors)
        assert expected.shape[0] == count // 2 * 16
        torch.testing.assert_close(encoder(inputs.tensors), expected, atol=EMBED_ATOL, rtol=0)


def _record_logits(session):
    """Keep every logits vector the session's adapter computes (the answer's steps)."""
    seen = []
    compute = session.adapter.logits

    def recording(hidden):
        logits = compute(hidden)
        seen.append(logits.detach().clone())
        return logits

    session.adapter.logits = recording
    return seen


@pytest.mark.parametrize("model", ["tiny-qwen2_5_vl", "tiny-llava_onevision"])
def test_session_answers_match_between_backends(model, exported, frames):
    family = model.removeprefix("tiny-")
    params = {"model_path": model, "device": "cpu", "dtype": "float32", "policy": "fifo", "budget_tokens": 96,
              "chunk_frames": 4}
    sessions = {"torch": build_session(params),
                "onnxruntime": build_session({**params, "vision_backend": "onnxruntime",
                                              "vision_onnx_path": str(exported[family])})}
    assert sessions["onnxruntime"].adapter.vision_encoder.name == "onnxruntime"
    assert sessions["torch"].adapter.vision_encoder.name == "torch"
    logits = {}
    for backend, session in sessions.items():
        for i, frame in enumerate(frames(14)):  # 3 full chunks + a partial one at the question; fifo evicts
            session.add_frame(frame, stamp=i * 0.5)
        logits[backend] = _record_logits(session)
        session.ask("what moved on the table?", max_new_tokens=8)
    reference, other = logits["torch"], logits["onnxruntime"]
    assert sessions["torch"].status().cache.layer_tokens == sessions["onnxruntime"].status().cache.layer_tokens
    compared = 0
    for step, (a, b) in enumerate(zip(reference, other)):
        torch.testing.assert_close(b, a, atol=LOGIT_ATOL, rtol=0, msg=lambda m: f"step {step}: {m}")
        top2 = torch.topk(a, 2).values
        if float(top2[0] - top2[1]) <= LOGIT_ATOL:
            break  # a near tie: from here the greedy paths may legitimately part
        assert int(a.argmax()) == int(b.argmax()), f"answer token {step} differs"
        compared += 1
    assert compared >= 1  # the first answer token at least was compared
    if compared == len(reference):
        assert len(other) == len(reference)


def test_missing_onnx_file_is_a_clear_error(tmp_path, exported):
    with pytest.raises(ConfigError, match="vision_onnx_path.*no ONNX encoder at '/no/such/encoder.onnx'"):
        load_adapter("tiny-qwen2_5_vl", device="cpu", dtype="float32", vision_backend="onnxruntime",
                     vision_onnx_path="/no/such/encoder.onnx")
    with pytest.raises(ConfigError, match="vision_onnx_path.*is empty"):
        build_session({"model_path": "tiny-qwen2_5_vl", "device": "cpu", "vision_backend": "onnxruntime"})
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(exported["qwen2_5_vl"] / "vision_encoder.onnx", lonely)
    with pytest.raises(ConfigError, match="no sidecar 'vision_encoder.json'"):
        load_adapter("tiny-qwen2_5_vl", device="cpu", dtype="float32", vision_backend="onnxruntime",
                     vision_onnx_path=str(lonely))


def test_unknown_backend_and_providers_are_refused(exported):
    with pytest.raises(ConfigError, match="parameter 'vision_backend': unknown vision backend 'tensorflow'"):
        build_session({"model_path": "tiny-qwen2_5_vl", "device": "cpu", "vision_backend": "tensorflow"})
    with pytest.raises(ConfigError, match="parameter 'vision_onnx_providers': 'bogus' is not available"):
        load_adapter("tiny-llava_onevision", device="cpu", dtype="float32", vision_backend="onnxruntime",
                     vision_onnx_path=str(exported["llava_onevision"]), vision_onnx_providers="bogus")
    import onnxruntime  # noqa: PLC0415

    absent = [p for p in onnxruntime.get_all_providers() if p not in onnxruntime.get_available_providers()]
    with pytest.raises(ConfigError, match=f"'{absent[0]}' is not available"):
        load_adapter("tiny-llava_onevision", device="cpu", dtype="float32", vision_backend="onnxruntime",
                     vision_onnx_path=str(exported["llava_onevision"]), vision_onnx_providers=[absent[0], "cpu"])
    # the node declares its parameters from ENGINE_DEFAULTS: torch unless asked
    assert (ENGINE_DEFAULTS["vision_backend"], ENGINE_DEFAULTS["vision_onnx_path"],
            ENGINE_DEFAULTS["vision_onnx_providers"]) == ("torch", "", "auto")


def test_provider_order_prefers_tensorrt_then_cuda_then_cpu():
    everything = ["CPUExecutionProvider", "CUDAExecutionProvider", "AzureExecutionProvider",
                  "TensorrtExecutionProvider"]
    assert resolve_providers("auto", everything) == ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                                     "CPUExecutionProvider"]
    assert resolve_providers("auto", ["CPUExecutionProvider", "CUDAExecutionProvider"]) == [
        "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert resolve_providers("cpu, cuda", everything) == ["CPUExecutionProvider", "CUDAExecutionProvider"]
    assert resolve_providers(["TensorrtExecutionProvider"], everything) == ["TensorrtExecutionProvider"]


def test_encoder_from_another_model_or_config_is_refused(tmp_path, exported, qwen_adapter):
    # another family altogether
    with pytest.raises(ConfigError) as err:
        load_adapter("tiny-llava_onevision", device="cpu", dtype="float32", vision_backend="onnxruntime",
                     vision_onnx_path=str(exported["qwen2_5_vl"]))
    assert err.value.parameter == "vision_onnx_path"
    assert "exported from model 'tiny-qwen2_5_vl'" in str(err.value)
    assert "this node runs model 'tiny-llava_onevision'" in str(err.value)
    # the same weights under another config (one text-model constant changed)
    variant = make_variant(tmp_path, "tiny-qwen2_5_vl", rms_norm_eps=1e-4)
    variant_adapter = load_adapter(variant, device="cpu", dtype="float32")
    export_vision_encoder(variant_adapter, tmp_path / "variant-enc", frame_size=FRAME_SIZE)
    with pytest.raises(ConfigError) as err:
        load_adapter("tiny-qwen2_5_vl", device="cpu", dtype="float32", vision_backend="onnxruntime",
                     vision_onnx_path=str(tmp_path / "variant-enc"))
    message, theirs, mine = str(err.value), encoder_config_hash(variant_adapter), encoder_config_hash(qwen_adapter)
    assert theirs != mine
    assert f"exported from model '{variant_adapter.model_id}' (config {theirs})" in message
    assert f"this node runs model 'tiny-qwen2_5_vl' (config {mine})" in message


def test_a_bfloat16_language_model_takes_the_float32_encoder(exported, frames, qwen_adapter):
    """The sidecar's config hash leaves out the load-time dtype: export once in float32, run in bf16."""
    adapter = load_adapter("tiny-qwen2_5_vl", device="cpu", dtype="bfloat16", vision_backend="onnxruntime",
                           vision_onnx_path=str(exported["qwen2_5_vl"]))
    inputs = adapter.preprocess(frames(4))
    embeds = adapter.encode(inputs)
    assert embeds.dtype == torch.bfloat16
    with torch.inference_mode():
        expected = qwen_adapter.vision_encoder(inputs.tensors)
    torch.testing.assert_close(embeds.float(), expected, atol=0.1, rtol=0.01)  # bf16 rounding of the output


def test_frames_of_another_size_are_refused_per_chunk_and_memory_is_unchanged(exported, frames):
    session = build_session({"model_path": "tiny-qwen2_5_vl", "device": "cpu", "dtype": "float32",
                             "policy": "fifo", "budget_tokens": 96, "chunk_frames": 2,
                             "vision_backend": "onnxruntime", "vision_onnx_path": str(exported["qwen2_5_vl"])})
    for i, frame in enumerate(frames(2)):
        session.add_frame(frame, stamp=i)
    before = session.status()
    square = [np.asarray(Image.fromarray(f).resize((112, 112))) for f in frames(2)]
    session.add_frame(square[0], stamp=2)
    with pytest.raises(ChunkError, match=r"takes a 6x8 patch grid \(frames of 160x120 at export\); "
                                         r"this chunk's frames give 8x8"):
        session.add_frame(square[1], stamp=3)
    after = session.status()
    assert after.cache.layer_tokens == before.cache.layer_tokens
    assert after.frames_in_memory == before.frames_in_memory == 2
    assert after.chunks_failed == 1


def test_the_benchmark_runs_and_writes_its_table(tmp_path):
    """bench/encoder_backends.py on the tiny models, one run each: the README's figures stay re-makable."""
    out = tmp_path / "encoder_backends.json"
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    done = subprocess.run([sys.executable, "bench/encoder_backends.py", "--only-tiny", "--reps", "1",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| torch / ort |" in done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["model"] for r in rows] == ["tiny-qwen2_5_vl", "tiny-llava_onevision"]
    for row in rows:
        assert row["providers"] == ["CPUExecutionProvider"]
        assert row["max_abs_diff"] <= EMBED_ATOL
        assert len(row["times_s"]["torch"]) == len(row["times_s"]["onnxruntime"]) == 4
        assert row["ratio_torch_over_ort"] == pytest.approx(row["torch_ms"] / row["onnxruntime_ms"])
