"""Cameras by name through streamcache_node over DDS (docs/interfaces.md "Cameras by name"): on a
node of two cameras a question about now with no camera is refused naming both, the memory
unchanged; a camera is named by its topic or its short name, in ask, when and memory_timeline."""
import pytest

from node_procs import Proc, child_env, replay_lock_step, tiny_node
from streamcache_ros.tools import bagfile

NS = "/sc_names"
FRONT, REAR = "/names/front/image_raw", "/names/rear/image_raw"


@pytest.fixture(scope="module")
def node(domain):
    with Proc(tiny_node(NS, [FRONT, REAR], policy="full"), child_env(domain)) as proc:
        yield proc


@pytest.fixture(scope="module")
def filled(client, domain, tmp_path_factory):
    folder = tmp_path_factory.mktemp("names")
    for topic, frames in ((FRONT, 8), (REAR, 4)):
        bag = bagfile.make_bag(folder / topic.split("/")[2], frames=frames, fps=1.0, topic=topic)
        replay_lock_step(domain, bag, NS, "--fast")
    return client


def test_a_question_about_now_names_its_camera_or_is_refused_with_the_list(filled):
    client = filled
    before = client.ask("What did you see?")  # not about now: every camera's frames
    assert before.success and before.frames_in_memory == 12
    refused = client.ask("What color is the square now?")
    assert not refused.success
    assert (f"a question about now must name its camera on a node of 2 cameras: set camera to one of "
            f"front ({FRONT}), rear ({REAR})") in refused.error_message
    for camera, held in (("front", 8), (FRONT, 8), ("rear", 4)):
        answer = client.ask("What color is the square now?", camera=camera)
        assert answer.success and answer.frames_in_memory == held, (camera, answer.error_message)
    assert client.ask("What did you see?").frames_in_memory == 12  # the refusal took nothing away


def test_when_and_the_timeline_take_short_names(filled):
    client = filled
    reply = client.when("Did you see a red circle?", "last", "rear")
    assert reply.success and reply.frames_searched == 4, reply.error_message
    assert {f.camera for f in client.memory_timeline("front").frames} == {FRONT}
    unknown = client.ask("What is there?", camera="side")
    assert not unknown.success and "short names: front, rear" in unknown.error_message
