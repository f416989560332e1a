"""Two robots on one ROS domain: streamcache_node in /robot_a and /robot_b (docs/interfaces.md
"Diagnostics", docs/deployment.md). Each one's /diagnostics statuses carry its fully qualified name,
and the hardware id is that name, so rqt_robot_monitor tells them apart, and the per-robot
aggregator groups (config/diagnostic_aggregator_robots.yaml) take each robot's statuses and no
other's; each answers on its own services. Timeouts only guard against hangs."""
import pytest
import yaml

from node_procs import ROOT, Probe, Proc, child_env, client_of, status_name, tiny_node

ROBOTS = ("/robot_a", "/robot_b")


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
        wanted = {status_name(ns, task) for ns in ROBOTS for task in ("memory", "latency", "index", f"camera {ns}/cam")}
        probe.wait_for(lambda: wanted <= {s.name for a in arrays for s in a.status}, what="both robots' statuses")
        seen = {s.name: s for a in list(arrays) for s in a.status}
        for ns in ROBOTS:
            assert seen[status_name(ns, "memory")].hardware_id == f"{ns}/streamcache_node"
            assert seen[status_name(ns, "latency")].hardware_id == f"{ns}/streamcache_node"
        assert not any(name.startswith("streamcache_node:") for name in seen)  # no bare names left
    finally:
        probe.close()


def generic_analyzers(group: dict, path: str = ""):
    """(path, parameters) of every GenericAnalyzer under an AnalyzerGroup's parameters."""
    for name, value in group.items():
        if isinstance(value, dict) and value.get("type") == "diagnostic_aggregator/GenericAnalyzer":
            yield f"{path}/{value['path']}", value
        elif isinstance(value, dict) and value.get("type") == "diagnostic_aggregator/AnalyzerGroup":
            yield from generic_analyzers(value["analyzers"], f"{path}/{value['path']}")


def claims(analyzer: dict, name: str) -> bool:
    """GenericAnalyzer's match on a status name, for the keys the file uses (startswith, contains)."""
    assert set(analyzer) <= {"type", "path", "startswith", "contains", "remove_prefix", "timeout", "num_items"}
    return (any(name.startswith(p) for p in analyzer.get("startswith", []))
            or any(c in name for c in analyzer.get("contains", [])))


def test_the_aggregator_groups_each_robots_statuses_under_its_name(domain, nodes):
    from diagnostic_msgs.msg import DiagnosticArray  # noqa: PLC0415
    from rclpy.qos import QoSProfile  # noqa: PLC0415

    config = yaml.safe_load((ROOT / "config" / "diagnostic_aggregator_robots.yaml").read_text())["analyzers"]
    analyzers = dict(generic_analyzers(config["ros__parameters"], "/" + config["ros__parameters"]["path"]))
    probe = Probe(domain)
    try:
        arrays = probe.collect(DiagnosticArray, "/diagnostics", QoSProfile(depth=100))
        wanted = {status_name(ns, task) for ns in ROBOTS for task in ("memory", "latency", "index", f"camera {ns}/cam")}
        probe.wait_for(lambda: wanted <= {s.name for a in arrays for s in a.status}, what="both robots' statuses")
        names = {s.name for a in list(arrays) for s in a.status}
    finally:
        probe.close()
    grouped = {path: sorted(n for n in names if claims(a, n)) for path, a in analyzers.items()}
    for ns in ROBOTS:
        robot = ns.strip("/")
        assert grouped[f"/Robots/{robot}/StreamCache/Cameras"] == [status_name(ns, f"camera {ns}/cam")]
        assert grouped[f"/Robots/{robot}/StreamCache/Memory"] == [status_name(ns, "memory")]
        assert grouped[f"/Robots/{robot}/StreamCache/Latency"] == [status_name(ns, "latency")]
        assert grouped[f"/Robots/{robot}/StreamCache/Index"] == [status_name(ns, "index")]
    assert all(len(grouped[p]) == a["num_items"] for p, a in analyzers.items() if "num_items" in a)
