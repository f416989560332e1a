"""The main job (scripts/demo.sh -> streamcache-node-demo) end to end on a small bag: the node in its
own process, the replay, the service, the action, memory status, diagnostics, a clean stop."""
import subprocess

import pytest

from node_procs import HANG_GUARD_S, ROOT, child_env, needs_install, new_domain, python_module
from streamcache_ros.tools import bagfile

WAYS = [pytest.param(["--without-launch"], "streamcache_node stopped (exit code 0)", id="console-entries"),
        pytest.param([], "ros2 launch stopped (exit code 0)", id="ros2-launch", marks=needs_install)]


@pytest.mark.parametrize(("way", "stopped"), WAYS)
def test_node_demo_runs_end_to_end(tmp_path, way, stopped):
    bag = bagfile.make_bag(tmp_path / "bag", frames=40, fps=2.0)
    done = subprocess.run(python_module("streamcache_ros.tools.demo", "--bag", str(bag), "--policy", "fifo", *way),
                          cwd=ROOT, env=child_env(new_domain()), capture_output=True, text=True, timeout=HANG_GUARD_S)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "40 messages on /camera/image_raw" in out and "40 acknowledged" in out
    assert out.count("  A: ") == 3  # two service answers and the streamed one
    assert "feedback messages; result success=True" in out
    assert "unknown camera '/no/such/camera'" in out
    # 40 frames at 2 fps -> 20 sampled; budget 96 tokens = 8 two-frame units: 16 frames kept
    assert "fifo, model tiny-qwen2_5_vl: 16 frames in memory" in out
    assert "streamcache_node: memory" in out and "streamcache_node: latency" in out
    assert stopped in out
