"""streamcache-export-encoder: write a model's vision encoder as ONNX (+ sidecar) for vision_backend onnxruntime.

    streamcache-export-encoder --model Qwen/Qwen2.5-VL-3B-Instruct --out ~/encoders/qwen3b --frame-size 640x480

Then run the node with ``vision_backend:=onnxruntime vision_onnx_path:=~/encoders/qwen3b``. After the
export the ONNX encoder is run once on the CPU next to the torch encoder and the largest difference
is printed (and kept in the sidecar); ``--no-verify`` skips that.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ATOL = 1e-4  # float32 embeddings, torch vs onnxruntime (docs/vision-encoder.md, "Equality")


def _frame_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not WIDTHxHEIGHT (e.g. 640x480)") from None
    if width < 1 or height < 1:
        raise argparse.ArgumentTypeError(f"'{text}': width and height must be >= 1")
    return width, height


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="streamcache-export-encoder", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="bundled tiny model name, local directory or hub id "
                                                       "(the same string the node's model_path will hold)")
    parser.add_argument("--out", required=True, help="directory for vision_encoder.onnx and vision_encoder.json")
    parser.add_argument("--frame-size", type=_frame_size, default=(640, 480), metavar="WxH",
                        help="camera frame size (Qwen2.5-VL fixes the patch grid it gives; LLaVA-OneVision "
                             "resizes every frame to its tower's size and ignores this); default 640x480")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default 18)")
    parser.add_argument("--no-verify", action="store_true", help="skip the torch vs onnxruntime check")
    return parser.parse_args(argv)


def verify(adapter, onnx_path, frame_size) -> dict:
    """Largest |torch - onnxruntime| over random chunks of 1 and 3 units (CPU provider)."""
    import torch  # noqa: PLC0415

    from ..engine.adapters.onnx_vision import OnnxVisionEncoder  # noqa: PLC0415

    encoder = OnnxVisionEncoder(str(onnx_path), adapter, providers="cpu")
    rng = np.random.default_rng(1)
    width, height = frame_size
    worst = 0.0
    for units in (1, 3):
        frames = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
                  for _ in range(units * adapter.frames_per_unit)]
        tensors = adapter.preprocess(frames).tensors
        with torch.inference_mode():
            expected = adapter.vision_encoder(tensors).float()
        worst = max(worst, float((encoder(tensors) - expected).abs().max()))
    return {"max_abs_diff": worst, "atol": ATOL, "units": [1, 3], "provider": "CPUExecutionProvider"}


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from ..engine.adapters import load_adapter  # noqa: PLC0415
    from ..engine.adapters.onnx_export import (DEFAULT_OPSET, export_vision_encoder, quiet_exporter_logs,  # noqa
                                               sidecar_path)
    from ..engine.errors import StreamCacheError  # noqa: PLC0415

    quiet_exporter_logs()

    try:
        adapter = load_adapter(args.model, device="cpu", dtype="float32")
    except StreamCacheError as err:
        print(f"streamcache-export-encoder: {err}", file=sys.stderr)
        return 2
    try:
        onnx_path = export_vision_encoder(adapter, os.path.expanduser(args.out), frame_size=args.frame_size,
                                          opset=args.opset or DEFAULT_OPSET)
    except OSError as err:
        print(f"streamcache-export-encoder: cannot write to '{args.out}': {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # e.g. a frame size the processor cannot take
        print(f"streamcache-export-encoder: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # the exporter's own errors: one line, the report is in its output above
        print(f"streamcache-export-encoder: export failed: {type(err).__name__}: {str(err).splitlines()[0]}",
              file=sys.stderr)
        return 1
    side = sidecar_path(onnx_path)
    sidecar = json.loads(side.read_text())
    print(f"wrote {onnx_path} and {side.name}: model '{sidecar['model_id']}', config {sidecar['config_hash']}, "
          f"inputs {sidecar['inputs']}, fixed {sidecar['fixed']}")
    if args.no_verify:
        return 0
    check = verify(adapter, onnx_path, args.frame_size)
    sidecar["verified"] = check
    side.write_text(json.dumps(sidecar, indent=2) + "\n")
    ok = check["max_abs_diff"] <= ATOL
    print(f"torch vs onnxruntime (CPU): max |diff| {check['max_abs_diff']:.2e} "
          f"({'within' if ok else 'OVER'} atol {ATOL:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
