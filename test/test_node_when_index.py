"""``when`` over a long indexed archive through streamcache_node over DDS, while the camera streams
(docs/archive.md "When with the index"): a node restarted on an archive of 600 frames answers a
question that is never true from the index (not found, a handful of replays at most) while a bag
plays at 2 Hz into it, and drops none of those frames; ``when`` for an identity that was in view
finds it within 2 s. The bundled world model and its bundled index, real DDS between processes."""
import subprocess
import time

import pytest

from node_procs import HANG_GUARD_S, ROOT, Proc, child_env, client_of, python_module, tiny_node
from streamcache_ros import world
from streamcache_ros.engine import build_session
from streamcache_ros.tools import bagfile

NS = "/sc_when_index"
CAM = "/when_index/cam"
SEED = 800_000_555  # the tests' seed range: no training run draws it
ARCHIVED = 600
LIVE = 20
S = 1_000_000_000
LOOK = world.Look(160, 120, (40, 50, 60), 0, 0, False, "rgb8")
PARAMS = {"model_path": "world-qwen2_5_vl", "policy": "fifo", "budget_tokens": 48, "chunk_frames": 4}


@pytest.fixture(scope="module")
def archived(tmp_path_factory):
    """An archive of 600 frames written by the engine with the node's model and index, as a node
    that ran for ten minutes leaves it."""
    folder = tmp_path_factory.mktemp("when-index") / "archive"
    stream = world.make_stream(SEED, ARCHIVED, look=LOOK)
    session = build_session({**PARAMS, "archive_path": str(folder), "camera_topics": [CAM]})
    for i in range(ARCHIVED):
        session.add_frame(stream.frame(i), stream.stamp(i) + bagfile.DEFAULT_START_NS / S, camera=CAM)
    session.flush()
    session.close_archive()
    return folder, stream


def test_a_never_true_when_over_a_long_archive_drops_no_live_frame(domain, archived, tmp_path):
    folder, stream = archived
    seen = {v.identity for views in stream.truth for v in views}
    never = next((s, c) for s in world.SHAPES for c in world.COLOUR_NAMES if (s, c) not in seen)
    live = bagfile.make_world_bag(tmp_path / "live", SEED + 1, LIVE, look=LOOK, topic=CAM,
                                  start_ns=bagfile.DEFAULT_START_NS + (ARCHIVED + 100) * S)
    with Proc(tiny_node(NS, [CAM], **PARAMS, archive_path=str(folder)), child_env(domain)) as proc:
        with client_of(proc, domain, NS) as client:
            before = client.memory_status()
            assert before.archive_chunks == ARCHIVED // 4
            replay = subprocess.Popen(python_module("streamcache_ros.tools.replay", str(live), "--rate", "2"),
                                      cwd=ROOT, env=child_env(domain), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
            try:
                replies = []
                while replay.poll() is None:  # asked again and again while the bag plays
                    replies.append(client.when(world.SEEN_PROBE.format(shape=never[0], colour=never[1]), "first"))
                out, _ = replay.communicate(timeout=HANG_GUARD_S)
            finally:
                if replay.poll() is None:
                    replay.kill()
            assert replay.returncode == 0, out
            assert replies and all(r.success and not r.found and r.found_by == "index" for r in replies)
            assert max(r.recalled_chunks for r in replies) <= 4
            assert replies[0].frames_in_window >= ARCHIVED
            # the replay exits as its last frame leaves: that frame may still be on its way (a 10 s guard)
            waited_until = time.monotonic() + 10.0
            status = client.memory_status()
            while status.frames_sampled - before.frames_sampled < LIVE and time.monotonic() < waited_until:
                time.sleep(0.1)
                status = client.memory_status()
            assert status.frames_dropped == before.frames_dropped == 0
            assert status.frames_sampled - before.frames_sampled == LIVE
            identity = next(v.identity for v in stream.truth[ARCHIVED // 2])
            last = stream.identity_frames(identity, ARCHIVED)[-1]
            found = client.when(world.SEEN_PROBE.format(shape=identity[0], colour=identity[1]), "last",
                                until=(bagfile.DEFAULT_START_NS + ARCHIVED * S) / S)
            assert found.success and found.found and found.found_by == "index"
            assert abs(found.stamp.sec + found.stamp.nanosec / S - bagfile.DEFAULT_START_NS / S - stream.stamp(last)) <= 2
