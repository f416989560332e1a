"""streamcache_node as a real process with the tiny model: bags replayed by streamcache-replay in
another process, questions through the Ask service, the Ask action and streamcache-ask, memory
status, diagnostics, bad images, questions while frames arrive, snapshots, lifecycle, SIGINT.

Expected figures are worked out by hand from the bag (stamps 0.5 s apart), the sampling rule (the
first frame of each second of stamps), chunk_frames 4, and a FIFO budget of KEPT_UNITS units of
two frames (Qwen2.5-VL's temporal patch). Timeouts only guard against hangs.
"""
import json
import re
import subprocess
import threading
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image

from node_procs import (status_name, HANG_GUARD_S, ROOT, Proc, child_env, client_of, python_module, replay_lock_step, stamp_ns,
                        tiny_node)
from streamcache_ros import world
from streamcache_ros.tools import bagfile

NS = "/sc_it"
CAM, CAM_PNG = "/it/cam", "/it/cam/compressed"
START = bagfile.DEFAULT_START_NS
S = 1_000_000_000
SMALL_FRAME = (96, 128)  # height, width: the smallest 4:3 frame the shape world draws (docs/world.md)
KEPT_UNITS = 8  # budget_tokens = 8 units x tokens per unit: the newest 16 frames


def near(t, expected_ns):
    return abs(stamp_ns(t) - expected_ns) <= 1000  # float seconds inside the engine: sub-microsecond


@pytest.fixture(scope="module")
def geometry(qwen_adapter):
    units = qwen_adapter.preprocess(list(world.world_frames(2))).tokens_per_unit
    return {"tokens_per_unit": units, "prefix": len(qwen_adapter.prefix_ids), "budget": KEPT_UNITS * units}


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    d = tmp_path_factory.mktemp("bags")
    return {
        "short": bagfile.make_bag(d / "short", frames=40, fps=2.0, topic=CAM),
        "long": bagfile.make_bag(d / "long", frames=200, fps=2.0, topic=CAM, storage="mcap"),
        "png": bagfile.make_bag(d / "png", frames=20, fps=2.0, topic=CAM, compressed=True),
        "busy": bagfile.make_bag(d / "busy", frames=60, fps=2.0, topic=CAM, first_frame=40, start_ns=START + 20 * S),
    }


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    return tmp_path_factory.mktemp("snapshots")  # the node's snapshot_dir


@pytest.fixture(scope="module")
def node(domain, geometry, snapshots):
    # the working memory alone answers a plain question here: its bound is what is asserted (the archive
    # reads the day for one: test_node_archive.py, test_node_when_index.py)
    command = tiny_node(NS, [CAM, CAM_PNG], budget_tokens=geometry["budget"], max_question_tokens=64,
                        snapshot_dir=snapshots, archive_path="''")
    with Proc(command, child_env(domain)) as proc:
        yield proc


def replay(domain, bag, *args):
    return replay_lock_step(domain, bag, NS, *args)


def test_refusals_before_any_frame(client):
    assert client.reset().success
    for question, camera, words in [
        ("What is on the table?", "", "no frames in memory yet"),
        ("   ", "", "the question is empty"),
        ("x" * (16 * 64 + 1), "", "characters"),  # refused before tokenizing
        (" ".join(["word"] * 100), "", "max_question_tokens"),  # 100+ tokens, limit 64
        ("What is on the table?", "/other/cam", "unknown camera '/other/cam'"),
        ("What is on the table?", CAM_PNG, f"no frames from camera '{CAM_PNG}'"),
    ]:
        r = client.ask(question, camera=camera)
        assert not r.success and words in r.error_message, (question[:20], r.error_message)
        assert r.option_index == -1 and r.answer == ""
    result = client.ask_streaming("", on_text=lambda *_: pytest.fail("no feedback for a refused goal"))
    assert not result.success and "empty" in result.error_message


def test_lock_step_replay_then_the_service_and_the_action_answer(client, domain, bags):
    assert client.reset().success
    before = client.memory_status()
    done = replay(domain, bags["short"], "--fast")
    assert "40 acknowledged" in done.stdout
    asked = time.time()
    r = client.ask("What is on the table?")
    answered = time.time()
    assert r.success, r.error_message
    # freshness by the node's clock (the system clock here, as this test's): from the newest frame to the answer
    newest = (START + 19 * S) / S
    assert asked - newest - 1e-3 <= r.newest_frame_age_s <= answered - newest + 1e-3
    # 40 frames at 2 fps, sampled at 1 fps: stamps START + 0, 1, ..., 19 s, in 5 chunks of 4.
    # FIFO keeps 8 units of 2 frames: the newest 16 frames, START + 4 .. 19 s.
    assert r.frames_in_memory == 16
    assert near(r.oldest_stamp, START + 4 * S) and near(r.newest_stamp, START + 19 * S)
    assert (r.method, r.model_id, r.error_message) == ("fifo", "tiny-qwen2_5_vl", "")
    assert 1 <= r.answer_tokens <= 8 and 0 < r.ttft_ms <= r.total_ms
    after = client.memory_status()
    # a frame not acknowledged in time is published again (lock-step, a loaded machine): received twice
    # when its acknowledgement was late, once when the first copy was lost on the way
    resent = int(re.search(r"(\d+) resent", done.stdout).group(1))
    assert 40 <= after.frames_received - before.frames_received <= 40 + resent
    assert after.frames_sampled - before.frames_sampled == 20
    assert (after.frames_dropped, after.frames_rejected) == (before.frames_dropped, before.frames_rejected)
    assert after.kv_tokens == r.kv_tokens and after.frames_in_memory == 16

    pieces = []
    result = client.ask_streaming("What is on the table?", on_text=lambda partial, new: pieces.append((partial, new)))
    assert result.success and result.error_message == ""
    assert result.answer == r.answer  # greedy, and answering leaves the cache as it was
    assert result.newest_frame_age_s >= r.newest_frame_age_s  # the action result says it too, a little later
    assert pieces and "".join(new for _, new in pieces).strip() == result.answer
    assert all(b.startswith(a) for (a, _), (b, _) in zip(pieces, pieces[1:]))  # the partial answer grows
    assert result.frames_in_memory == 16 and near(result.newest_stamp, START + 19 * S)


def test_the_ask_cli(client, domain):
    env = child_env(domain)

    def cli(*args):
        return subprocess.run(python_module("streamcache_ros.client.ask_cli", *args), cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=HANG_GUARD_S)

    service = client.ask("What is on the table?")
    # 20 frames seen, the newest 16 kept: the answer says how far back it reached, and the CLI prints it
    assert service.evicted_before and service.searched_since == service.oldest_stamp
    reach = service.searched_since.sec + service.searched_since.nanosec * 1e-9
    printed = f"{service.answer}\n(the memory searched reaches back to {reach:.3f}; older frames were evicted)"
    done = cli("--namespace", NS, "What is on the table?")
    assert done.returncode == 0 and done.stdout.strip() == printed.strip()
    found = cli("--json", "What is on the table?")  # no --namespace: the one node is found
    assert found.returncode == 0 and json.loads(found.stdout)["answer"] == service.answer
    assert json.loads(found.stdout)["newest_frame_age_s"] >= service.newest_frame_age_s
    assert json.loads(found.stdout)["recalled_chunks"] == service.recalled_chunks
    streamed = cli("--namespace", NS, "--stream", "What is on the table?")
    assert streamed.returncode == 0 and streamed.stdout.strip() == printed.strip()
    refused = cli("--namespace", NS, "--camera", "/other/cam", "What is on the table?")
    assert refused.returncode == 1 and "unknown camera" in refused.stderr and refused.stdout == ""
    status = cli("--namespace", NS, "--status")
    assert status.returncode == 0 and json.loads(status.stdout)["policy"] == "fifo"
    absent = cli("--namespace", "/nobody_here", "--wait", "3", "hello?")
    assert absent.returncode == 3 and "/nobody_here/ask" in absent.stderr


def test_memory_stays_at_the_budget_over_a_long_replay(client, domain, bags, probe, geometry):
    assert client.reset().success
    # the probe may have just subscribed: one status received shows it is matched (1 Hz)
    probe.wait_for(lambda: len(probe.statuses) > 0, what="the probe's first memory_status")
    first = len(probe.statuses)
    replay(domain, bags["long"], "--fast")  # mcap, 200 frames: 100 sampled, 25 chunks
    # a status after every chunk (published before the chunk's last frame was acknowledged)
    probe.wait_for(lambda: set(range(1, 26)) <= {s.chunks_encoded for s in probe.statuses[first:]},
                   what="a memory_status for each of the 25 chunks")
    seen = probe.statuses[first:]
    limit = geometry["prefix"] + geometry["budget"]  # the system prompt is kept on top of the budget
    assert all(max(s.layer_tokens) <= limit for s in seen)
    full = [s.kv_bytes for s in seen if s.frames_in_memory == 2 * KEPT_UNITS]
    assert len(full) >= 20 and max(full) == min(full)  # flat from the moment the budget is reached
    final = client.memory_status()
    assert final.frames_in_memory == 16 and list(final.layer_tokens) == [limit] * len(final.layer_tokens)
    assert near(final.newest_stamp, START + 99 * S) and near(final.oldest_stamp, START + 84 * S)
    assert final.budget_tokens == geometry["budget"] and final.kv_bytes == full[-1]


def test_a_compressed_camera(client, domain, bags):
    assert client.reset().success
    replay(domain, bags["png"], "--fast", "--topics", CAM_PNG)
    r = client.ask("What moved?", camera=CAM_PNG)
    # 20 PNG frames at 2 fps -> 10 sampled (START + 0 .. 9 s); all fit in 16
    assert r.success, r.error_message
    assert r.frames_in_memory == 10 and near(r.oldest_stamp, START) and near(r.newest_stamp, START + 9 * S)
    other = client.ask("What moved?", camera=CAM)
    assert not other.success and f"no frames from camera '{CAM}'" in other.error_message


def image(stamp, encoding="rgb8", rgb=None, step_extra=0, step=None, data=None):
    rgb = world.world_frame(0, *SMALL_FRAME) if rgb is None else rgb
    h, w = rgb.shape[:2]
    pixels = {"rgb8": rgb, "bgr8": rgb[:, :, ::-1], "mono8": rgb[:, :, :1], "mono16": np.zeros((h, w, 2), np.uint8),
              "yuv422": np.zeros((h, w, 2), np.uint8)}[encoding]
    row = w * pixels.shape[2]
    step = row + step_extra if step is None else step
    msg = Image(height=h, width=w, encoding=encoding, step=step)
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp, S)
    if data is None:
        data = b"".join(pixels[y].tobytes() + b"\x00" * max(step - row, 0) for y in range(h))
    msg.data = data
    return msg


def publish_acked(probe, publisher, msg):
    """Publish and wait until the node says it dealt with the frame (taken, skipped or rejected)."""
    stamp = stamp_ns(msg.header.stamp)
    publisher.publish(msg)
    probe.wait_for(lambda: any(a.frame_id == CAM and stamp_ns(a.stamp) == stamp for a in probe.acks),
                   what=f"ack of {stamp}")


def camera_status(array, topic=CAM):
    return next((s for s in array.status if s.name == status_name(NS, f"camera {topic}")), None)


def test_bad_images_are_rejected_and_counted_while_good_ones_flow(client, probe):
    assert client.reset().success
    publisher = probe.node.create_publisher(Image, CAM, QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE))
    probe.wait_for(lambda: publisher.get_subscription_count() > 0, what="the node's subscription")
    before = client.memory_status()
    t = START + 5000 * S
    sequence = [
        (image(t), "good"),
        (image(t + S, "yuv422"), "encoding"),  # due, but rejected: its slot stays open ...
        (image(t + S + S // 5, "bgr8"), "good"),  # ... for this frame of the same second
        (image(t + 2 * S, step=SMALL_FRAME[1] * 3 - 1), "step"),
        (image(t + 2 * S + S // 2, data=b""), "empty"),
        (image(t + 3 * S, data=bytes(100)), "size"),
        (image(t + 3 * S + S // 10, step_extra=7), "good"),  # padded rows are fine
        (image(t + 3 * S + S // 2, "mono16"), "depth"),  # not due, still checked and counted
        (image(t + 4 * S, "mono8"), "good"),
    ]
    for msg, _ in sequence:
        publish_acked(probe, publisher, msg)
    after = client.memory_status()
    assert after.frames_received - before.frames_received == 9
    assert after.frames_rejected - before.frames_rejected == 5
    assert after.frames_sampled - before.frames_sampled == 4
    r = client.ask("What is there?", camera=CAM)
    assert r.success and r.frames_in_memory == 4  # every good frame reached the memory
    assert near(r.oldest_stamp, t) and near(r.newest_stamp, t + 4 * S)

    # the camera's diagnostics count each reason (the second update from now ran after the frames)
    first = len(probe.diagnostics)
    probe.wait_for(lambda: len(probe.diagnostics) >= first + 2, what="/diagnostics")
    values = {kv.key: kv.value for kv in camera_status(probe.diagnostics[first + 1]).values}
    for reason, count in {"encoding": 1, "depth": 1, "step": 1, "empty": 1, "size": 1}.items():
        assert int(values[f"Rejected: {reason}"]) >= count  # counters are for the node's lifetime
    assert "'mono16' is a depth or 16/32/64-bit image" in values["Last rejection"]

    # only bad frames since the last update: the camera is ERROR, and says why. Two updates first:
    # the second one surely ran after the good frames above (the first may have been on its way).
    mark = len(probe.diagnostics)
    probe.wait_for(lambda: len(probe.diagnostics) >= mark + 2, what="/diagnostics")
    mark = len(probe.diagnostics)
    for i in range(3):
        publish_acked(probe, publisher, image(t + (10 + i) * S, "yuv422"))
    probe.wait_for(lambda: any((s := camera_status(a)) is not None and s.level == DiagnosticStatus.ERROR
                               and "every frame rejected" in s.message for a in probe.diagnostics[mark:]),
                   what="an ERROR status for the camera")


def test_questions_while_frames_arrive_nothing_is_lost(client, domain, bags, probe):
    assert client.reset().success
    before = client.memory_status()
    first_ack = len(probe.acks)
    start = START + 20 * S  # the "busy" bag: world frames 40.., stamps START + 20 s + i / 2 fps
    replayer = Proc(python_module("streamcache_ros.tools.replay", str(bags["busy"]), "--lock-step", "--rate", "6",
                                  "--namespace", NS, "--topics", CAM), child_env(domain))
    answers = []
    try:
        while replayer.alive():
            # sampled frames (whole seconds after the bag's start) the node has already taken
            taken = [stamp_ns(a.stamp) for a in probe.acks[first_ack:] if (stamp_ns(a.stamp) - start) % S == 0]
            r = client.ask("What is new?", camera=CAM if taken else "", max_new_tokens=4)
            if taken:
                assert r.success, r.error_message
                # every frame taken before the call is in memory for it
                assert stamp_ns(r.newest_stamp) >= max(taken) - 1000
                answers.append(stamp_ns(r.newest_stamp))
        assert replayer.wait() == 0, replayer.output()
    finally:
        replayer.stop()
    # the memory kept growing while questions were being answered: ingest was never stopped
    assert len(set(answers)) >= 3, answers
    after = client.memory_status()
    assert after.frames_dropped == before.frames_dropped  # nothing lost
    assert after.frames_sampled - before.frames_sampled == 30
    final = client.ask("What is new?", camera=CAM)
    assert final.success and near(final.newest_stamp, start + 29 * S)
    # each question encoded the frames pending so far as a short chunk: a unit then holds one frame
    # instead of two, so the 8 units kept hold between 8 and 16 frames
    assert KEPT_UNITS <= final.frames_in_memory <= 2 * KEPT_UNITS


def test_cancelling_the_action(client, domain, bags):
    assert client.reset().success
    replay(domain, bags["short"], "--fast")
    before = client.memory_status()
    # Cancel at the first piece of text. A random-weight model may end its answer (end-of-sequence)
    # before the cancel arrives: then that question cannot show a cancel, and the next one is tried.
    for question in ["Describe everything you saw in detail.", "Tell a long story about the shapes.",
                     "List every colour you saw, one by one.", "What happened, frame by frame?"]:
        cancel = threading.Event()
        # (an answer fits in the room every chunk leaves: max_question_tokens 64 + 16, options' mc_max_new_tokens)
        result = client.ask_streaming(question, max_new_tokens=48, on_text=lambda *_: cancel.set(), cancel=cancel)
        if result.error_message == "cancelled":
            break
    assert not result.success and result.error_message == "cancelled"
    assert 1 <= result.answer_tokens < 48  # stopped part-way, the partial answer returned
    after = client.memory_status()
    assert (after.kv_tokens, after.kv_bytes, after.frames_in_memory) == (before.kv_tokens, before.kv_bytes, 16)
    assert client.ask("What is on the table?").success  # the node carries on


def test_save_and_load_memory(client, domain, bags, snapshots):
    assert client.reset().success
    replay(domain, bags["short"], "--fast")
    question = client.ask("What is on the table?")
    saved = client.save("memory.pt")  # a name in the node's snapshot_dir
    assert saved.success and saved.frames_in_memory == 16
    assert saved.bytes_written == (snapshots / "memory.pt").stat().st_size
    assert client.reset().frames_cleared == 16
    refused = client.ask("What is on the table?")
    assert not refused.success and refused.frames_in_memory == 0
    loaded = client.load("memory.pt")
    assert loaded.success and loaded.frames_in_memory == 16
    again = client.ask("What is on the table?")
    assert again.answer == question.answer and near(again.newest_stamp, START + 19 * S)
    missing = client.load("nope.pt")
    assert not missing.success and "no snapshot" in missing.error_message
    assert client.ask("What is on the table?").frames_in_memory == 16  # unharmed
    empty = client.save("")
    assert not empty.success and "path is empty" in empty.error_message


def test_diagnostics_cover_cameras_memory_and_latency(client, probe):
    names = {status_name(NS, f"camera {CAM}"), status_name(NS, f"camera {CAM_PNG}"), status_name(NS, "memory"),
             status_name(NS, "latency")}
    mark = len(probe.diagnostics)
    probe.wait_for(lambda: any(names <= {s.name for s in a.status} for a in probe.diagnostics[mark:]),
                   what="all statuses")
    array = next(a for a in probe.diagnostics[mark:] if names <= {s.name for s in a.status})
    status = {s.name: s for s in array.status}
    memory = status[status_name(NS, "memory")]
    m = client.memory_status()
    values = {kv.key: kv.value for kv in memory.values}
    assert memory.hardware_id == f"{NS}/streamcache_node"  # robots on one domain told apart
    assert {kv.key: kv.value for kv in memory.values}["Model"] == "tiny-qwen2_5_vl"
    assert memory.level == DiagnosticStatus.OK and values["KV bytes"] == str(m.kv_bytes)
    assert values["Frames in memory"] == str(m.frames_in_memory) and values["Policy"] == "fifo"
    assert values["Budget (video tokens per layer)"] == str(m.budget_tokens)
    latency = {kv.key: kv.value for kv in status[status_name(NS, "latency")].values}
    assert {"Encode (ms, last chunk)", "Prefill (ms, last chunk)", "Compress (ms, last chunk)",
            "Last TTFT (ms)"} <= set(latency)
    assert int(latency["Chunks encoded"]) == m.chunks_encoded
    camera = {kv.key for kv in status[status_name(NS, f"camera {CAM}")].values}
    # upstream's FrequencyStatus and TimeStampStatus, then the frame counters
    assert {"Actual frequency (Hz)", "Latest timestamp delay:", "Frames received", "Frames dropped (encoder busy)",
            "Frames rejected", "Last frame age (s)"} <= camera


def test_lifecycle_deactivate_and_activate(client, probe):
    change = probe.node.create_client(ChangeState, f"{NS}/streamcache_node/change_state")
    assert change.wait_for_service(timeout_sec=HANG_GUARD_S)

    def transition(tid):
        future = change.call_async(ChangeState.Request(transition=Transition(id=tid)))
        probe.wait_for(future.done, what="change_state")
        return future.result().success

    assert transition(Transition.TRANSITION_DEACTIVATE)
    refused = client.ask("What is on the table?")
    assert not refused.success and "not active" in refused.error_message
    assert transition(Transition.TRANSITION_ACTIVATE)
    assert client.ask("What is on the table?").success  # the memory survived


def test_sigint_stops_the_node_cleanly(node, client):
    assert client.ask("What is on the table?").success
    assert node.stop() == 0
    assert not node.alive()
    assert "Traceback" not in node.output()


def test_the_uniform_policy_through_the_node(domain, bags, geometry):
    """policy: uniform served by the node: the short bag's 20 sampled frames are 10 units; a budget of 4
    units keeps units 0, 2, 5 and 9 (spread over the stream, the first and the newest kept)."""
    ns = "/sc_uniform"
    budget = 4 * geometry["tokens_per_unit"]
    with Proc(tiny_node(ns, [CAM], policy="uniform", budget_tokens=budget, archive_path="''"), child_env(domain)) as proc, \
            client_of(proc, domain, ns) as client:
        replay_lock_step(domain, bags["short"], ns, "--fast")
        r = client.ask("What is on the table?")
        assert r.success and (r.method, r.error_message) == ("uniform", ""), r.error_message
        assert r.frames_in_memory == 8 and near(r.oldest_stamp, START) and near(r.newest_stamp, START + 19 * S)
        status = client.memory_status()
        assert (status.policy, status.budget_tokens) == ("uniform", budget)
        assert max(status.layer_tokens) == geometry["prefix"] + budget
