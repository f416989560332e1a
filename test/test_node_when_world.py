"""`when` through streamcache_node over DDS with the bundled world model, where the yes is known:
fixed held-out world streams (bags) whose truth says when each asked identity was first and last in
view. The stamps the node returns are checked against that truth, not only "among the frames in
memory" (test/test_node_when.py runs the random tiny model, whose yes is anybody's guess).

Deterministic: fixed seeds, greedy, CPU float32; timeouts only as hang guards. The floor is
test_world_models' (the when search's last / first stamp within 2 s, WHEN_FLOOR), set before these
streams were run through the node (docs/world-models.md "Tests").
"""
import pytest

from node_procs import Proc, child_env, client_of, replay_lock_step, stamp_ns, tiny_node
from streamcache_ros import world
from streamcache_ros.tools import bagfile

NS = "/sc_when_world"
CAM = "/when_world/cam"
S = 1_000_000_000
FRAMES = 32
SEEDS = [800_000_090 + i for i in range(6)]  # held out: no training run draws them
WHEN_FLOOR = 0.70
WHEN_TOLERANCE_S = 2.0
LOOK = world.Look(width=320, height=240, background=(40, 50, 60), noise=4, colour_jitter=10, jitter_per_frame=True,
                  encoding="rgb8")
MODES = {"last_seen": "last", "first_seen": "first"}


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    folder = tmp_path_factory.mktemp("when_world")
    return [bagfile.make_world_bag(folder / str(seed), seed, FRAMES, look=LOOK, topic=CAM) for seed in SEEDS]


def test_when_finds_the_stamps_the_truth_gives(domain, bags):
    node = tiny_node(NS, [CAM], model_path="world-qwen2_5_vl", policy="full", chunk_frames=8)
    near, asked = 0, 0
    with Proc(node, child_env(domain)) as proc, client_of(proc, domain, NS) as client:
        for bag in bags:
            assert client.reset().success
            replay_lock_step(domain, bag, NS, "--fast")
            memory = [stamp_ns(f.stamp) for f in client.memory_timeline().frames]
            assert len(memory) == FRAMES
            for q in bagfile.read_world_questions(bag)["questions"]:
                if q["kind"] not in MODES or q["after_frames"] != FRAMES:
                    continue
                reply = client.when(q["probe"], MODES[q["kind"]])
                assert reply.success, reply.error_message
                # the full cache holds every frame: the search reaches the first, nothing evicted
                assert stamp_ns(reply.searched_since) == memory[0] and not reply.evicted_before
                asked += 1
                if reply.found:
                    assert stamp_ns(reply.stamp) in memory and reply.camera == CAM
                    near += abs(stamp_ns(reply.stamp) - q["answer_stamp_ns"]) <= WHEN_TOLERANCE_S * S
    assert asked >= len(bags)
    assert near / asked >= WHEN_FLOOR, (near, asked)
