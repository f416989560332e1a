#!/usr/bin/env bash
# Every benchmark on this machine's CPU, one after another: tables on stdout, JSON (and a PNG) in
# bench/results/ or the folder given.
#   bench/run_all.sh [--quick] [OUT_DIR]
# --quick: shorter streams (cache cost to 256 frames, end to end to 256 frames), for a first look.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
out="${1:-bench/results}"
if ! python -c "import torch" 2>/dev/null && [ -f scripts/env.sh ]; then
  # shellcheck disable=SC1091
  source scripts/env.sh
fi
if [ "$quick" = 1 ]; then
  cache_args=(--checkpoints 16 32 64 128 256)
  e2e_args=(--lengths 16 64 256)
else
  cache_args=()
  e2e_args=()
fi
echo "== H2SVC per-eviction update (STCE) =="
python bench/stce_update.py --out "$out"
echo
echo "== End to end on the tiny models =="
python bench/e2e_tiny.py --out "$out" "${e2e_args[@]}"
echo
echo "== Cache cost at real shapes =="
python bench/cache_cost.py --out "$out" "${cache_args[@]}"
