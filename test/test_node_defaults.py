"""`streamcache_node` with no arguments (docs/interfaces.md): the bundled world model, camera
/camera/image_raw, policy hermes, the root namespace; here on a machine WITHOUT
diagnostic_updater (hidden from the process), so /diagnostics comes from the built-in fallback with
the same statuses."""
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from node_procs import status_name, Probe, Proc, child_env, python_module, stamp_ns
from streamcache_ros import world

S = 1_000_000_000
DEFAULT_POLICY = "hermes"
NS = None  # the root namespace: the client finds the one node in the graph


@pytest.fixture(scope="module")
def node(domain, tmp_path_factory):
    hidden = tmp_path_factory.mktemp("no_diagnostic_updater")
    (hidden / "diagnostic_updater.py").write_text('raise ImportError("hidden by the test")\n')
    with Proc(python_module("streamcache_ros.node.main"), child_env(domain, extra_pythonpath=str(hidden))) as proc:
        yield proc


def test_defaults_without_diagnostic_updater(node, client, domain):
    assert client.namespace == ""  # services at /ask, /ask_action, ...
    status = client.memory_status()
    assert (status.policy, status.model_id) == (DEFAULT_POLICY, "world-qwen2_5_vl")
    assert status.budget_tokens == 96  # budget_tokens 0: the bundled world model's own (its streamcache.json)
    # a world question: the bundled model refuses others (docs/interfaces.md "Free-text answers")
    refused = client.ask("How many objects are in view now?")
    assert not refused.success and "no frames in memory yet" in refused.error_message

    probe = Probe(domain)
    try:
        acks = probe.collect(Header, "/frame_acks", QoSProfile(depth=100, reliability=QoSReliabilityPolicy.RELIABLE))
        arrays = probe.collect(DiagnosticArray, "/diagnostics", QoSProfile(depth=100))
        camera = probe.node.create_publisher(Image, "/camera/image_raw", QoSProfile(depth=10))
        probe.wait_for(lambda: camera.get_subscription_count() > 0, what="the node's subscription")
        for i in range(3):
            rgb = world.world_frame(i, 96, 128)  # the smallest 4:3 frame the shape world draws
            msg = Image(height=96, width=128, encoding="rgb8", step=128 * 3)
            msg.header.stamp.sec = 100 + i
            msg.data = rgb.tobytes()
            acked = lambda i=i: any(stamp_ns(a.stamp) == (100 + i) * S for a in acks)  # noqa: E731
            for _ in range(30):  # as a camera would, again: this writer seeing the node's reader does not
                camera.publish(msg)  # mean the reader has matched it yet (discovery is not symmetric)
                try:
                    probe.wait_for(acked, timeout=2.0, what="an ack")
                    break
                except TimeoutError:
                    continue
            probe.wait_for(acked, what="an ack")
        answer = client.ask("How many objects are in view now?")
        assert answer.success and answer.frames_in_memory == 3  # 1 fps sampling: all three, one second apart

        names = {status_name(NS, "camera /camera/image_raw"), status_name(NS, "memory"), status_name(NS, "latency")}
        probe.wait_for(lambda: any(names <= {s.name for s in a.status} for a in arrays), what="/diagnostics")
        array = next(a for a in arrays if names <= {s.name for s in a.status})
        camera_values = {kv.key: kv.value for s in array.status if s.name.endswith("/camera/image_raw")
                         for kv in s.values}
        assert {"Actual frequency (Hz)", "Latest timestamp delay:", "Frames received"} <= set(camera_values)

        # budget_tokens 0 stands for the model's 96: lower may be set while the node runs, higher not
        assert probe.set_parameter("/streamcache_node", "budget_tokens", 48).successful
        assert client.memory_status().budget_tokens == 48
        refused = probe.set_parameter("/streamcache_node", "budget_tokens", 97)
        assert not refused.successful and "above the budget configured (96)" in refused.reason
    finally:
        probe.close()
    assert node.stop() == 0
    assert "diagnostics via built-in fallback" in node.output()
    assert "Traceback" not in node.output()
