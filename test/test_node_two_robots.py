"""Two robots on one ROS domain: streamcache_node in /robot1 and /robot2 (docs/interfaces.md
"Diagnostics"). Each one's /diagnostics statuses carry its fully qualified name, and the hardware id
is that name, so rqt_robot_monitor tells them apart; each answers on its own services. Timeouts
only guard against hangs."""
import pytest

from node_procs import Probe, Proc, child_env, client_of, status_name, tiny_node

ROBOTS = ("/robot1", "/robot2")


@pytest.fixture(scope="module")
def nodes(domain):
    procs = [Proc(tiny_node(ns, [f"{ns}/cam"]), child_env(domain)) for ns in ROBOTS]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.__exit__(None, None, None)


def test_diagnostics_tell_two_robots_apart(domain, nodes):
    from diagnostic_msgs.msg import DiagnosticArray  # noqa: PLC0415
    from rclpy.qos import QoSProfile  # noqa: PLC0415

    for proc, ns in zip(nodes, ROBOTS):
        with client_of(proc, domain, ns) as client:  # each answers in its own namespace
            assert client.memory_status().frames_in_memory == 0
    probe = Probe(domain)
    try:
        arrays = probe.collect(DiagnosticArray, "/diagnostics", QoSProfile(depth=100))
        wanted = {status_name(ns, task) for ns in ROBOTS for task in ("memory", "latency", f"camera {ns}/cam")}
        probe.wait_for(lambda: wanted <= {s.name for a in arrays for s in a.status}, what="both robots' statuses")
        seen = {s.name: s for a in list(arrays) for s in a.status}
        for ns in ROBOTS:
            assert seen[status_name(ns, "memory")].hardware_id == f"{ns}/streamcache_node"
            assert seen[status_name(ns, "latency")].hardware_id == f"{ns}/streamcache_node"
        assert not any(name.startswith("streamcache_node:") for name in seen)  # no bare names left
    finally:
        probe.close()
