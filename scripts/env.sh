# Source this (bash) for a shell with the venv, ROS 2 and the built interfaces:
#   source scripts/env.sh
# colcon's setup scripts read unset variables: relax nounset while sourcing, restore it after
case $- in *u*) _sc_nounset=1; set +u ;; *) _sc_nounset=0 ;; esac
_sc_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC1091
source "$_sc_root/.venv/bin/activate"
if [ -z "${ROS_DISTRO:-}" ]; then
  # ROS 2 from PyPI wheels: the venv is the ROS prefix (ros2 CLI, launch, ament index)
  case ":${AMENT_PREFIX_PATH:-}:" in *":$VIRTUAL_ENV:"*) ;; *) export AMENT_PREFIX_PATH="$VIRTUAL_ENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}" ;; esac
fi
if [ -f "$_sc_root/install/setup.bash" ]; then
  # shellcheck disable=SC1091
  source "$_sc_root/install/setup.bash"
fi
export TRANSFORMERS_VERBOSITY=${TRANSFORMERS_VERBOSITY:-error}
export HF_HUB_DISABLE_PROGRESS_BARS=1
[ "$_sc_nounset" = 1 ] && set -u
unset _sc_root _sc_nounset
