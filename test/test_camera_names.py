"""Cameras by name (docs/interfaces.md "Cameras by name"): a camera is named by its topic or by its
short name (``front`` for ``/front/image_raw``); a question about now on a session of several
cameras must name one, and is refused with the list otherwise, the memory unchanged."""
import pytest

from streamcache_ros.engine import QuestionError, Session, SessionConfig, make_policy
from streamcache_ros.engine.questions.checks import resolved_camera, short_camera_name

FRONT, REAR = "/front/image_raw", "/robot/rear/image_raw/compressed"


@pytest.mark.parametrize("topic, short", [(FRONT, "front"), (REAR, "rear"), ("/camera/color/image_raw", "camera"),
                                          ("/cam", "cam"), ("image_raw", "image_raw"), ("/a/left", "left")])
def test_the_short_name_is_the_last_segment_that_is_not_an_image_kind(topic, short):
    assert short_camera_name(topic) == short


def test_a_short_name_shared_by_two_cameras_names_neither():
    assert resolved_camera("front", (FRONT, REAR)) == FRONT
    assert resolved_camera(REAR, (FRONT, REAR)) == REAR and resolved_camera("", (FRONT,)) == ""
    with pytest.raises(QuestionError, match="short name of several cameras"):
        resolved_camera("cam", ("/cam", "/cam/compressed"))


@pytest.fixture
def session(qwen_adapter, frames):
    s = Session(qwen_adapter, make_policy("full"), SessionConfig(chunk_frames=4, cameras=(FRONT, REAR)))
    for i, frame in enumerate(frames(8)):
        s.add_frame(frame, stamp=float(i), camera=FRONT if i % 2 else REAR)
    return s


def test_a_question_about_now_must_name_its_camera(session):
    waiting = session.pending_frames()
    for question in ("What color is the square now?", "What is currently in view?", "How many objects at the moment?"):
        with pytest.raises(QuestionError, match=r"a question about now must name its camera on a node of 2 cameras: "
                                                r"set camera to one of front \(/front/image_raw\), rear \(/robot/rear"):
            session.ask(question, max_new_tokens=1)
    assert session.pending_frames() == waiting and session.questions_answered == 0  # refused before anything
    by_short = session.ask("What color is the square now?", camera="front", max_new_tokens=1)
    by_topic = session.ask("What color is the square now?", camera=FRONT, max_new_tokens=1)
    assert by_short.text == by_topic.text and by_short.frames_in_memory == by_topic.frames_in_memory == 4
    assert all(e.camera == FRONT for e in by_short.evidence)
    assert session.ask("What did you see?", max_new_tokens=1).frames_in_memory == 8  # not about now: every camera


def test_when_and_the_timeline_take_short_names(session):
    assert session.when("Did you see a red circle?", camera="rear").frames_searched == 4
    assert {f.camera for f in session.memory_timeline("rear").frames} == {REAR}
    with pytest.raises(QuestionError, match=r"unknown camera 'side' \(camera_topics: .*; short names: front, rear\)"):
        session.ask("what?", camera="side")
