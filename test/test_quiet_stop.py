"""A stop prints nothing alarming (docs/reliability.md, "Lifecycle"): nodes stopped
with SIGINT and SIGTERM, many times, each writing its memory snapshot (so it logs while stopping),
end with exit code 0 and none of "Failed to publish log message to rosout" (every stop printed it),
a traceback, KeyboardInterrupt or "Exception ignored" (one Ctrl-C in six printed a KeyboardInterrupt
traceback from RcutilsLogger.__del__). Five nodes per signal run at once, as on a robot's shutdown."""
import signal

import pytest

from node_procs import HANG_GUARD_S, Proc, child_env, new_domain, tiny_node

STOPS = 5  # nodes per signal
ALARMING = ("Failed to publish", "Traceback", "KeyboardInterrupt", "Exception ignored", "Segmentation", "[ERROR]")


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stops_are_quiet(tmp_path, stop_signal):
    domain = new_domain()
    nodes = [Proc(tiny_node(f"/quiet{i}", [f"/quiet{i}/cam"], memory_snapshot_path=tmp_path / f"m{i}.pt"),
                  child_env(domain)) for i in range(STOPS)]
    try:
        for proc in nodes:  # several nodes load a model at once: a longer guard
            proc.wait_for_output("active: listening on", 3 * HANG_GUARD_S)
        for proc in nodes:
            proc.popen.send_signal(stop_signal)
        for i, proc in enumerate(nodes):
            assert proc.wait() == 0, proc.output()
            log = proc.output()
            assert f"memory written to {tmp_path / f'm{i}.pt'} (shutdown)" in log, log
            assert not [word for word in ALARMING if word in log], log
    finally:
        for proc in nodes:
            proc.stop()
            proc.kill_group()
