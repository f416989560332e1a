"""Fuzzing streamcache_node through DDS (docs/reliability.md "Fuzzing through DDS"): a real node
process, frames in its memory (some of them evicted to the archive), and Hypothesis-generated
Ask, When, SaveMemory, LoadMemory and MemoryTimeline requests, ask_action goals and parameter sets
sent as any participant on the domain could send them: any unicode, huge and empty strings, stamps
and integers at their fields' limits, inverted windows, paths out of snapshot_dir, parameter values
of any type (the type field itself out of range), NaN and inf.

Every response is a success or a refusal that says why; the memory (what a refused question says
it holds and memory_timeline's every frame, after every request; memory_status's bytes, chunks and
archive at the end) is the same after every request as before it (no frame arrives meanwhile, so
answering, saving and loading the memory's own snapshot change nothing either); the node ends the
run alive, answers a known-good question, and its log holds no traceback and no internal error.

Examples per kind: STREAMCACHE_FUZZ_EXAMPLES (default 100: a short run for CI; the long run,
docs/reliability.md, used 1000).
"""
import math
import os
import pathlib
import time

import pytest
from builtin_interfaces.msg import Time
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rcl_interfaces.msg import Parameter as ParameterMsg
from rcl_interfaces.msg import ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from streamcache_ros_interfaces.srv import Ask, LoadMemory, SaveMemory, When

from node_procs import HANG_GUARD_S, Probe, Proc, child_env, replay_lock_step, tiny_node
from streamcache_ros import world
from streamcache_ros.node import params
from streamcache_ros.tools import bagfile

NS = "/sc_fuzz"
NODE = f"{NS}/streamcache_node"
CAM = "/fuzz/cam"
START_S = bagfile.DEFAULT_START_NS // 1_000_000_000
BAG_FRAMES = 24  # at 2 fps, sampled at 1 fps: 12 frames, 3 whole chunks of 4 (nothing left waiting)
KEPT_UNITS = 4  # the fifo budget: 4 units of 2 frames, so the oldest chunk is evicted to the archive
EXAMPLES = int(os.environ.get("STREAMCACHE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

INT32, UINT32, INT64 = 2**31, 2**32 - 1, 2**63
GOOD_SNAPSHOT = "good.pt"  # the memory's own snapshot, saved before the fuzzing: a load that succeeds


# -- strategies ----------------------------------------------------------------------------------
def texts(examples=()):
    """Any unicode (NUL included: the message layer cuts a string there), empty, huge (70 000
    characters), or one of ``examples``."""
    return st.one_of(st.sampled_from(["", " ", "\n", *examples]), st.text(), st.text(min_size=1, max_size=4),
                     st.text(st.characters(codec="utf-8"), max_size=40),
                     st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=8),
                               st.sampled_from([200, 5000, 70000])))


QUESTIONS = texts(["What is on the table?", "Did you see a red circle?", "What color is the square now?",
                   "How many shapes are there?", "why " * 300, "x" * 1025])
CAMERAS = texts([CAM, "cam", "/fuzz/cam/", "fuzz/cam", "/other/cam", "/"])


@st.composite
def stamps(draw):
    """builtin_interfaces/Time: zero (open), near the frames in memory (some windows hold frames),
    or anywhere in the fields' ranges (negative seconds, nanoseconds past a second)."""
    kind = draw(st.sampled_from(["zero", "near", "near", "limits", "any"]))
    if kind == "zero":
        return Time()
    if kind == "near":
        return Time(sec=START_S + draw(st.integers(-3, 15)), nanosec=draw(st.integers(0, 999_999_999)))
    if kind == "limits":
        return Time(sec=draw(st.sampled_from([-INT32, -1, 0, 1, INT32 - 1])),
                    nanosec=draw(st.sampled_from([0, 1, UINT32])))
    return Time(sec=draw(st.integers(-INT32, INT32 - 1)), nanosec=draw(st.integers(0, UINT32)))


def near_or_open():
    return st.one_of(st.just(Time()), stamps())


# arbitrary requests, and plausible ones (a question the node knows, a camera it has, a window that
# may hold frames) so that the answering paths are fuzzed too, not only the checks before them
ask_requests = st.one_of(
    st.builds(Ask.Request, question=QUESTIONS,
              options=st.one_of(st.just([]), st.lists(texts(["red", "blue", "yes", "no"]), max_size=30),
                                st.lists(st.sampled_from(["red", "green", "blue", "yellow"]), min_size=1, max_size=4,
                                         unique=True)),
              camera=CAMERAS, max_new_tokens=st.one_of(st.integers(0, 4), st.sampled_from([16, 100, 100000, UINT32])),
              since=stamps(), until=stamps(), evidence_k=st.one_of(st.integers(0, 3), st.integers(0, UINT32))),
    st.builds(Ask.Request, question=st.sampled_from(["What is on the table?", "What color is the square now?",
                                                     "How many shapes are there?", "Did you see a red circle?"]),
              options=st.one_of(st.just([]), st.lists(st.sampled_from(["red", "green", "blue", "yes", "no", "3"]),
                                                      min_size=1, max_size=4, unique=True)),
              camera=st.sampled_from(["", CAM, "cam"]), max_new_tokens=st.integers(0, 6),
              since=near_or_open(), until=near_or_open(), evidence_k=st.integers(0, 4)))

when_requests = st.one_of(
    st.builds(When.Request, question=QUESTIONS,
              mode=texts(["last", "first", "timeline", "LAST", "Timeline", "sometimes"]), camera=CAMERAS,
              since=stamps(), until=stamps()),
    st.builds(When.Request, question=st.sampled_from(["Did you see a red circle?", "Is there a blue square?",
                                                      "Is the triangle green?"]),
              mode=st.sampled_from(["", "last", "first", "timeline", "FIRST", " Timeline "]),
              camera=st.sampled_from(["", CAM, "cam"]), since=near_or_open(), until=near_or_open()))

PATHS = texts([GOOD_SNAPSHOT, "..", "../good.pt", "./good.pt", "a/../../x.pt", "/tmp/fuzz.pt", "/etc/passwd",
               "missing/m.pt", "x" * 300, "a/" * 3000, "good.pt\0.txt", "\0", "~", "~/x.pt", ".", "/"])
save_requests = st.builds(SaveMemory.Request, path=PATHS)
load_requests = st.builds(LoadMemory.Request, path=PATHS)

DECLARED = sorted(set(params.all_specs()))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e308, 5e-324]))
INTS = st.one_of(st.integers(-INT64, INT64 - 1), st.sampled_from([-INT64, -1, 0, 1, INT64 - 1]))


@st.composite
def parameter_values(draw):
    """A ParameterValue of any type (the type field too: out-of-range types), any content."""
    value = ParameterValue(type=draw(st.one_of(st.integers(0, 9), st.integers(0, 255))))
    value.bool_value = draw(st.booleans())
    value.integer_value = draw(INTS)
    value.double_value = draw(FLOATS)
    value.string_value = draw(texts(["hermes", "fifo", "cpu", "", "[1, 2]"]))
    value.byte_array_value = [bytes([b]) for b in draw(st.binary(max_size=8))]
    value.bool_array_value = draw(st.lists(st.booleans(), max_size=4))
    value.integer_array_value = draw(st.lists(INTS, max_size=4))
    value.double_array_value = draw(st.lists(FLOATS, max_size=4))
    value.string_array_value = draw(st.lists(texts(["Did you see a red circle?", "Is the square red?"]), max_size=4))
    return value


# use_sim_time is rclpy's, not the node's: setting it stops the node's clock until a /clock
# arrives, which is no fault of the node's
NAMES = st.one_of(st.sampled_from([n for n in DECLARED if n != "use_sim_time"]),
                  st.sampled_from(["max_new_tokens", "sample_fps", "budget_tokens", "watch_questions"]),
                  texts(["nope", "hermes.nope", "qos_overrides./x.subscription.depth"]))
parameter_sets = st.lists(st.builds(ParameterMsg, name=NAMES, value=parameter_values()), min_size=1, max_size=3)


# -- the node and what it holds ------------------------------------------------------------------
@pytest.fixture(scope="module")
def snapshot_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("snapshots")


@pytest.fixture(scope="module")
def node(domain, qwen_adapter, snapshot_dir):
    units = qwen_adapter.preprocess(list(world.world_frames(2))).tokens_per_unit
    command = tiny_node(NS, [CAM], budget_tokens=KEPT_UNITS * units, max_question_tokens=64,
                        snapshot_dir=snapshot_dir, recall_chunks=2)
    with Proc(command, child_env(domain)) as proc:
        yield proc


@pytest.fixture(scope="module")
def fuzz(node, client, domain, tmp_path_factory):
    """The node with 12 frames seen, the oldest 4 evicted to the archive, none waiting, and the
    memory's own snapshot saved; the probe that sends the requests and reads the memory."""
    bag = bagfile.make_bag(tmp_path_factory.mktemp("bag") / "fuzz", frames=BAG_FRAMES, fps=2.0, topic=CAM)
    replay_lock_step(domain, bag, NS, "--fast")
    assert client.save(GOOD_SNAPSHOT).success
    probe = Probe(domain)
    probe.node_proc = node
    probe.status_before = status_of(client)
    probe.action = None  # the ask_action client, made at its first goal
    probe.services = {}  # service name -> its client
    probe.kinds = {}  # per request kind: [requests, refusals]
    yield probe
    probe.close()


def call(probe, srv_type, name: str, request):
    """The reply of service ``name``, through one client per service kept for the module (a new
    client each call would wait for discovery each time)."""
    service = probe.services.get(name)
    if service is None:
        service = probe.services[name] = probe.node.create_client(srv_type, name)
        assert service.wait_for_service(timeout_sec=HANG_GUARD_S), f"hang guard: no service {name}"
    return wait_done(probe, service.call_async(request))


def wait_done(probe, future):
    """The future's result, once done; fails at once when the node has ended."""
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard only
    while not future.done():
        assert probe.node_proc.alive(), f"the node ended:\n{probe.node_proc.output()[-5000:]}"
        assert time.monotonic() < deadline, "hang guard: no reply"
        time.sleep(0.002)
    return future.result()


def memory_of(probe) -> tuple:
    """What the node's memory holds, read without changing it: what a refused question (an empty
    one) says the memory holds, and memory_timeline's every frame with its tokens kept per layer."""
    refused = call(probe, Ask, f"{NS}/ask", Ask.Request(question=""))
    assert not refused.success and "empty" in refused.error_message
    timeline = call(probe, *TIMELINE)
    assert timeline.success, timeline.error_message
    return ((refused.frames_in_memory, refused.kv_tokens, (refused.oldest_stamp.sec, refused.oldest_stamp.nanosec),
             (refused.newest_stamp.sec, refused.newest_stamp.nanosec)),
            [((f.stamp.sec, f.stamp.nanosec), f.camera, f.unit, list(f.layer_kept)) for f in timeline.frames])


def status_of(client) -> tuple:
    """The memory in the node's memory_status: its tensors' bytes, tokens per layer, chunks, archive."""
    s = client.memory_status()
    return (s.frames_in_memory, s.kv_tokens, s.kv_bytes, list(s.layer_tokens), s.budget_tokens,
            (s.oldest_stamp.sec, s.oldest_stamp.nanosec), (s.newest_stamp.sec, s.newest_stamp.nanosec),
            s.chunks_encoded, s.chunks_failed, s.archive_chunks, s.archive_bytes, list(s.camera_frames_in_memory))


def _timeline_call():
    from streamcache_ros_interfaces.srv import MemoryTimeline  # noqa: PLC0415

    return MemoryTimeline, f"{NS}/memory_timeline", MemoryTimeline.Request()


TIMELINE = _timeline_call()


def sent(probe, kind: str, srv_type, name: str, request):
    """The node's response to ``request``: a success, or a refusal that says why; the memory as it
    was before either way."""
    before = memory_of(probe)
    response = call(probe, srv_type, f"{NS}/{name}", request)
    counts = probe.kinds.setdefault(kind, [0, 0])
    counts[0] += 1
    if response.success:
        assert response.error_message == "", response.error_message
    else:
        counts[1] += 1
        assert response.error_message.strip(), f"a refused {kind} says nothing"
    assert "internal error" not in response.error_message, response.error_message
    assert memory_of(probe) == before, f"{kind} changed the memory: {response.error_message[:300]}"
    return response


# -- the requests ---------------------------------------------------------------------------------
@FUZZ
@given(request=ask_requests)
def test_any_ask_is_answered_or_refused_and_leaves_the_memory(fuzz, request):
    response = sent(fuzz, "ask", Ask, "ask", request)
    if response.success and request.options:
        assert 0 <= response.option_index < len(request.options)


@FUZZ
@given(request=when_requests)
def test_any_when_is_answered_or_refused_and_leaves_the_memory(fuzz, request):
    response = sent(fuzz, "when", When, "when", request)
    if response.success:
        assert response.frames_searched >= 1


@FUZZ
@given(request=ask_requests)
def test_any_ask_goal_ends_answered_or_aborted_and_leaves_the_memory(fuzz, request):
    """The ask_action action: the same questions as goals; a refused one is aborted with its reason."""
    from action_msgs.msg import GoalStatus  # noqa: PLC0415
    from rclpy.action import ActionClient  # noqa: PLC0415
    from streamcache_ros_interfaces.action import Ask as AskAction  # noqa: PLC0415

    if fuzz.action is None:
        fuzz.action = ActionClient(fuzz.node, AskAction, f"{NS}/ask_action")
        assert fuzz.action.wait_for_server(timeout_sec=HANG_GUARD_S), "hang guard: no ask_action server"
    before = memory_of(fuzz)
    goal = AskAction.Goal(question=request.question, options=request.options, camera=request.camera,
                          max_new_tokens=request.max_new_tokens, since=request.since, until=request.until,
                          evidence_k=request.evidence_k)
    accepted = wait_done(fuzz, fuzz.action.send_goal_async(goal))
    assert accepted.accepted
    ended = wait_done(fuzz, accepted.get_result_async())
    counts = fuzz.kinds.setdefault("ask_action", [0, 0])
    counts[0] += 1
    if ended.status == GoalStatus.STATUS_SUCCEEDED:
        assert ended.result.success and ended.result.error_message == ""
    else:
        counts[1] += 1
        assert ended.status == GoalStatus.STATUS_ABORTED and not ended.result.success
        assert ended.result.error_message.strip() and "internal error" not in ended.result.error_message
    assert memory_of(fuzz) == before, f"ask_action changed the memory: {ended.result.error_message[:300]}"


@FUZZ
@given(camera=CAMERAS)
def test_any_memory_timeline_is_listed_or_refused_and_leaves_the_memory(fuzz, camera):
    from streamcache_ros_interfaces.srv import MemoryTimeline  # noqa: PLC0415

    sent(fuzz, "memory_timeline", MemoryTimeline, "memory_timeline", MemoryTimeline.Request(camera=camera))


@FUZZ
@given(request=save_requests)
def test_any_save_stays_in_snapshot_dir_and_leaves_the_memory(fuzz, snapshot_dir, request):
    outside = {p for p in pathlib.Path("/tmp").glob("fuzz*")}
    response = sent(fuzz, "save_memory", SaveMemory, "save_memory", request)
    assert {p for p in pathlib.Path("/tmp").glob("fuzz*")} == outside  # nothing written outside
    if response.success:
        written = [p for p in snapshot_dir.rglob("*") if p.is_file() and p.name != GOOD_SNAPSHOT]
        for path in written:  # keep the folder small over a long run
            path.unlink()


@FUZZ
@given(request=load_requests)
def test_any_load_is_of_snapshot_dir_and_leaves_the_memory(fuzz, request):
    response = sent(fuzz, "load_memory", LoadMemory, "load_memory", request)
    if response.success:  # only the memory's own snapshot is there to load
        assert response.frames_in_memory >= 1


@FUZZ
@given(parameters=parameter_sets)
def test_any_parameter_set_is_taken_or_refused_and_leaves_the_memory(fuzz, parameters):
    before = memory_of(fuzz)
    reply = call(fuzz, SetParameters, f"{NODE}/set_parameters", SetParameters.Request(parameters=parameters))
    counts = fuzz.kinds.setdefault("parameters", [0, 0])  # counted per parameter
    counts[0] += len(parameters)
    assert len(reply.results) == len(parameters)
    for result in reply.results:
        if not result.successful:
            counts[1] += 1
            assert result.reason.strip(), "a refused parameter says nothing"
    assert memory_of(fuzz) == before, "a parameter set changed the memory"


def test_a_parameter_of_no_known_type_is_refused_and_the_node_goes_on(fuzz, client):
    """ParameterValue.type is a uint8: rclpy's parameter service raised ValueError on 160, which
    ended the node (node/parameter_guard.py)."""
    unknown = ParameterMsg(name="max_new_tokens", value=ParameterValue(type=160, integer_value=3))
    known = ParameterMsg(name="max_new_tokens", value=ParameterValue(type=ParameterType.PARAMETER_INTEGER,
                                                                     integer_value=8))
    reply = call(fuzz, SetParameters, f"{NODE}/set_parameters", SetParameters.Request(parameters=[unknown, known]))
    assert [r.successful for r in reply.results] == [False, True]
    assert "type 160" in reply.results[0].reason and "max_new_tokens" in reply.results[0].reason
    assert client.ask("What is on the table?", camera=CAM, max_new_tokens=2).success


def test_after_the_fuzzing_the_node_answers_and_logged_no_traceback(fuzz, node, client):
    print(f"requests and refusals per kind: {fuzz.kinds}")
    assert node.alive()
    assert status_of(client) == fuzz.status_before  # kv_bytes, chunks and the archive as well
    answer = client.ask("What is on the table?", options=["red", "green", "blue"], camera=CAM, max_new_tokens=2)
    assert answer.success and 0 <= answer.option_index < 3, answer.error_message
    log = node.output()
    assert "Traceback" not in log and "internal error" not in log, log[-5000:]
