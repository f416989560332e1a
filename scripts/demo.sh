#!/usr/bin/env bash
# The main job through ROS 2: streamcache_node in its own process, the demo bag (data/demo_bag)
# replayed into it, questions through the Ask service and the Ask action, memory status and
# /diagnostics printed, every process stopped at the end. Extra arguments go to streamcache-node-demo
# (e.g. --policy fifo --budget 96). The engine alone, without ROS: streamcache-demo.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/env.sh
exec python -m streamcache_ros.tools.demo "$@"  # streamcache-node-demo, from this checkout
