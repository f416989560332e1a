"""streamcache_node as a robot integrator meets it, a real process with the tiny model in namespace
/sc_robot, its camera given by a relative name:

- one resolved camera name everywhere: the log, the diagnostics, MemoryStatus, errors;
- a refused question reports what the memory holds (docs/interfaces.md, "What the numbers mean");
- save_memory / load_memory confined to snapshot_dir; a damaged file is refused, the memory kept
  (docs/reliability.md, "Memory across restarts");
- streamcache-ask: JSON printed one way, the matched option shown;
- parameters changed at runtime, or refused saying why and how (docs/interfaces.md, "Changing
  parameters at runtime").

Expected figures by hand: stamps 0.5 s apart sampled at 1 fps (the first frame of each second),
chunks of 4 frames, a FIFO budget of 8 units of two frames (16 frames). Timeouts only guard hangs."""
import json
import os
import subprocess

import pytest

from node_procs import status_name, HANG_GUARD_S, ROOT, Proc, child_env, python_module, replay_lock_step, stamp_ns, tiny_node
from streamcache_ros import world
from streamcache_ros.tools import bagfile

NS = "/sc_robot"
WRITTEN, RESOLVED = "cam/image_raw", "/sc_robot/cam/image_raw"
START = bagfile.DEFAULT_START_NS
S = 1_000_000_000
UNITS = 8


@pytest.fixture(scope="module")
def per_unit(qwen_adapter):
    return qwen_adapter.preprocess(list(world.world_frames(2))).tokens_per_unit


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    return tmp_path_factory.mktemp("snapshots")


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    d = tmp_path_factory.mktemp("bags")
    return {"first": bagfile.make_bag(d / "first", frames=40, fps=2.0, topic=RESOLVED),  # 0-19.5 s
            "later": bagfile.make_bag(d / "later", frames=8, fps=2.0, topic=RESOLVED, first_frame=40,
                                      start_ns=START + 100 * S),  # 100-103.5 s
            "faster": bagfile.make_bag(d / "faster", frames=8, fps=2.0, topic=RESOLVED, first_frame=48,
                                       start_ns=START + 200 * S)}  # 200-203.5 s


@pytest.fixture(scope="module")
def node(domain, per_unit, snapshots):
    # the working memory alone answers a plain question here: its bound is what is asserted (the archive
    # reads the day for one: test_node_archive.py, test_node_when_index.py)
    command = tiny_node(NS, [WRITTEN], budget_tokens=UNITS * per_unit, max_question_tokens=64, snapshot_dir=snapshots,
                        archive_path="''")
    with Proc(command, child_env(domain)) as proc:
        yield proc


def test_one_resolved_camera_name_everywhere(client, domain, bags, probe, node):
    refused = client.ask("What is on the table?", camera=WRITTEN)
    assert refused.error_message == f"no frames from camera '{RESOLVED}' yet"
    assert client.ask("?", camera="/elsewhere").error_message.endswith(f"(camera_topics: {RESOLVED}; short names: cam)")
    assert client.memory_status().cameras == [RESOLVED]
    probe.wait_for(lambda: any(s.name == status_name(NS, f"camera {RESOLVED}") for a in probe.diagnostics
                               for s in a.status), what="the camera's diagnostics")
    assert f"listening on {RESOLVED}" in node.output() and f"camera {RESOLVED}: subscribed" in node.output()
    replay_lock_step(domain, bags["first"], NS, "--fast")
    as_written, resolved = client.ask("What is on the table?", camera=WRITTEN), client.ask("What?", camera=RESOLVED)
    assert as_written.success and as_written.frames_in_memory == resolved.frames_in_memory == 16
    status = client.memory_status()
    assert (status.cameras, list(status.camera_frames_in_memory)) == ([RESOLVED], [16])


def test_a_refused_question_reports_what_the_memory_holds(client):
    status = client.memory_status()
    for camera in ("", WRITTEN):
        refused = client.ask("   ", camera=camera)
        assert not refused.success and refused.error_message == "the question is empty"
        assert (refused.frames_in_memory, refused.kv_tokens) == (16, status.kv_tokens)
        assert stamp_ns(refused.oldest_stamp) == stamp_ns(status.oldest_stamp) > 0


def test_snapshots_stay_in_snapshot_dir(client, snapshots, tmp_path):
    saved = client.save("kept.pt")
    assert saved.success and (snapshots / "kept.pt").stat().st_size == saved.bytes_written
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, snapshots / "link")
    for name, words in [(str(tmp_path / "x.pt"), "is an absolute path"), ("../x.pt", "contains '..'"),
                        ("sub/../../x.pt", "contains '..'"), ("link/x.pt", "leads out of snapshot_dir")]:
        for call in (client.save, client.load):
            r = call(name)
            assert not r.success and words in r.error_message and str(snapshots) in r.error_message, (name, r)
    assert not list(outside.iterdir()) and not (tmp_path / "x.pt").exists()
    damaged = snapshots / "damaged.pt"
    damaged.write_bytes((snapshots / "kept.pt").read_bytes()[:-100])
    r = client.load("damaged.pt")
    assert not r.success and "damaged" in r.error_message
    assert client.ask("What is on the table?").frames_in_memory == 16  # unharmed
    loaded = client.load("kept.pt")
    assert loaded.success and loaded.frames_in_memory == 16


def cli(domain, *args):
    return subprocess.run(python_module("streamcache_ros.client.ask_cli", "--namespace", NS, *args), cwd=ROOT,
                          env=child_env(domain), capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_the_cli_prints_json_one_way_and_names_the_matched_option(client, domain):
    status = cli(domain, "--status")
    assert status.returncode == 0 and json.loads(status.stdout)["cameras"] == [RESOLVED]
    answer = cli(domain, "--json", "Is it red?", "--option", "yes", "--option", "no")
    assert answer.returncode == 0 and status.stdout.startswith("{\n  ") and answer.stdout.startswith("{\n  ")
    reply = json.loads(answer.stdout)
    # options scored (the node's default): the answer is always one of the options
    assert reply["option_index"] in (0, 1) and reply["option"] == ["yes", "no"][reply["option_index"]]
    assert reply["answer"] == reply["option"]
    for extra in ((), ("--stream",)):
        plain = cli(domain, *extra, "Is it red?", "--option", "yes", "--option", "no")
        lines = plain.stdout.strip().splitlines()
        assert plain.returncode == 0 and sum(line.startswith("(option ") for line in lines) == 1, plain.stdout
    saved = cli(domain, "--save", "cli.pt")
    assert saved.returncode == 0 and "to cli.pt in the node's snapshot_dir" in saved.stdout


def set_parameter(probe, name, value):
    return probe.set_parameter(f"{NS}/streamcache_node", name, value)


def test_parameters_changed_at_runtime(client, domain, bags, probe, per_unit, node):
    assert set_parameter(probe, "max_new_tokens", 2).successful
    assert client.ask("Describe everything you saw in detail.").answer_tokens <= 2
    # a smaller budget: the next chunk is compressed to it
    assert set_parameter(probe, "budget_tokens", 4 * per_unit).successful
    assert client.memory_status().budget_tokens == 4 * per_unit
    replay_lock_step(domain, bags["later"], NS, "--fast")  # 8 frames, 4 sampled at 1 fps: one chunk
    after = client.ask("What is on the table?")
    assert after.frames_in_memory == 8 and stamp_ns(after.newest_stamp) == START + 103 * S
    refused = set_parameter(probe, "budget_tokens", (UNITS + 1) * per_unit)
    assert not refused.successful and "above the budget configured" in refused.reason
    # twice the sampling rate: all 8 frames of a 2 fps bag are taken, none dropped
    before = client.memory_status()
    assert set_parameter(probe, "sample_fps", 2.0).successful
    replay_lock_step(domain, bags["faster"], NS, "--fast")
    status = client.memory_status()
    assert status.frames_sampled - before.frames_sampled == 8 and status.frames_dropped == 0
    for name, value in [("chunk_frames", 8), ("policy", "full"), ("model_path", "tiny-llava_onevision")]:
        refused = set_parameter(probe, name, value)
        assert not refused.successful and refused.reason.startswith(f"{name} cannot change while streamcache_node is "
                                                                    "configured")
        assert "lifecycle reconfigure" in refused.reason and "policy_params_file" in refused.reason
    assert "changed at runtime: sample_fps 2.0 (from the next chunk)" in node.output()
