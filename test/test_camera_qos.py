"""Camera QoS matched to the publishers (docs/interfaces.md, "QoS"): reliable when
every publisher is reliable, best effort otherwise, checked again as publishers come and go, said in
the log and the camera's diagnostics; a qos_overrides parameter wins; a 640x480 bag replayed in lock
step from a reliable publisher reaches the end with no override set (it died at the first frame).

Timeouts only guard against hangs: the test waits for what the node says."""
import time

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image

from std_msgs.msg import Header

from node_procs import status_name, Probe, Proc, child_env, client_of, replay_lock_step, stamp_ns, tiny_node
from streamcache_ros.node.cameras import match_reliability
from streamcache_ros.tools import bagfile

NS = "/sc_qos"
CAM, BIG, PINNED, STEADY = "/qos/cam", "/qos/big", "/qos/pinned", "/qos/steady"
RELIABLE, BEST_EFFORT = QoSReliabilityPolicy.RELIABLE, QoSReliabilityPolicy.BEST_EFFORT


def test_the_rule():
    assert match_reliability([]) == (BEST_EFFORT, "best effort: no publisher yet")
    assert match_reliability([RELIABLE, RELIABLE])[0] == RELIABLE
    assert match_reliability([RELIABLE, BEST_EFFORT]) == (BEST_EFFORT, "best effort: 1 of 2 publisher(s) best effort")


@pytest.fixture(scope="module")
def node(domain):
    # no override for CAM and BIG: their QoS follows the publishers; PINNED is pinned best effort
    command = tiny_node(NS, [CAM, BIG, PINNED, STEADY], **{f"qos_overrides.{PINNED}.subscription.reliability": "best_effort"})
    with Proc(command, child_env(domain)) as proc:
        yield proc


@pytest.fixture(scope="module")
def probe(domain, node):
    with client_of(node, domain, NS):  # the node is up
        pass
    p = Probe(domain)
    p.diagnostics = p.collect(DiagnosticArray, "/diagnostics", QoSProfile(depth=100))
    yield p
    p.close()


def qos_said(probe, topic, since):
    """The 'QoS reliability' values the camera's diagnostics said since ``since``."""
    return [kv.value for a in probe.diagnostics[since:] for s in a.status if s.name == status_name(NS, f"camera {topic}")
            for kv in s.values if kv.key == "QoS reliability"]


def subscribed_with(probe, topic):
    return [info.qos_profile.reliability for info in probe.node.get_subscriptions_info_by_topic(topic)]


def wait_said(probe, topic, words, since=0):
    probe.wait_for(lambda: any(v.startswith(words) for v in qos_said(probe, topic, since)), what=f"'{words}' on {topic}")


def test_the_subscription_follows_its_publishers(probe, node):
    wait_said(probe, CAM, "best effort: no publisher yet")
    reliable = probe.node.create_publisher(Image, CAM, QoSProfile(depth=5, reliability=RELIABLE))
    mark = len(probe.diagnostics)
    wait_said(probe, CAM, "reliable: matched to 1 publisher(s), all reliable", mark)
    probe.wait_for(lambda: subscribed_with(probe, CAM) == [RELIABLE], what="a reliable subscription")
    other = probe.node.create_publisher(Image, CAM, QoSProfile(depth=5, reliability=BEST_EFFORT))
    mark = len(probe.diagnostics)
    wait_said(probe, CAM, "best effort: 1 of 2 publisher(s) best effort", mark)
    probe.wait_for(lambda: subscribed_with(probe, CAM) == [BEST_EFFORT], what="a best-effort subscription")
    probe.node.destroy_publisher(other)
    mark = len(probe.diagnostics)
    wait_said(probe, CAM, "reliable: matched to 1 publisher(s), all reliable", mark)
    probe.node.destroy_publisher(reliable)
    log = node.output()
    assert f"camera {CAM}: subscribed reliable: matched to 1 publisher(s), all reliable" in log
    assert f"camera {CAM}: subscribed best effort: 1 of 2 publisher(s) best effort" in log
    assert "incompatible QoS" not in log


def test_no_frame_is_lost_while_the_subscription_changes(probe):
    """A reliable camera from the moment it is matched: the node moves from its first best-effort
    subscription to a reliable one meanwhile, and every frame is acknowledged once (taken or skipped
    by the sampler): none lost between the two subscriptions, none taken from both. Each frame is
    sent once the one before it was acknowledged (lock step), so no queue depth or rate is at stake:
    a busy machine is only slower, and a frame that is never acknowledged was lost by the node.
    Counted from the first frame acknowledged: one sent while discovery is still matching the node's
    best-effort reader can be lost on the wire (it was, once in a suite run)."""
    acks = probe.collect(Header, f"{NS}/frame_acks", QoSProfile(depth=1000, reliability=RELIABLE))
    probe.wait_for(lambda: probe.node.count_subscribers(f"{NS}/frame_acks") >= 1 and
                   probe.node.count_publishers(f"{NS}/frame_acks") >= 1, what="the ack topic")
    wait_said(probe, STEADY, "best effort: no publisher yet")
    camera = probe.node.create_publisher(Image, STEADY, QoSProfile(depth=100, reliability=RELIABLE))
    probe.wait_for(lambda: camera.get_subscription_count() >= 1, what="the node's first subscription")
    frame = Image(height=48, width=64, encoding="rgb8", step=64 * 3, data=bytes(64 * 48 * 3))
    stamps = iter(range(10**9, 10**12, 100_000_000))

    def publish() -> int:
        frame.header.stamp.sec, frame.header.stamp.nanosec = divmod(next(stamps), 10**9)
        camera.publish(frame)
        return stamp_ns(frame.header.stamp)

    def acked():
        return [stamp_ns(a.stamp) for a in acks if a.frame_id == STEADY]

    # the writer sees the match before the node's best-effort reader may have: a frame sent in that
    # moment is lost on the wire, not by the node. So frames count once one has been acknowledged;
    # until then one is sent every 0.1 s (a pace, not a condition of the test)
    warm_up = [publish()]
    while not acked():
        time.sleep(0.1)
        warm_up.append(publish())
        assert len(warm_up) < 300, "hang guard: no frame acknowledged in 300 frames"
    sent, changed_at = [], None
    # until the node has been reliable for 20 frames: the old subscription overlaps the new one for a
    # while, and frames go on through the overlap and the old one's retirement
    while changed_at is None or len(sent) < changed_at + 20:
        sent.append(publish())
        try:  # lock step: the next frame once this one was acknowledged
            probe.wait_for(lambda: sent[-1] in acked(), timeout=60, what=f"an ack of frame {len(sent) - 1}")
        except TimeoutError:
            pytest.fail(f"frame {len(sent) - 1} of {len(sent)} never acknowledged (reliable from frame "
                        f"{changed_at} on)")
        if changed_at is None and subscribed_with(probe, STEADY) == [RELIABLE]:
            changed_at = len(sent)
        time.sleep(0.1)  # a pace for the frames through the overlap, not a condition of the test
        assert len(sent) < 600, "the node never moved to a reliable subscription"
    assert sorted(s for s in acked() if s > warm_up[-1]) == sent  # none twice
    probe.node.destroy_publisher(camera)


def test_qos_overrides_win(probe):
    pinned = probe.node.create_publisher(Image, PINNED, QoSProfile(depth=5, reliability=RELIABLE))
    mark = len(probe.diagnostics)
    wait_said(probe, PINNED, "best effort: set by qos_overrides", mark)
    assert subscribed_with(probe, PINNED) == [BEST_EFFORT]
    probe.node.destroy_publisher(pinned)


def test_a_640x480_bag_replays_in_lock_step_to_the_end(domain, probe, node, tmp_path):
    bag = bagfile.make_bag(tmp_path / "vga", frames=12, fps=2.0, width=640, height=480, topic=BIG)
    done = replay_lock_step(domain, bag, NS, "--fast")
    assert "12 acknowledged" in done.stdout, done.stdout + done.stderr
