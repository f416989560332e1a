"""The built-in stand-in for diagnostic_updater gives the same statuses (level, message, keys) as the
real module for the same events, so /diagnostics reads the same on a machine without the wheel."""
import time

import pytest
from diagnostic_msgs.msg import DiagnosticStatus

from node_procs import ros_library
from streamcache_ros.node import diagnostics_fallback as fallback

upstream = ros_library("diagnostic_updater")  # a skip where the wheel is missing, a failure on CI
LIBS = [upstream, fallback]


def run(task, lib):
    stat = lib.DiagnosticStatusWrapper()
    stat.summary(DiagnosticStatus.ERROR, "No message was set")
    out = task.run(stat)
    return out.level, out.message, [kv.key for kv in out.values]


def frequency(lib, ticks, bound):
    task = lib.FrequencyStatus(lib.FrequencyStatusParam(bound, 0.1, 5), "rate")
    for _ in range(ticks):
        task.tick()
    return task


@pytest.mark.parametrize("ticks, bound, level", [
    (0, {"min": 1.0}, DiagnosticStatus.ERROR),  # silent camera
    (50, {"min": 1.0}, DiagnosticStatus.OK),  # 50 events in a few ms: far above 1 Hz
    (50, {"min": 1.0, "max": 2.0}, DiagnosticStatus.WARN),  # ... and above a maximum
])
def test_frequency_status_matches_upstream(ticks, bound, level):
    results = [run(frequency(lib, ticks, dict(bound)), lib) for lib in LIBS]
    assert results[0][0] == level
    assert results[0] == results[1]


@pytest.mark.parametrize("stamps, level", [
    ([], DiagnosticStatus.WARN),  # no data since the last update
    ([lambda: time.time()], DiagnosticStatus.OK),
    ([lambda: time.time() - 60.0], DiagnosticStatus.ERROR),  # a minute old, limit 5 s
    ([lambda: time.time() + 60.0], DiagnosticStatus.ERROR),  # from the future
    ([lambda: 0.0], DiagnosticStatus.WARN),  # upstream: a zero stamp alone is "no data"
    ([lambda: time.time(), lambda: 0.0], DiagnosticStatus.ERROR),  # ... and among others an error
])
def test_timestamp_status_matches_upstream(stamps, level):
    results = []
    for lib in LIBS:
        task = lib.TimeStampStatus(lib.TimeStampStatusParam(-1.0, 5.0), "stamps")
        for stamp in stamps:
            task.tick(stamp())
        results.append(run(task, lib))
    assert results[0][0] == level
    assert results[0] == results[1]


def test_composite_merges_like_upstream():
    results = []
    for lib in LIBS:
        composite = lib.CompositeDiagnosticTask("camera /cam")
        composite.addTask(frequency(lib, 50, {"min": 1.0}))
        stamps = lib.TimeStampStatus(lib.TimeStampStatusParam(-1.0, 5.0), "stamps")  # no data: WARN
        composite.addTask(stamps)

        def counters(stat):
            stat.summary(DiagnosticStatus.WARN, "3 frame(s) rejected")
            stat.add("Frames rejected", "3")
            return stat
        composite.addTask(lib.FunctionDiagnosticTask("frames", counters))
        results.append(run(composite, lib))
    assert results[0][0] == DiagnosticStatus.WARN
    assert results[0][1] == "No data since last update.; 3 frame(s) rejected"
    assert results[0] == results[1]
