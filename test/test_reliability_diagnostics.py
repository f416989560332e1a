"""Diagnostics of faults (docs/reliability.md, "Faults survived"): a silent camera is WARN before
the rate's ERROR, stamps going back are WARN, a refused memory snapshot is WARN on the memory
status; the snapshot keeper's rule."""
import os
import time

import pytest
from diagnostic_msgs.msg import DiagnosticStatus

from streamcache_ros.engine import ConfigError, Session, SessionConfig, SnapshotError, make_policy
from streamcache_ros.node import diagnostics
from streamcache_ros.node.sampler import CameraCounters
from streamcache_ros.engine.memory.snapshots import read_state
from streamcache_ros.node.snapshots import SnapshotKeeper, check_path
from test_node_diagnostics import engine_status, run

OK, WARN, ERROR = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR
S = 1_000_000_000


def test_a_camera_going_silent_is_warn_then_the_rate_says_error(monkeypatch):
    counters = CameraCounters("/cam", 1.0)
    task = diagnostics.CameraTask(counters, lambda: True, lambda: 2.0)
    rate = diagnostics.updater_lib.FrequencyStatus(diagnostics.updater_lib.FrequencyStatusParam({"min": 1.0}, 0.1, 5))
    for i in range(8):  # a camera at 4 Hz for two seconds
        counters.arrived(i * S // 4)
        rate.tick()
    assert run(task.run)[0] == OK and run(rate.run)[0] == OK
    # silence: the task reads the age of the last frame on the monotonic clock, here made to read
    # 2.5 s after the last arrival (no wall clock: however slow the machine, the age is 2.5 s)
    with monkeypatch.context() as clock:
        clock.setattr(time, "monotonic", lambda: counters._last_arrival + 2.5)
        level, message, values = run(task.run)
    assert level == WARN and message.startswith("silent: no frame for 2.5"), message
    for _ in range(6):  # the rate task's window (5 updates) runs empty
        level = run(rate.run)[0]
    assert level == ERROR


def test_stamps_jumping_back_are_warn_once():
    counters = CameraCounters("/cam", 1.0)
    task = diagnostics.CameraTask(counters, lambda: True)
    for stamp in (10 * S, 11 * S, 12 * S):
        counters.arrived(stamp)
        counters.sampled(stamp)
    run(task.run)
    counters.arrived(0)  # the bag starts again
    counters.sampled(0)
    level, message, values = run(task.run)
    assert level == WARN and "stamps jumped back" in message and values["Time jumps back"] == "1"
    counters.arrived(S)
    counters.sampled(S)
    assert run(task.run)[0] == OK


def test_a_refused_snapshot_is_warn_on_the_memory_status():
    ctx = {"snapshot": "/x/memory.pt: refused", "snapshot_error": "memory snapshot refused: policy 'fifo' vs 'full'"}
    status = engine_status(policy="full", model_id="tiny", layer_tokens=[20, 20], budget_tokens=0)
    level, message, values = run(diagnostics.EngineTasks(lambda: diagnostics.EngineView(status, **ctx)).memory)
    assert level == WARN and message == ctx["snapshot_error"] and values["Memory snapshot"] == "/x/memory.pt: refused"


def test_snapshot_path_checks(tmp_path):
    assert check_path("") == ""
    assert check_path(str(tmp_path / "m.pt")) == str(tmp_path / "m.pt")
    with pytest.raises(ConfigError, match="parameter 'memory_snapshot_path': directory '/no/such/dir' does not exist"):
        check_path("/no/such/dir/m.pt")
    with pytest.raises(ConfigError, match="is a directory"):
        check_path(str(tmp_path))


def test_the_keeper_restores_refuses_and_never_overwrites_a_refused_file(qwen_adapter, frames, tmp_path):
    path = str(tmp_path / "memory.pt")

    def session(policy, **kwargs):
        return Session(qwen_adapter, make_policy(policy, **kwargs), SessionConfig(chunk_frames=4))

    first = session("fifo", budget_tokens=64)
    keeper = SnapshotKeeper(path)
    assert keeper.restore(first).startswith("no memory snapshot at") and keeper.state == "started empty"
    for i, frame in enumerate(frames(8)):
        first.add_frame(frame, stamp=float(i))
    assert keeper.write(first, "shutdown").startswith(f"memory written to {path} (shutdown)")
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # written through a temporary file

    again = session("fifo", budget_tokens=64)
    keeper = SnapshotKeeper(path)
    assert keeper.restore(again) == f"memory restored from {path}: 8 frames"
    assert again.status().frames_in_memory == 8

    other = session("full")
    keeper = SnapshotKeeper(path)
    before = open(path, "rb").read()
    line = keeper.restore(other)
    assert keeper.state == "refused" and "was made with policy 'fifo'; this node runs 'full'" in line
    assert other.status().frames_in_memory == 0 and "Starting with an empty memory" in line
    other.add_frame(frames(1)[0], stamp=0.0)
    assert keeper.write(other, "shutdown") == "" and open(path, "rb").read() == before
    smaller = session("fifo", budget_tokens=32)  # a budget changed since: loaded, compressed by the next chunk
    assert SnapshotKeeper(path).restore(smaller) == f"memory restored from {path}: 8 frames"
    assert read_state(path)["policy"] == "fifo"
    with pytest.raises(SnapshotError, match="cannot write snapshot '/no/such/dir/m.pt': folder '/no/such/dir' does not exist"):
        first.save("/no/such/dir/m.pt")
