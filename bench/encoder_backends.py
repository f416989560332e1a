"""Vision encoder time per chunk: torch vs onnxruntime, measured in one run (ratios), same threads.

    python bench/encoder_backends.py            # CPU: both tiny models + two vision towers at real width
    python bench/encoder_backends.py --gpu      # CUDA machine: torch on cuda vs the CUDA (and TensorRT) EP

Models: the two bundled tiny models, and two randomly initialised models built from the real config
classes with the real vision widths of Qwen2.5-VL-3B (ViT 1280 wide, 16 heads, MLP 3420, window 112,
merger to 2048) and LLaVA-OneVision-0.5B (SigLIP 1152 wide, 16 heads, MLP 4304, 384 px, projector
to 896) but fewer vision blocks on the CPU (time per block is what differs between backends; the
full depth with --full-depth or --gpu) and a one-layer text model (the language model is not timed).
Each chunk's pixels are preprocessed once; only the encoder call is timed, the two backends
alternating, after one warm-up each; the median of --reps runs is reported. The ONNX files are
exported by the same code as streamcache-export-encoder. Prints a table, writes
bench/results/encoder_backends[_gpu].json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from streamcache_ros import world  # noqa: E402
from streamcache_ros.engine.adapters import load_adapter, load_image_processor  # noqa: E402
from streamcache_ros.engine.adapters.llava_onevision import LlavaOnevisionAdapter  # noqa: E402
from streamcache_ros.engine.adapters.onnx_export import export_vision_encoder, quiet_exporter_logs  # noqa: E402
from streamcache_ros.engine.adapters.onnx_vision import OnnxVisionEncoder  # noqa: E402
from streamcache_ros.engine.adapters.qwen2_5_vl import Qwen25VLAdapter  # noqa: E402
from streamcache_ros.engine.adapters.models import BUNDLED_DIR  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# Real vision sizes (configs of Qwen/Qwen2.5-VL-3B-Instruct and llava-hf/llava-onevision-qwen2-0.5b-ov-hf)
QWEN_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=2,
                   window_size=112, fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu")
SIGLIP_VISION = dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304,
                     num_attention_heads=16, num_hidden_layers=26, image_size=384, patch_size=14,
                     vision_use_head=False)
LLAVA_TEXT_HIDDEN = 896


def _small_text(hidden: int, heads: int) -> dict:
    return dict(vocab_size=640, hidden_size=hidden, intermediate_size=256, num_hidden_layers=1,
                num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=32768,
                tie_word_embeddings=False)


def realistic_qwen(blocks: int) -> Qwen25VLAdapter:
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration  # noqa: PLC0415

    vision = dict(QWEN_VISION, depth=blocks,
                  # one full-attention block in every 8, as in the real model (the last of each 8)
                  fullatt_block_indexes=[i for i in range(blocks) if i % 8 == 7] or [blocks - 1])
    text = _small_text(QWEN_VISION["out_hidden_size"], 16)
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    tiny = BUNDLED_DIR / "tiny-qwen2_5_vl"
    # the real processor's pixel bounds (min 56x56, max 12845056 pixels)
    processor = load_image_processor(str(tiny), "qwen2_5_vl",
                                     size={"shortest_edge": 56 * 56, "longest_edge": 12845056})
    return Qwen25VLAdapter(model, AutoTokenizer.from_pretrained(tiny), processor,
                           f"qwen2_5_vl-3b-vision-{blocks}blocks")


def realistic_llava(layers: int) -> LlavaOnevisionAdapter:
    from transformers import (AutoTokenizer, LlavaOnevisionConfig,  # noqa: PLC0415
                              LlavaOnevisionForConditionalGeneration)

    config = LlavaOnevisionConfig(text_config=dict(_small_text(LLAVA_TEXT_HIDDEN, 14), model_type="qwen2"),
                                  vision_config=dict(SIGLIP_VISION, num_hidden_layers=layers),
                                  vision_feature_layer=-1, vision_feature_select_strategy="full",
                                  image_grid_pinpoints=[[384, 384]], tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlavaOnevisionForConditionalGeneration(config).eval()
    tiny = BUNDLED_DIR / "tiny-llava_onevision"
    processor = load_image_processor(str(tiny), "llava_onevision", size={"height": 384, "width": 384})
    return LlavaOnevisionAdapter(model, AutoTokenizer.from_pretrained(tiny), processor,
                                 f"llava_onevision-0.5b-vision-{layers}layers")


def chunk_frames(count: int, size: tuple[int, int]) -> list[np.ndarray]:
    """``count`` frames of the fixed shape-world stream drawn at ``size`` (width, height)."""
    width, height = size
    return list(world.world_frames(count, height=height, width=width))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(name: str, adapter, frame_size, frames: int, reps: int, providers, threads: int,
            device: str = "cpu") -> dict:
    """Export (from the CPU float32 model), move the model to ``device``, then time the encoder call
    of both backends on one chunk, alternating."""
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        onnx_path = export_vision_encoder(adapter, tmp, frame_size=frame_size)
        export_s = time.perf_counter() - started
        if device != "cpu":
            adapter.model.to(device)
            adapter.device = torch.device(device)
        size_mb = sum(f.stat().st_size for f in pathlib.Path(tmp).iterdir()) / 1e6
        onnx = OnnxVisionEncoder(str(onnx_path), adapter, providers=providers, threads=threads)
        inputs = adapter.preprocess(chunk_frames(frames, frame_size))

        def run_torch():
            with torch.inference_mode():
                out = adapter.vision_encoder(inputs.tensors)
            _sync(device)
            return out

        def run_onnx():
            return onnx(inputs.tensors)

        expected, got = run_torch().float().cpu(), run_onnx()  # warm-up, and the difference
        times = {"torch": [], "onnxruntime": []}
        for _ in range(reps):
            for backend, run in (("torch", run_torch), ("onnxruntime", run_onnx)):
                t0 = time.perf_counter()
                run()
                times[backend].append(time.perf_counter() - t0)
    torch_ms = statistics.median(times["torch"]) * 1e3
    onnx_ms = statistics.median(times["onnxruntime"]) * 1e3
    # the best run of each: what the backends do when the shared machine leaves them alone
    best_ratio = min(times["torch"]) / min(times["onnxruntime"])
    return {"model": name, "family": adapter.family, "frame_size": f"{frame_size[0]}x{frame_size[1]}",
            "frames": frames, "tokens": int(expected.shape[0]),
            "vision_params_m": round(_vision_params(adapter) / 1e6, 1),
            "torch_ms": torch_ms, "onnxruntime_ms": onnx_ms, "ratio_torch_over_ort": torch_ms / onnx_ms,
            "best_ratio_torch_over_ort": best_ratio,
            "max_abs_diff": float((got - expected).abs().max()), "providers": onnx.providers,
            "provider": onnx.providers[0].removesuffix("ExecutionProvider"),
            "export_s": export_s, "onnx_mb": size_mb, "torch_device": device, "reps": reps,
            "times_s": times}


def _vision_params(adapter) -> int:
    model = adapter.model.model
    parts = [model.visual] if adapter.family == "qwen2_5_vl" else [model.vision_tower, model.multi_modal_projector]
    return sum(p.numel() for part in parts for p in part.parameters())


def table(rows: list[dict]) -> str:
    columns = [("model", "model"), ("vision_params_m", "vision params (M)"), ("frame_size", "frame"),
               ("frames", "frames/chunk"), ("tokens", "tokens"), ("torch_ms", "torch ms (median)"),
               ("onnxruntime_ms", "onnxruntime ms (median)"), ("ratio_torch_over_ort", "torch / ort"),
               ("best_ratio_torch_over_ort", "torch / ort (best runs)"),
               ("max_abs_diff", "max abs diff"), ("provider", "onnxruntime EP")]

    def cell(key, value):
        if key == "max_abs_diff":
            return f"{value:.1e}"
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(k, r[k]) for k, _ in columns) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", action="store_true", help="torch on cuda vs onnxruntime's CUDA/TensorRT EPs, "
                                                           "full-depth towers at 640x480 (needs onnxruntime-gpu)")
    parser.add_argument("--full-depth", action="store_true", help="the real number of vision blocks")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="CPU threads for both backends (default: torch's)")
    parser.add_argument("--providers", default=None,
                        help="onnxruntime providers (default: cpu; with --gpu: auto = TensorRT, CUDA, CPU)")
    parser.add_argument("--only-tiny", action="store_true", help="skip the real-width towers")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    quiet_exporter_logs()
    torch.set_num_threads(args.threads)
    device = "cuda" if args.gpu else "cpu"
    providers = args.providers or ("auto" if args.gpu else "cpu")
    full = args.full_depth or args.gpu
    frame_size = (640, 480) if args.gpu else (320, 240)
    frames = 8 if args.gpu else 4

    rows = []
    for name in ("tiny-qwen2_5_vl", "tiny-llava_onevision"):
        adapter = load_adapter(name, device="cpu", dtype="float32")
        rows.append(measure(name, adapter, (640, 480), 8, args.reps * 4, providers, args.threads, device))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    if not args.only_tiny:
        for build, depth in ((realistic_qwen, 32 if full else 8), (realistic_llava, 26 if full else 4)):
            adapter = build(depth)
            rows.append(measure(adapter.model_id, adapter, frame_size, frames, args.reps, providers,
                                args.threads, device))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
            del adapter
    print()
    print(table(rows))
    machine = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "python": platform.python_version(), "torch": torch.__version__,
               "onnxruntime": __import__("onnxruntime").__version__, "cpu_count": os.cpu_count(),
               "threads": args.threads, "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    out = args.out or RESULTS / ("encoder_backends_gpu.json" if args.gpu else "encoder_backends.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
