"""The lifecycle for real, with the `ros2 lifecycle` CLI (docs/reliability.md, "Lifecycle"): a node
started with autostart false is configured, activated, deactivated, cleaned up, configured again and
shut down. Questions are refused while it is not active, reporting the memory it keeps; deactivate
keeps the memory, cleanup clears it (no memory_snapshot_path here); shutdown ends the process with
exit code 0. `streamcache-ask --status` on the inactive node says so at once instead of timing
out."""
import shutil
import subprocess
import time

import pytest

from node_procs import (HANG_GUARD_S, ON_CI, ROOT, Proc, child_env, client_of, new_domain, python_module,
                        replay_lock_step, ros2_env, stop_ros2_daemon, tiny_node)
from streamcache_ros.tools import bagfile

# skipped where the ros2 CLI is not installed; on CI, whose set-up installs it, it runs and fails instead
pytestmark = pytest.mark.skipif(shutil.which("ros2") is None and not ON_CI, reason="cannot run here: no ros2 CLI")

NS = "/sc_life"
NODE = f"{NS}/streamcache_node"
CAM = "/life/cam"


def lifecycle(domain, *args) -> str:
    """`ros2 lifecycle <args>`; retried while the CLI's daemon has not discovered the node yet."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        done = subprocess.run(["ros2", "lifecycle", *args], cwd=ROOT, env=ros2_env(domain), capture_output=True,
                              text=True, timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL)
        if done.returncode == 0 or time.monotonic() > deadline or "not found" not in done.stdout + done.stderr:
            assert done.returncode == 0, f"ros2 lifecycle {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
            return done.stdout
        time.sleep(1.0)


def state(domain) -> str:
    return lifecycle(domain, "get", NODE).split()[0]


def transition(domain, name):
    assert "Transitioning successful" in lifecycle(domain, "set", NODE, name)


@pytest.fixture(scope="module")
def domain():
    d = new_domain()
    yield d
    assert not stop_ros2_daemon(d), "the ros2 daemon still runs after `ros2 daemon stop`"


def test_configure_activate_deactivate_cleanup_shutdown(domain, tmp_path):
    bag = bagfile.make_bag(tmp_path / "bag", frames=16, fps=2.0, topic=CAM)  # 8 frames sampled at 1 fps
    with Proc(tiny_node(NS, [CAM], autostart=False, budget_tokens=96), child_env(domain)) as node:
        assert state(domain) == "unconfigured"
        # said at once (it once waited the whole --wait, 15 s, and exited 3): an unconfigured node
        # answers its state, and serves nothing until configured
        unconfigured = subprocess.run(python_module("streamcache_ros.client.ask_cli", "--namespace", NS, "--status"),
                                      cwd=ROOT, env=child_env(domain), capture_output=True, text=True,
                                      timeout=HANG_GUARD_S)
        assert unconfigured.returncode == 1 and f"{NODE} is unconfigured" in unconfigured.stderr, unconfigured.stderr
        transition(domain, "configure")
        assert state(domain) == "inactive"
        with client_of(node, domain, NS) as client:
            refused = client.ask("What is on the table?")
            assert not refused.success and "is not active" in refused.error_message
            status = subprocess.run(python_module("streamcache_ros.client.ask_cli", "--namespace", NS, "--status"),
                                    cwd=ROOT, env=child_env(domain), capture_output=True, text=True,
                                    timeout=HANG_GUARD_S)
            assert status.returncode == 1 and f"{NODE} is inactive, not active" in status.stderr, status.stderr
            transition(domain, "activate")
            replay_lock_step(domain, bag, NS, "--fast")
            assert client.ask("What is on the table?").frames_in_memory == 8
            transition(domain, "deactivate")
            refused = client.ask("What is on the table?")
            assert not refused.success and refused.frames_in_memory == 8  # kept, and said
            transition(domain, "activate")
            assert client.ask("What is on the table?").frames_in_memory == 8
            transition(domain, "deactivate")
            transition(domain, "cleanup")
            assert state(domain) == "unconfigured"
            transition(domain, "configure")
            transition(domain, "activate")
            # cleanup dropped the working memory; the archive kept the chunk, and a plain question
            # reads it rather than being refused
            reread = client.ask("What is on the table?")
            assert reread.success and reread.recalled_chunks >= 1 and reread.frames_in_memory == 8, reread.error_message
        transition(domain, "shutdown")
        assert node.wait() == 0, node.output()
        assert "Traceback" not in node.output()
