"""The `ros2` command line against real processes: `ros2 launch streamcache_ros live.launch.py` with a
params file of our own, a replayed bag, then `ros2 param get`, `ros2 service call`, `ros2 action
send_goal --feedback`, `ros2 topic echo --once /diagnostics`; `ros2 run streamcache_ros
streamcache_node`; SIGINT ending each with nothing left behind.

One launch serves the whole module (the node's start dominates the time). The tests that use it run
in file order, the one that stops it last."""
import re
import subprocess

import pytest
import yaml

from node_procs import (status_name, HANG_GUARD_S, ROOT, Proc, client_of, needs_install, new_domain, ros2_env, run_launch,
                        run_replay, stop_and_check_all_gone, stop_ros2_daemon)
from streamcache_ros.tools import bagfile

pytestmark = needs_install

NS = "sc_cli"
CAMERA = "/sc_cli_cam/image_raw"
# differ from config/streamcache.yaml (= the node's defaults), so a value seen came from this file
BUDGET_TOKENS, SAMPLE_FPS = 24, 2.0  # 24 tokens: 4 units of 2 frames on the bundled world model
BAG_FRAMES, BAG_FPS = 16, 2.0


def ros2(domain, *args, timeout=HANG_GUARD_S) -> str:
    """`ros2 <args>`: its output; a non-zero exit fails the test with that output."""
    done = subprocess.run(["ros2", *args], cwd=ROOT, env=ros2_env(domain), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"ros2 {' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ros2_cli")
    params = yaml.safe_load((ROOT / "config" / "streamcache.yaml").read_text())
    node_params = params["/**"]["ros__parameters"]
    assert node_params["budget_tokens"] != BUDGET_TOKENS and node_params["sample_fps"] != SAMPLE_FPS
    # archive off: the working memory alone answers, and its frames are what the CLI prints
    node_params.update(budget_tokens=BUDGET_TOKENS, sample_fps=SAMPLE_FPS, policy="fifo", archive_path="")
    params_file = tmp / "streamcache.yaml"
    params_file.write_text(yaml.safe_dump(params))

    domain = new_domain()
    proc = run_launch(domain, "live.launch.py", f"namespace:={NS}", f"params_file:={params_file}",
                      f"camera_topics:=['{CAMERA}']")
    try:
        bag = bagfile.make_bag(tmp / "bag", frames=BAG_FRAMES, fps=BAG_FPS, topic=CAMERA)
        replay = run_replay(domain, bag, "--fast", "--lock-step", "--namespace", f"/{NS}", "--wait", str(HANG_GUARD_S))
        assert replay.returncode == 0, replay.stdout + replay.stderr + proc.output()
        yield domain, proc
    finally:
        proc.kill_group()  # a no-op after test_sigint_ends_the_launch
        left = stop_ros2_daemon(domain)
    assert not left, f"the ros2 daemon {left} still runs after `ros2 daemon stop`"


def test_param_get_shows_the_params_file(launched):
    domain, _ = launched
    # --timeout: how long to wait for the node to be discovered (a fresh daemon may not know it yet)
    wait = ("--timeout", str(HANG_GUARD_S // 2))
    out = ros2(domain, "param", "get", *wait, f"/{NS}/streamcache_node", "budget_tokens")
    assert out.strip() == f"Integer value is: {BUDGET_TOKENS}"
    out = ros2(domain, "param", "get", *wait, f"/{NS}/streamcache_node", "sample_fps")
    assert out.strip() == f"Double value is: {SAMPLE_FPS}"


def test_param_describe_and_get_show_array_types(launched):
    """`ros2 param describe` once said "Type: byte array" for the empty string array watch_questions,
    `get` "Byte values are: []", and after `set ... "[]"` "Boolean values are: []"."""
    domain, _ = launched
    wait = ("--timeout", str(HANG_GUARD_S // 2))
    node = f"/{NS}/streamcache_node"
    assert "Type: string array" in ros2(domain, "param", "describe", *wait, node, "watch_questions")
    assert "Type: integer array" in ros2(domain, "param", "describe", *wait, node, "evidence_layers")
    assert ros2(domain, "param", "get", *wait, node, "watch_questions").strip() == "String values are: []"
    assert "Set parameter successful" in ros2(domain, "param", "set", *wait, node, "watch_questions", "[]")
    assert ros2(domain, "param", "get", *wait, node, "watch_questions").strip() == "String values are: []"
    refused = subprocess.run(["ros2", "param", "set", *wait, node, "sample_fps", "fast"], cwd=ROOT, env=ros2_env(domain),
                             capture_output=True, text=True, timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL)
    said = refused.stdout + refused.stderr
    assert "parameter 'sample_fps': expected double, got string 'fast'" in said, said


def test_service_call_ask(launched):
    domain, _ = launched
    out = ros2(domain, "service", "call", f"/{NS}/ask", "streamcache_ros_interfaces/srv/Ask",
               "{question: 'How many objects are in view now?'}")
    response = out.split("response:", 1)[1]
    assert "Ask_Response(success=True" in response, out
    # 16 frames at 2 fps, all sampled at the file's 2 fps; its 24-token budget keeps the last 8
    assert re.search(r"\bframes_in_memory=(\d+)", response).group(1) == "8", out
    assert "error_message=''" in response, out


def test_action_send_goal_streams_feedback(launched):
    domain, _ = launched
    out = ros2(domain, "action", "send_goal", "--feedback", f"/{NS}/ask_action", "streamcache_ros_interfaces/action/Ask",
               "{question: 'How many objects are in view now?', max_new_tokens: 8}")
    # each message is printed as YAML with only its first line indented
    partials = [yaml.safe_load(line)["partial_answer"]
                for line in re.findall(r"^Feedback:\n\s+(partial_answer: .*)$", out, re.MULTILINE)]
    result = yaml.safe_load(re.search(r"^Result:\n(.*?)\n\nGoal finished", out, re.MULTILINE | re.DOTALL).group(1).lstrip())
    assert result["success"] is True, out
    # the text so far, growing; the last pieces may come after the result (a topic vs a service)
    assert partials and all(p.startswith(q) for q, p in zip(partials, partials[1:])), out
    assert result["answer"].startswith(partials[-1]), out
    assert result["frames_in_memory"] == 8 and result["answer_tokens"] <= 8, out
    assert out.rstrip().endswith("Goal finished with status: SUCCEEDED"), out


def test_topic_echo_diagnostics(launched):
    domain, _ = launched
    out = ros2(domain, "topic", "echo", "--once", "/diagnostics", "diagnostic_msgs/msg/DiagnosticArray")
    statuses = {s["name"]: s for s in yaml.safe_load(out.split("\n---", 1)[0])["status"]}
    assert sorted(statuses) == [status_name(NS, "camera " + CAMERA), status_name(NS, "index"),
                                status_name(NS, "latency"), status_name(NS, "memory")], out
    memory = {kv["key"]: kv["value"] for kv in statuses[status_name(NS, "memory")]["values"]}
    assert (memory["Policy"], memory["Frames in memory"], memory["Budget (video tokens per layer)"]) == (
        "fifo", "8", str(BUDGET_TOKENS)), out
    camera = {kv["key"]: kv["value"] for kv in statuses[status_name(NS, "camera " + CAMERA)]["values"]}
    assert camera["Frames received"] == str(BAG_FRAMES), out


def test_sigint_ends_the_launch(launched):
    _, proc = launched
    stop_and_check_all_gone(proc)


def test_ros2_run_then_sigint():
    domain = new_domain()
    with Proc(["ros2", "run", "streamcache_ros", "streamcache_node", "--ros-args", "-r", "__ns:=/sc_cli_run",
               "-p", "policy:=fifo", "-p", "budget_tokens:=72"], ros2_env(domain)) as proc:
        with client_of(proc, domain, "/sc_cli_run") as client:
            status = client.memory_status(timeout=HANG_GUARD_S)
            assert (status.policy, status.budget_tokens) == ("fifo", 72)
        stop_and_check_all_gone(proc, to_group=True)
