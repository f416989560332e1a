"""A full disk under the archive, through streamcache_node over DDS (docs/reliability.md "A full disk"):
the archive's folder is a small tmpfs; the node goes on taking frames in, counts the chunks it could not
archive (MemoryStatus.chunks_not_archived), says ERROR in /diagnostics while the count grows, logs one
WARN for the episode (no traceback), and once space returns archives again and names the hole in
replies and in memory_timeline. A reset then deletes the archived chunks and says how many.

Skipped only where a tmpfs cannot be mounted (not root, no mount namespace). Timeouts only guard hangs.
"""
import subprocess

import pytest

from node_procs import Proc, child_env, replay_lock_step, status_name, tiny_node
from streamcache_ros import world
from streamcache_ros.tools import bagfile

NS = "/sc_full_disk"
CAM = "/full_disk/cam"
START = bagfile.DEFAULT_START_NS
S = 1_000_000_000
LOOK = world.Look(160, 120, (40, 50, 60), 0, 0, False, "rgb8")
DISK = "160k"  # the schema and a few of the tiny model's chunks


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    folder = tmp_path_factory.mktemp("small-disk")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0700", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here: {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    folder = tmp_path_factory.mktemp("full-disk-bags")
    return (bagfile.make_world_bag(folder / "filling", 7, 48, look=LOOK, topic=CAM),
            bagfile.make_world_bag(folder / "after", 8, 8, look=LOOK, topic=CAM, start_ns=START + 200 * S))


@pytest.fixture(scope="module")
def node(small_disk, domain):
    with Proc(tiny_node(NS, [CAM], budget_tokens=24, archive_path=str(small_disk / "archive")),
              child_env(domain)) as proc:
        yield proc


def test_a_full_disk_is_survived_counted_shown_and_named_as_a_hole(node, client, probe, domain, bags, small_disk):
    from diagnostic_msgs.msg import DiagnosticStatus  # noqa: PLC0415

    filling, after = bags
    replay_lock_step(domain, filling, NS, "--fast")
    status = client.memory_status()
    assert status.chunks_encoded == 12 and status.chunks_failed == 0  # every chunk is in the working memory
    assert status.chunks_not_archived > 0
    assert status.archive_chunks + status.chunks_not_archived == 12
    probe.wait_for(lambda: any(s.name == status_name(NS, "memory") and s.level == DiagnosticStatus.ERROR
                               and "archive not writing" in s.message for a in probe.diagnostics for s in a.status),
                   what="the memory diagnostic at ERROR")
    log = node.output()
    assert log.count("chunks are not being archived") == 1 and "Traceback" not in log

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)  # space returns
    replay_lock_step(domain, after, NS, "--fast")
    status = client.memory_status()
    assert status.chunks_encoded == 14 and status.archive_holes >= 1
    node.wait_for_output("archive: writing again after")
    reply = client.ask("How many objects are in view now?", ["0", "1", "2"], since=START / S,
                       until=(START + 300 * S) / S)
    assert reply.success, reply.error_message
    assert "disk" in list(reply.hole_reasons) and reply.evicted_before
    hole = list(reply.hole_reasons).index("disk")
    assert reply.hole_since[hole].sec >= START // S and reply.hole_until[hole].sec < START // S + 48
    timeline = client.memory_timeline()
    assert "disk" in list(timeline.hole_reasons)

    archived = client.memory_status().archive_chunks
    reset = client.reset()
    assert reset.success and reset.archived_chunks_cleared == archived
    assert client.memory_status().archive_chunks == 0
