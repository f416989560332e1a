"""streamcache_node under bad input and faults (docs/reliability.md), a real process with the tiny model: the
model raising and running out of CUDA memory mid-chunk and mid-question (STREAMCACHE_TEST_FAULTS),
bad images (an 8K frame, depth images, invalid UTF-8, corrupt compressed data) and bad questions
(a raw client sending bytes that are not UTF-8) leave the memory untouched and the node alive, a bag
looping back in time, a camera going silent, and the memory restored after a restart.

Expected figures by hand from the bags (stamps 0.5 s apart, sampled at 1 fps: the first frame of
each second), chunk_frames 4 and a FIFO budget of 8 units of two frames (16 frames). "The memory is
untouched" is checked with save_memory before and after: the two snapshots must hold the same
tensors bit for bit and the same bookkeeping. Timeouts only guard against hangs.
"""
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from rclpy.serialization import serialize_message
from sensor_msgs.msg import CompressedImage, Image
from streamcache_ros_interfaces.srv import Ask

from node_procs import status_name, HANG_GUARD_S, Proc, child_env, replay_lock_step, stamp_ns, tiny_node
from raw_ros import request_with_raw_first_string
from streamcache_ros import world
from streamcache_ros.engine.memory.snapshots import read_state
from streamcache_ros.tools import bagfile
from streamcache_ros.client.client import StreamCacheClient
from test_reliability_session import assert_same

NS = "/sc_rel"
CAM, CAM_PNG = "/rel/cam", "/rel/cam/compressed"
START = bagfile.DEFAULT_START_NS
S = 1_000_000_000
WIDTH, HEIGHT = 128, 96  # the smallest 4:3 frame the shape world draws (docs/world.md)
FAULTS = "chunk:2=oom,compress:4=error,question:2=oom"


def near(t, expected_ns):
    return abs(stamp_ns(t) - expected_ns) <= 1000


def node_command(snapshot, policy="fifo", budget=None):
    # save_memory takes names inside snapshot_dir: every test's tmp_path is inside pytest's base folder
    extra = {"budget_tokens": budget, "snapshot_dir": snapshot.parents[1]} if budget else {}
    # an 8K frame is 100 MB: best-effort delivery loses messages that large, a reliable one does not
    extra[f"qos_overrides.{CAM}.subscription.reliability"] = "reliable"
    # the working memory alone answers a plain question here: a fault in its answer is what is asserted (the archive
    # reads the day for one: test_node_archive.py, test_node_when_index.py)
    return tiny_node(NS, [CAM, CAM_PNG], policy=policy, max_question_tokens=64, max_new_tokens=4,
                     memory_snapshot_path=snapshot, archive_path="''", **extra)


@pytest.fixture(scope="module")
def budget(qwen_adapter):
    return 8 * qwen_adapter.preprocess(list(world.world_frames(2))).tokens_per_unit


@pytest.fixture(scope="module")
def snapshot_path(tmp_path_factory):
    return tmp_path_factory.mktemp("kept") / "memory.pt"


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    d = tmp_path_factory.mktemp("bags")
    return {"short": bagfile.make_bag(d / "short", frames=40, fps=2.0, topic=CAM),
            "loop": bagfile.make_bag(d / "loop", frames=16, fps=2.0, topic=CAM)}


@pytest.fixture(scope="module")
def node(domain, budget, snapshot_path):
    env = child_env(domain)
    env["STREAMCACHE_TEST_FAULTS"] = FAULTS
    with Proc(node_command(snapshot_path, budget=budget), env) as proc:
        yield proc


@pytest.fixture(scope="module")
def probe(probe):
    """The shared probe (conftest.py), with publishers of the node's two cameras."""
    p = probe
    p.camera = p.node.create_publisher(Image, CAM, QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE))
    p.png = p.node.create_publisher(CompressedImage, CAM_PNG,
                                    QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE))
    p.wait_for(lambda: p.camera.get_subscription_count() > 0 and p.png.get_subscription_count() > 0,
               what="the node's camera subscriptions")
    return p


def replay(domain, bag, *args):
    return replay_lock_step(domain, bag, NS, "--fast", *args)


def saved(client, path):
    r = client.save(str(path.relative_to(path.parents[1])))  # node_command: snapshot_dir, the tmp folders' parent
    assert r.success, r.error_message
    return read_state(str(path))


def statuses(probe, name, since=0):
    return [s for a in probe.diagnostics[since:] for s in a.status if s.name == status_name(NS, name)]


def test_faults_mid_chunk_and_mid_question_are_survived(client, domain, bags, probe, node):
    """Chunk 2 runs out of CUDA memory mid-prefill (dropped), chunk 4 fails while compressing (kept),
    question 2 runs out of memory mid-answer (refused); ingest and questions go on."""
    mark = len(probe.diagnostics)
    before = client.memory_status()
    assert before.chunks_encoded == 0 and before.chunks_failed == 0  # the faults count from the start
    replay(domain, bags["short"])  # 40 frames, 20 sampled (START + 0 .. 19 s): 5 chunks of 4
    status = client.memory_status()
    assert (status.chunks_encoded, status.chunks_failed) == (4, 2)
    assert status.frames_sampled == 20 and status.frames_dropped == 0
    first = client.ask("What is on the table?")
    # chunks 1, 3, 4, 5 (stamps 0-3, 8-19 s): 16 frames, the budget; without the drop FIFO would
    # hold 4-19 s, so the oldest stamp at 0 s shows chunk 2 alone is missing
    assert first.success and first.frames_in_memory == 16
    assert near(first.oldest_stamp, START) and near(first.newest_stamp, START + 19 * S)
    failed = client.ask("What is on the table?")
    assert not failed.success and failed.error_message.startswith("answering failed: OutOfMemoryError: CUDA out of")
    assert "the memory is unchanged" in failed.error_message
    third = client.ask("What is on the table?")
    assert third.success and (third.answer, third.kv_tokens) == (first.answer, first.kv_tokens)
    probe.wait_for(lambda: any(s.level == DiagnosticStatus.ERROR and "chunk(s) failed" in s.message
                               for s in statuses(probe, "latency", mark)), what="the latency ERROR")
    log = node.output()
    assert "dropped: OutOfMemoryError: CUDA out of memory" in log and "lower budget_tokens" in log
    assert "compressing failed (RuntimeError: injected fault at compress 4); its frames are kept" in log
    assert "TEST faults are being injected" in log and node.alive()


def image(stamp, encoding="rgb8", width=WIDTH, height=HEIGHT, step=None, data=None):
    bpp = {"rgb8": 3, "16UC1": 2, "mono16": 2, "32FC1": 4, "yuv422": 2}[encoding]
    msg = Image(height=height, width=width, encoding=encoding, step=width * bpp if step is None else step)
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp, S)
    msg.data = bytes(msg.step * height) if data is None else data
    return msg


def compressed(stamp, fmt, data):
    msg = CompressedImage(format=fmt)
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp, S)
    msg.data = data
    return msg


def bmp_claiming(width, height):
    from io import BytesIO

    from PIL import Image as PILImage
    out = BytesIO()
    PILImage.fromarray(np.zeros((4, 4, 3), np.uint8)).save(out, format="BMP")
    data = bytearray(out.getvalue())
    data[18:26] = width.to_bytes(4, "little") + height.to_bytes(4, "little")
    return bytes(data)


def publish_acked(probe, publisher, topic, msg, stamp):
    publisher.publish(msg)
    probe.wait_for(lambda: any(a.frame_id == topic and stamp_ns(a.stamp) == stamp for a in probe.acks),
                   what=f"ack of {stamp} on {topic}")


def test_bad_images_leave_the_memory_untouched(client, probe, tmp_path):
    assert client.reset().success
    before_status = client.memory_status()
    before = saved(client, tmp_path / "before.pt")
    t = START + 9000 * S  # every frame a second apart: each one is due, so each is fully checked
    bad_utf8 = serialize_message(image(t + 9 * S))
    assert bad_utf8.count(b"rgb8\x00") == 1
    bad_utf8 = bad_utf8.replace(b"rgb8\x00", b"rgb\xff\x00")  # an encoding that is not UTF-8
    raw = [
        (image(t, width=7680, height=4320), "too_large"),  # 8K, 100 MB
        (image(t + S, "16UC1"), "depth"),
        (image(t + 2 * S, "mono16"), "depth"),
        (image(t + 3 * S, "32FC1"), "depth"),
        (image(t + 4 * S, "yuv422"), "encoding"),
        (image(t + 5 * S, step=WIDTH * 3 - 1, data=bytes((WIDTH * 3 - 1) * HEIGHT)), "step"),
        (image(t + 6 * S, data=bytes(WIDTH * 3 * HEIGHT - 7)), "size"),  # truncated
        (image(t + 7 * S, width=0, height=0, data=b""), "empty"),
        (image(t + 8 * S, width=0, data=bytes(10)), "dimensions"),
        (bad_utf8, "encoding"),
    ]
    for i, (msg, _) in enumerate(raw):
        publish_acked(probe, probe.camera, CAM, msg, t + i * S)
    png = [
        (compressed(t + 20 * S, "png", b"\x89PNG\r\n\x1a\n" + bytes(40)), "decode"),
        (compressed(t + 21 * S, "16UC1; compressedDepth", bytes(64)), "depth"),
        (compressed(t + 22 * S, "bmp", bmp_claiming(200_000, 100_000)), "too_large"),
    ]
    for i, (msg, _) in enumerate(png):
        publish_acked(probe, probe.png, CAM_PNG, msg, t + (20 + i) * S)
    after_status = client.memory_status()
    assert after_status.frames_rejected - before_status.frames_rejected == len(raw) + len(png)
    assert after_status.frames_sampled == before_status.frames_sampled
    assert (after_status.kv_bytes, after_status.frames_in_memory) == (before_status.kv_bytes, 0)
    refused = client.ask("What is there?")  # nothing was queued either
    assert not refused.success and "no frames in memory yet" in refused.error_message
    assert_same(before, saved(client, tmp_path / "after.pt"))

    # each reason counted on its camera's diagnostics (the second update from now ran after them)
    mark = len(probe.diagnostics)
    probe.wait_for(lambda: len(probe.diagnostics) >= mark + 2, what="/diagnostics")
    for topic, cases in ((CAM, raw), (CAM_PNG, png)):
        status = statuses(probe, f"camera {topic}", mark + 1)[0]
        values = {kv.key: kv.value for kv in status.values}
        for reason in {r for _, r in cases}:
            assert int(values[f"Rejected: {reason}"]) >= sum(r == reason for _, r in cases), (topic, reason)

    good = image(t + 30 * S, data=world.world_frame(0, HEIGHT, WIDTH).tobytes())
    publish_acked(probe, probe.camera, CAM, good, t + 30 * S)
    answer = client.ask("What is there?", camera=CAM)
    assert answer.success and answer.frames_in_memory == 1  # the node still takes frames


def test_bad_questions_leave_the_snapshot_identical(client, domain, bags, probe, tmp_path):
    assert client.reset().success
    replay(domain, bags["short"])
    assert client.ask("What is on the table?").success  # a history entry to keep unchanged
    before = saved(client, tmp_path / "before.pt")
    cases = [
        (dict(question=""), "the question is empty"),
        (dict(question=" \t\n"), "the question is empty"),
        (dict(question="word " * 100), "tokens with its prompt; the limit is 64 (max_question_tokens)"),
        (dict(question="x" * (16 * 64 + 1)), "characters; at most 1024 (max_question_tokens 64)"),
        (dict(question="what is \ufffd?"), "the question is not valid UTF-8 (character 8 is U+FFFD"),
        (dict(question="which?", options=[f"o{i}" for i in range(27)]), "at most 26 options (A-Z), got 27"),
        (dict(question="which?", options=["red", ""]), "option 1 (B) is empty"),
        (dict(question="which?", options=["\ufffd"]), "option 0 (A) is not valid UTF-8"),
        (dict(question="what?", camera="/other/cam"), "unknown camera '/other/cam'"),
        (dict(question="what?", camera=CAM_PNG), f"no frames from camera '{CAM_PNG}' yet"),
        (dict(question="what?", camera="/c\ufffdm"), "the camera name is not valid UTF-8"),
        (dict(question="what?", max_new_tokens=4_000_000_000), "max_new_tokens 4000000000 is too many"),
    ]
    for i, (request, message) in enumerate(cases):
        r = client.ask(**request)
        assert not r.success and message in r.error_message, (request, r.error_message)
        assert r.answer == "" and r.option_index == -1
        assert_same(before, saved(client, tmp_path / f"after{i}.pt"), f"after {request}")
    # bytes that are not UTF-8, sent raw (a Python client cannot): they arrive as U+FFFD
    ask = probe.node.create_client(Ask, f"{NS}/ask")
    assert ask.wait_for_service(timeout_sec=HANG_GUARD_S)
    future = ask.call_async(request_with_raw_first_string(Ask.Request, b"what is \xff\xfe there?"))
    probe.wait_for(future.done, what="the raw question's response")
    r = future.result()
    assert not r.success and "the question is not valid UTF-8 (character 8 is U+FFFD" in r.error_message
    assert_same(before, saved(client, tmp_path / "raw.pt"), "after the raw question")
    streamed = client.ask_streaming("\ufffd", on_text=lambda *_: pytest.fail("no feedback for a refused goal"))
    assert not streamed.success and "not valid UTF-8" in streamed.error_message
    assert client.ask("What is on the table?").success


def set_parameter(probe, name, value):
    assert probe.set_parameter(f"{NS}/streamcache_node", name, value).successful


def test_a_bag_looping_back_in_time(client, domain, bags, probe, node):
    """16 frames (8 sampled: 0-7 s), played twice. Default rule: sampling restarts, the memory keeps
    both passes (16 frames, the budget). With reset_on_time_jump the second pass starts afresh."""
    assert client.reset().success
    mark = len(probe.diagnostics)
    before = client.memory_status()
    replay(domain, bags["loop"], "--loop", "2")
    r = client.ask("What is on the table?", camera=CAM)
    assert r.success and r.frames_in_memory == 16
    assert near(r.oldest_stamp, START) and near(r.newest_stamp, START + 7 * S)
    assert client.memory_status().frames_sampled - before.frames_sampled == 16
    # (the bag's stamps are years old: the stamp task makes the status ERROR, and the messages merge)
    probe.wait_for(lambda: any(s.level >= DiagnosticStatus.WARN and "stamps jumped back" in s.message
                               for s in statuses(probe, f"camera {CAM}", mark)), what="the time-jump WARN")
    assert "stamps jumped back 7.000 s: sampling restarted, memory kept" in node.output()

    set_parameter(probe, "reset_on_time_jump", True)
    try:
        replay(domain, bags["loop"], "--loop", "2")  # jumps back at its start and again mid-way
        r = client.ask("What is on the table?", camera=CAM)
        assert r.success and r.frames_in_memory == 8  # the last pass only
        assert "stamps jumped back 7.000 s: memory reset (8 frames forgotten" in node.output()
    finally:
        set_parameter(probe, "reset_on_time_jump", False)


def test_a_camera_going_silent_is_warn_then_error(client, probe):
    """Frames stamped now at 4 Hz for 3 s, then none: the camera's status turns WARN ("silent"),
    then ERROR (the rate task's window runs empty), in that order: the WARN is waited for, then the
    ERROR (an ERROR stays while the camera is silent, so a WARN seen after the first ERROR would mean
    the order was wrong); timeouts only as hang guards."""
    for i in range(12):
        msg = image(time.time_ns(), data=world.world_frame(i, HEIGHT, WIDTH).tobytes())
        probe.camera.publish(msg)
        time.sleep(0.25)  # the camera's own pace, not a condition of the test
    mark = len(probe.diagnostics)

    def first(level: int, words: str = "") -> int | None:
        found = [i for i, s in enumerate(statuses(probe, f"camera {CAM}", mark)) if s.level == level and words in s.message]
        return found[0] if found else None
    probe.wait_for(lambda: first(DiagnosticStatus.WARN, "silent: no frame for") is not None,
                   what="the silent camera's WARN")
    probe.wait_for(lambda: first(DiagnosticStatus.ERROR) is not None, what="the silent camera's ERROR")
    assert first(DiagnosticStatus.WARN, "silent: no frame for") < first(DiagnosticStatus.ERROR)


def test_sigint_writes_the_memory_snapshot(node, client, snapshot_path):
    last = client.ask("What is on the table?")
    assert last.success
    node.last_answer = last
    assert node.stop() == 0 and not node.alive()
    log = node.output()
    assert f"memory written to {snapshot_path} (shutdown)" in log and "Traceback" not in log
    assert read_state(str(snapshot_path))["policy"] == "fifo"


def test_a_restart_restores_the_memory_and_another_policy_is_refused(node, domain, budget, snapshot_path):
    restarted = Proc(node_command(snapshot_path, budget=budget), child_env(domain))
    try:
        with StreamCacheClient(NS, timeout=HANG_GUARD_S, domain_id=domain) as c:
            again = c.ask("What is on the table?")
            last = node.last_answer
            assert again.success and (again.answer, again.frames_in_memory) == (last.answer, last.frames_in_memory)
            assert stamp_ns(again.newest_stamp) == stamp_ns(last.newest_stamp)
            kept = c.save("")  # an empty path: the configured snapshot file
            assert kept.success and kept.frames_in_memory == last.frames_in_memory
        assert restarted.stop() == 0
        assert f"memory restored from {snapshot_path}: {last.frames_in_memory} frames" in restarted.output()
    finally:
        restarted.kill_group()
    content = snapshot_path.read_bytes()
    other = Proc(node_command(snapshot_path, policy="full"), child_env(domain))
    try:
        with StreamCacheClient(NS, timeout=HANG_GUARD_S, domain_id=domain) as c:
            refused = c.ask("What is on the table?")
            assert not refused.success and "no frames in memory yet" in refused.error_message  # started empty
            status = c.memory_status()
            assert status.policy == "full" and status.frames_in_memory == 0
            kept = c.save("")
            assert not kept.success and "refused at start" in kept.error_message
        assert other.stop() == 0
        log = other.output()
        assert f"memory snapshot refused: snapshot '{snapshot_path}' was made with policy 'fifo'; " \
               "this node runs 'full'" in log
        assert "Starting with an empty memory" in log and "Traceback" not in log
    finally:
        other.kill_group()
    assert snapshot_path.read_bytes() == content  # another policy's node never wrote over it

