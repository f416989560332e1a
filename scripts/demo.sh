#!/usr/bin/env bash
# The main job: replay the bundled clip through streamcache with the bundled tiny model, print
# answers and memory diagnostics. Extra arguments go to streamcache-demo.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/env.sh
exec streamcache-demo "$@"
