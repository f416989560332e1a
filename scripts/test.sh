#!/usr/bin/env bash
# Run the test suite (sets up first when needed: the set-up is idempotent and quick once done).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# shellcheck disable=SC1091
source scripts/env.sh
# A test domain of its own, localhost only, so parallel runs and other robots do not interfere.
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-$(( (RANDOM % 100) + 100 ))}
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
export HF_HUB_OFFLINE=1
# the tiny test models are faster on one thread, and node subprocesses then share the cores fairly
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
set +e
python -m pytest -q -p no:cacheprovider "$@" test
status=$?
set -e
# pytest exits 5 when it collected no tests: that is a failure here, never a pass.
if [ "$status" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$status"
