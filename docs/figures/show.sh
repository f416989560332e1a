#!/usr/bin/env bash
# The pictures of docs/show.md and the README, made by the shipped commands: streamcache_node with an
# archive in a temporary folder and two standing questions, the demo bag (data/demo_bag) replayed into
# it in lock-step, then `streamcache-ask --when` with --save-images and --plot, and
# `streamcache-archive sheet` and `map` (the demo bag is a patrol: its odometry gives every frame a
# pose). The node is stopped at the end (SIGINT), the folder removed.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck disable=SC1091
source scripts/env.sh
NS=/show_figures
QUESTION="Did you see a yellow square?"
work=$(mktemp -d)
python -m streamcache_ros.node.main --namespace "$NS" --ros-args -p archive_path:="$work/archive" \
    -p pose_topic:=/odom -p places_file:=data/demo_bag/places.yaml \
    -p "watch_questions:=['$QUESTION', 'Did you see a yellow triangle?']" >"$work/node.log" 2>&1 &
node=$!
trap 'kill -INT $node 2>/dev/null; wait $node || true; rm -rf "$work"' EXIT
python -m streamcache_ros.tools.replay data/demo_bag --lock-step --fast --namespace "$NS"
ask() { python -m streamcache_ros.client.ask_cli --namespace "$NS" "$@"; }
ask --when last --save-images "$work/frames" "$QUESTION"
cp "$work"/frames/*.jpg docs/figures/when_last.jpg
ask --when timeline --plot docs/figures/when_timeline.png "$QUESTION" >/dev/null
streamcache_archive() { python -m streamcache_ros.tools.archive_cli --archive "$work/archive" "$@"; }
streamcache_archive sheet --since 1700000000 --until 1700000047 --columns 8 docs/figures/contact_sheet.png
streamcache_archive map --identity "yellow square" --places data/demo_bag/places.yaml --size 640 520 \
    --out docs/figures/where_map.png
streamcache_archive check
