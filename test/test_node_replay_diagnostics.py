"""The camera diagnostic over DDS (docs/interfaces.md "Diagnostics"): a bag recorded long ago,
stamped 1 s apart and replayed lock-step as fast as the node takes it, with no clock of its own, is
judged by its own clock and never "Timestamps too far in past" (it was ERROR for a whole run); a
camera whose frames arrive 30 s after their stamps, at its own pace, still goes ERROR. Timeouts only
guard against hangs."""
import time

import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image

from node_procs import Proc, child_env, replay_lock_step, status_name, tiny_node
from streamcache_ros.node.stream_clock import NODE_CLOCK, STREAM_CLOCK
from streamcache_ros.tools import bagfile

NS = "/sc_replay_diag"
FAST, LATE = "/fast/cam", "/late/cam"
S = 1_000_000_000
TOO_OLD = "Timestamps too far in past"


@pytest.fixture(scope="module")
def node(domain):
    with Proc(tiny_node(NS, [FAST, LATE]), child_env(domain)) as proc:
        yield proc


def camera_statuses(probe, topic, since=0):
    return [s for a in probe.diagnostics[since:] for s in a.status if s.name == status_name(NS, f"camera {topic}")]


def judged_by(status) -> str:
    return {kv.key: kv.value for kv in status.values}.get("Frame age judged by", "")


def test_a_fast_replay_of_an_old_bag_stays_fresh(client, domain, probe, tmp_path):
    bag = bagfile.make_bag(tmp_path / "bag", frames=40, fps=1.0, topic=FAST)  # stamped in 2023, 1 s apart
    mark = len(probe.diagnostics)
    replay_lock_step(domain, bag, NS, "--fast")
    probe.wait_for(lambda: any(judged_by(s) == STREAM_CLOCK for s in camera_statuses(probe, FAST, mark)),
                   what="a camera status judged by the stream's own clock")
    seen = camera_statuses(probe, FAST, mark)
    assert not [s.message for s in seen if TOO_OLD in s.message], [s.message for s in seen]


def test_a_camera_that_falls_behind_still_goes_error(client, probe):
    camera = probe.node.create_publisher(Image, LATE, QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE))
    probe.wait_for(lambda: camera.get_subscription_count() > 0, what="the node's subscription")
    mark = len(probe.diagnostics)

    def error_seen() -> bool:
        return any(s.level == DiagnosticStatus.ERROR and TOO_OLD in s.message and judged_by(s) == NODE_CLOCK
                   for s in camera_statuses(probe, LATE, mark))

    deadline = time.monotonic() + 120  # a hang guard only
    while not error_seen():
        assert time.monotonic() < deadline, [s.message for s in camera_statuses(probe, LATE, mark)]
        msg = Image(height=8, width=8, encoding="rgb8", step=24, data=bytes(24 * 8))
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(time.time_ns() - 30 * S, S)
        camera.publish(msg)
        time.sleep(0.1)  # the camera's own pace, not a condition of the test
