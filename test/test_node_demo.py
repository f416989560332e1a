"""The main job (scripts/demo.sh -> streamcache-node-demo) end to end on a small world bag: the node in
its own process, the replay, the world's questions through the service with the truth beside each
answer, the action, memory status, diagnostics, a clean stop."""
import json
import re
import subprocess

import numpy as np
import pytest

from node_procs import HANG_GUARD_S, ROOT, child_env, needs_install, new_domain, python_module
from streamcache_ros import world
from streamcache_ros.engine import load_adapter
from streamcache_ros.engine.adapters.models import DEFAULT_MODEL
from streamcache_ros.tools import bagfile

# the console entries replay a patrol (frames and odometry: the demo asks a `where`), the launch a
# world bag with no odometry (a bag given with --bag is replayed as it is)
WAYS = [pytest.param(["--without-launch"], "streamcache_node stopped (exit code 0)", True, id="console-entries"),
        pytest.param([], "ros2 launch stopped (exit code 0)", False, id="ros2-launch", marks=needs_install)]
FRAMES, KEPT_UNITS = 40, 6


@pytest.mark.parametrize(("way", "stopped", "patrol"), WAYS)
def test_node_demo_runs_end_to_end(tmp_path, way, stopped, patrol):
    look = world.Look(320, 240, (40, 50, 60), 4, 10, False, "rgb8")
    bag = (bagfile.make_patrol_bag(tmp_path / "bag", seed=22, frames=FRAMES, look=look) if patrol
           else bagfile.make_world_bag(tmp_path / "bag", seed=23, frames=FRAMES, look=look))
    record = json.loads((bag / bagfile.WORLD_QUESTIONS_FILE).read_text())
    asked = [q for q in record["questions"] if q["options"]]
    adapter = load_adapter(DEFAULT_MODEL, device="cpu", dtype="float32")
    inputs = adapter.preprocess([np.zeros((240, 320, 3), np.uint8)] * adapter.frames_per_unit)
    budget = KEPT_UNITS * inputs.tokens_per_unit
    done = subprocess.run(python_module("streamcache_ros.tools.demo", "--bag", str(bag), "--policy", "fifo",
                                        "--budget", str(budget), *way),
                          cwd=ROOT, env=child_env(new_domain()), capture_output=True, text=True, timeout=HANG_GUARD_S)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert f"{FRAMES} messages on /camera/image_raw" in out and f"{FRAMES} acknowledged" in out
    # every question with options, its answer beside the truth, a running score
    assert out.count("      node: ") == len(asked) >= 3
    for q in asked:
        assert f"truth: {q['answer']!r}" in out
    scores = [int(m) for m in re.findall(r"accuracy so far (\d+)/\d+", out)]
    assert len(scores) == len(asked) and scores == sorted(scores)
    assert f"accuracy: {scores[-1]}/{len(asked)}" in out
    assert "feedback messages; result success=True" in out
    # when, searched in the memory, beside the true stamp, for each mode the stream asks
    modes = {"last" if q["kind"] == "last_seen" else "first" for q in record["questions"]
             if q["kind"] in ("last_seen", "first_seen")}
    assert modes and all(re.search(rf"when {mode}: .*\n      found: .* truth: \d+ s", out) for mode in modes), out
    # where: the pose of the frame found beside the robot's true pose, only for a bag with odometry
    where = re.search(r"found: x=\S+ y=\S+ \(map\) at \d+ s   truth: x=\S+ y=\S+, \w+.*\s+(right|WRONG) "
                      r"\(([\d.]+) m off", out)
    assert (where is not None) == patrol, out
    assert not patrol or float(where.group(2)) <= 1.0
    assert "unknown camera '/no/such/camera'" in out
    # 40 frames at 1 fps, all sampled; fifo keeps KEPT_UNITS units of the stream
    assert f"fifo, model {DEFAULT_MODEL}: {KEPT_UNITS * adapter.frames_per_unit} frames in memory" in out
    assert "streamcache_node: memory" in out and "streamcache_node: latency" in out
    assert stopped in out
