#!/usr/bin/env bash
# Every benchmark on a CUDA GPU, as one command; results (JSON, PNG, log) in OUT_DIR
# (default: $OUT when set, else bench/results/gpu).
#   bench/gpu.sh [OUT_DIR]          # everything; the real-width run first (a few minutes)
#   bench/gpu.sh OUT_DIR --real     # only the real-width run (bench/real_shapes.py)
# Attention runs through flash-attn when it imports, else PyTorch SDPA on CUDA (torch 2.11 and
# transformers 5.17 or 5.24). Needs torch with CUDA; matplotlib is optional (no plot without it).
# Nothing is downloaded: every model is built in memory from the real config classes.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/results/gpu}}"
only_real="${2:-}"
mkdir -p "$out"
exec > >(tee "$out/gpu.log") 2>&1
python - <<'PY'
import importlib.util, sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"bench/gpu.sh: CUDA is not available to torch {torch.__version__}")
print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
print(f"flash-attn: {'yes' if importlib.util.find_spec('flash_attn') else 'no (SDPA)'}; "
      f"matplotlib: {'yes' if importlib.util.find_spec('matplotlib') else 'no (no plot)'}")
PY
echo "== Real widths: Qwen2.5-VL-3B and LLaVA-OV-0.5B shapes, every policy, 64/256/512 frames (bf16) =="
python bench/real_shapes.py --device cuda --out "$out" --figure "$out/real_shapes-gpu.png"
if [ "$only_real" = "--real" ]; then exit 0; fi
echo "== H2SVC per-eviction update (STCE) =="
python bench/stce_update.py --device cuda --out "$out"
echo "== End to end on the tiny models =="
python bench/e2e_tiny.py --device cuda --out "$out"
echo "== Cache cost at real shapes (store + compress), the full cache measured to 2048 frames =="
python bench/cache_cost.py --device cuda --memory-fraction 0.6 --out "$out"
echo "== Cache cost at real shapes with each chunk's attention (prefill) =="
python bench/cache_cost.py --device cuda --attention --checkpoints 16 64 256 1024 --full-max-frames 512 \
  --name cache_cost_attention --out "$out"
