"""A robot whose cameras or model changed still starts on its default archive (docs/archive.md
"Refusals"): over DDS, a node that ran with one camera leaves its archive at the default path; the
same node started with two cameras, then with another model, sets the old archive aside (renamed,
kept, a WARN naming it) and begins a new one; on an archive_path the user set, the same change is
refused at configure, with the same clear line, exit code 2. Real processes and DDS, one ROS home."""
import glob
import os
import tempfile

from node_procs import LOG_DIR, ROOT, Proc, client_of, replay_lock_step, tiny_node
from streamcache_ros.tools import bagfile
from streamcache_ros.tools.processes import child_env

NS = "/sc_default_archive"
FIRST = "/default_archive/image_raw"  # one camera, as a robot first ran
LEFT, RIGHT = "/default_archive/left/image_raw", "/default_archive/right/image_raw"  # after an update: two, renamed


def folder_of(home: str) -> str:
    return os.path.join(home, "streamcache", "archive", f"{NS.strip('/')}__streamcache_node")


def test_a_changed_robot_starts_on_its_default_archive_and_a_set_path_is_refused(domain, tmp_path):
    home = tempfile.mkdtemp(prefix="home-", dir=LOG_DIR)
    env = child_env(domain, (str(ROOT),), home)
    bag = bagfile.make_bag(tmp_path / "bag", frames=8, fps=1.0, topic=FIRST)
    with Proc(tiny_node(NS, [FIRST]), env) as proc:  # archive_path: default
        with client_of(proc, domain, NS) as client:
            replay_lock_step(domain, bag, NS, "--fast")
            assert client.memory_status().archive_chunks == 2
    folder = folder_of(home)
    assert os.path.isfile(os.path.join(folder, "archive.sqlite"))
    # the same robot with two cameras of other names: the archive holds a camera it does not have
    with Proc(tiny_node(NS, [LEFT, RIGHT]), env) as proc:
        with client_of(proc, domain, NS) as client:
            assert client.memory_status().archive_chunks == 0  # a new archive
        out = proc.output()
    assert f"holds frames of camera(s) '{FIRST}'" in out and "set aside as" in out, out
    assert "[WARN]" in out and "Traceback" not in out, out
    (aside,) = [p for p in glob.glob(os.path.join(folder, "archive.sqlite.set-aside-*"))
                if not p.endswith(("-wal", "-shm"))]
    # the same robot with another model: set aside again, still starts
    with Proc(tiny_node(NS, [LEFT, RIGHT], model_path="tiny-llava_onevision", budget_tokens=64), env) as proc:
        with client_of(proc, domain, NS) as client:
            assert client.memory_status().archive_chunks == 0
        assert "was written with model_id" in proc.output() and "set aside as" in proc.output()
    assert len([p for p in glob.glob(os.path.join(folder, "archive.sqlite.set-aside-*"))
                if not p.endswith(("-wal", "-shm"))]) == 2 and os.path.exists(aside)
    # a path the user set: refused, as before, with the clear line and nothing moved
    before = sorted(os.listdir(folder))
    refused = Proc(tiny_node(NS + "_set", [FIRST], archive_path=folder), env)
    assert refused.wait() == 2
    assert "archive_path" in refused.output() and "was written with model_id" in refused.output()
    assert "Traceback" not in refused.output() and sorted(os.listdir(folder)) == before
