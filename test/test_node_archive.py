"""The archive through streamcache_node over DDS (docs/archive.md): a question about frames the bounded
memory evicted is answered from the archive; after a SIGINT restart, and after a kill -9 in the middle
of a chunk, a new node on the same archive_path answers it the same; a second node on an archive in
use is refused with the parameter named; reset_memory clears the archive.

The tiny model has random weights: what is asserted is what the mechanism guarantees whatever the
weights (the same replayed chunks give the same answer; counts and stamps). Timeouts only guard
against hangs.
"""
import shutil
import signal
import sqlite3

import pytest

from node_procs import ROOT, Proc, child_env, client_of, replay_lock_step, stamp_ns, tiny_node
from streamcache_ros import world
from streamcache_ros.tools import bagfile

NS = "/sc_archive"
CAM = "/archive/cam"
START = bagfile.DEFAULT_START_NS
S = 1_000_000_000
FRAMES = 32
LOOK = world.Look(160, 120, (40, 50, 60), 0, 0, False, "rgb8")
QUESTION = "How many objects are in view now?"
OPTIONS = ["0", "1", "2"]


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    folder = tmp_path_factory.mktemp("archive-bags")
    first = bagfile.make_world_bag(folder / "first", 5, FRAMES, look=LOOK, topic=CAM)
    # six frames later on: one chunk of 4 and two frames of a chunk never finished
    later = bagfile.make_world_bag(folder / "later", 6, 6, look=LOOK, topic=CAM, start_ns=START + 100 * S)
    return first, later


def node(archive, **params):
    # fifo keeping two chunks: the first frames are evicted long before the questions
    return tiny_node(NS, [CAM], budget_tokens=24, archive_path=str(archive), **params)


def assert_one_file_at_rest(folder, chunks: int, copy_to) -> None:
    """After a clean stop the archive is one file: no write-ahead log with anything in it, and a
    copy of archive.sqlite alone holds every chunk."""
    wal = folder / "archive.sqlite-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    assert not (folder / "archive.sqlite-shm").exists()
    copy_to.mkdir()
    shutil.copy(folder / "archive.sqlite", copy_to / "archive.sqlite")
    db = sqlite3.connect(copy_to / "archive.sqlite")
    assert db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == chunks
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


def early_answer(client):
    """The question over the first 8 frames (evicted from the working memory)."""
    reply = client.ask(QUESTION, OPTIONS, since=START / S, until=(START + 7 * S) / S)
    assert reply.success, reply.error_message
    assert reply.recalled_chunks == 2 and 0 <= reply.option_index < 3
    assert stamp_ns(reply.oldest_stamp) == START and stamp_ns(reply.newest_stamp) == START + 7 * S
    return reply.answer, [round(float(p), 4) for p in reply.option_probabilities]


def test_the_archive_answers_across_a_sigint_and_a_kill_9_restart(domain, bags, tmp_path):
    first_bag, later_bag = bags
    archive = tmp_path / "archive"
    with Proc(node(archive), child_env(domain)) as proc:
        with client_of(proc, domain, NS) as c:
            replay_lock_step(domain, first_bag, NS, "--fast")
            before = early_answer(c)
            status = c.memory_status()
            assert status.archive_chunks == FRAMES // 4 and status.archive_bytes > 0
            assert stamp_ns(status.archive_oldest_stamp) == START
            assert stamp_ns(status.archive_newest_stamp) == START + (FRAMES - 1) * S
            assert status.frames_in_memory < 16  # the bounded memory holds far less
        assert f"archive: {archive} (0 chunk(s) kept from before" in proc.output()  # a new archive says where it is
        assert proc.stop() == 0  # SIGINT
    assert_one_file_at_rest(archive, FRAMES // 4, tmp_path / "copied")
    with Proc(node(archive), child_env(domain)) as proc:
        with client_of(proc, domain, NS) as c:
            assert f"archive: {archive} ({FRAMES // 4} chunk(s) kept from before" in proc.output()
            status = c.memory_status()
            assert status.frames_in_memory == 0 and status.archive_chunks == FRAMES // 4
            assert early_answer(c) == before
            replay_lock_step(domain, later_bag, NS, "--fast")
            # the last two frames wait for their chunk: a question would encode them, a kill loses them
            assert c.memory_status().archive_chunks == FRAMES // 4 + 1
        proc.kill_group()  # kill -9, mid-chunk
        assert proc.wait() == -signal.SIGKILL
    with Proc(node(archive), child_env(domain)) as proc:
        assert "damaged" not in proc.output()
        with client_of(proc, domain, NS) as c:
            status = c.memory_status()
            assert status.archive_chunks == FRAMES // 4 + 1  # only the chunk in progress was lost
            assert stamp_ns(status.archive_newest_stamp) == START + 103 * S
            assert early_answer(c) == before


def test_an_archive_in_use_is_refused_naming_the_parameter(domain, bags, tmp_path):
    archive = tmp_path / "shared"
    with Proc(node(archive), child_env(domain)) as holder:
        with client_of(holder, domain, NS):
            pass
        other = Proc(tiny_node(NS + "_b", [CAM], archive_path=str(archive)), child_env(domain))
        assert other.wait() == 2
        assert "archive_path" in other.output() and "in use by /sc_archive/streamcache_node" in other.output()
        assert "Traceback" not in other.output()


def test_reset_memory_clears_the_archive(domain, bags, tmp_path):
    with Proc(node(tmp_path / "reset"), child_env(domain)) as proc:
        with client_of(proc, domain, NS) as c:
            replay_lock_step(domain, bags[0], NS, "--fast")
            assert c.memory_status().archive_chunks == FRAMES // 4
            assert c.reset().success
            status = c.memory_status()
            assert status.archive_chunks == 0 and status.archive_bytes == 0
            reply = c.ask(QUESTION, OPTIONS, since=START / S, until=(START + 7 * S) / S)
            assert not reply.success and "no frames" in reply.error_message


@pytest.mark.parametrize("off", ["''", "Off"])  # 'off' is what a shell passes with no quoting
def test_archive_off_with_an_empty_path(domain, bags, tmp_path, off):
    with Proc(tiny_node(NS + "_off", [CAM], archive_path=off), child_env(domain)) as proc:
        with client_of(proc, domain, NS + "_off") as c:
            replay_lock_step(domain, bags[0], NS + "_off", "--fast")
            status = c.memory_status()
            assert status.archive_chunks == 0
            reply = c.ask(QUESTION, OPTIONS)
            assert reply.success and reply.recalled_chunks == 0
        assert "archive off (archive_path " in proc.output()
    assert not (ROOT / off).exists()


@pytest.mark.parametrize("off", ["off", "none", "''"])  # a shell's `off` reaches ROS as the YAML boolean false
def test_the_index_turns_off_from_the_command_line(domain, tmp_path, off):
    """The bundled world model's index is on by default; `-p retrieval_model_path:=off` (or none, or
    '') turns it off: the node starts, says so in its log and on /diagnostics, and `when` walks."""
    ns = NS + "_noindex"
    bag = bagfile.make_world_bag(tmp_path / "bag", 9, 16, look=LOOK, topic=CAM)
    params = {"model_path": "world-qwen2_5_vl", "archive_path": str(tmp_path / "archive"), "retrieval_model_path": off}
    with Proc(tiny_node(ns, [CAM], **params), child_env(domain)) as proc:
        with client_of(proc, domain, ns) as c:
            replay_lock_step(domain, bag, ns, "--fast")
            found = c.when("Did you see a red circle?", "last", since=START / S, until=(START + 15 * S) / S)
            assert found.success and found.found_by in ("walk", "memory"), found
        assert "archive index off (retrieval_model_path" in proc.output() and "Traceback" not in proc.output()


def test_the_index_in_use_is_named_at_start_with_its_trust(domain, tmp_path):
    ns = NS + "_index"
    params = {"model_path": "world-qwen2_5_vl", "archive_path": str(tmp_path / "archive")}
    with Proc(tiny_node(ns, [CAM], **params), child_env(domain)) as proc:
        with client_of(proc, domain, ns):
            pass
        assert "archive index world-retrieval@" in proc.output() and "trusted" in proc.output()


def test_a_users_own_encoder_is_named_at_start_and_when_says_what_it_did_not_read(domain, tmp_path):
    """A CLIP of the user's through retrieval_model_path (a tiny random one here): the node starts,
    names it with a WARN (not trusted on the shape world's calibration), /diagnostics says so, and a
    `when` it cannot settle walks and says whether it read the whole window."""
    from streamcache_ros.tools.other_encoders import tiny_dual_encoder  # noqa: PLC0415

    ns = NS + "_clip"
    encoder = tiny_dual_encoder("clip", tmp_path / "my-clip")
    bag = bagfile.make_world_bag(tmp_path / "bag", 9, 40, look=LOOK, topic=CAM)
    params = {"model_path": "world-qwen2_5_vl", "archive_path": str(tmp_path / "archive"),
              "retrieval_model_path": str(encoder)}
    with Proc(tiny_node(ns, [CAM], **params), child_env(domain)) as proc:
        with client_of(proc, domain, ns) as c:
            replay_lock_step(domain, bag, ns, "--fast")
            found = c.when("Did you see a red circle?", "last", since=START / S, until=(START + 39 * S) / S)
            assert found.success and found.found_by in ("index", "walk", "index_unsure")
            assert found.found or not found.search_complete or found.found_by == "index_unsure"
        out = proc.output()
    assert "archive index my-clip@" in out and "not trusted" in out and "[WARN]" in out, out
