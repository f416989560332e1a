#!/usr/bin/env bash
# Every benchmark on a CUDA GPU, as one command; results (JSON, PNG, log) in OUT_DIR
# (default: $OUT when set, else bench/results/gpu).
#   bench/gpu.sh [OUT_DIR]
# Attention runs through flash-attn when it imports, else PyTorch SDPA on CUDA. Needs torch with
# CUDA and transformers (>= 5.17); matplotlib is optional (no plot without it). Nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench/results/gpu}}"
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
echo "== H2SVC per-eviction update (STCE) =="
python bench/stce_update.py --device cuda --out "$out"
echo "== End to end on the tiny models =="
python bench/e2e_tiny.py --device cuda --out "$out"
echo "== Cache cost at real shapes (store + compress), the full cache measured to 2048 frames =="
python bench/cache_cost.py --device cuda --memory-fraction 0.6 --out "$out"
echo "== Cache cost at real shapes with each chunk's attention (prefill) =="
python bench/cache_cost.py --device cuda --attention --checkpoints 16 64 256 1024 --full-max-frames 512 \
  --name cache_cost_attention --out "$out"
