"""`options_mode: generated` (docs/interfaces.md "Options"): the answer is generated freely and then
matched to an option, the HERMES reference's way. What it guarantees whatever the weights (the
tiny model): the option named is the one the answer text names (``match_option``), never an index
outside the options, no probabilities; and with a trained world model, on fixed held-out streams,
that the text it generates names an option and mostly the scored one. Through the node over DDS: the
response carries the same. Deterministic (greedy, CPU); no timing."""
from __future__ import annotations

import numpy as np
import pytest

from node_procs import Proc, child_env, client_of, replay_lock_step, tiny_node
from streamcache_ros import world
from streamcache_ros.engine import Session, SessionConfig, load_adapter, make_policy
from streamcache_ros.engine.adapters import match_option
from streamcache_ros.tools import bagfile

# Floors written down before these streams were answered in generated mode (docs/world-models.md
# "Tests"): on 15 questions of other seeds the world Qwen2.5-VL named an option every time and the
# scored one every time, right 14 of 15 (as scored); the floor of test_world_models for accuracy.
NAMES_AN_OPTION_FLOOR = 0.95
AGREES_WITH_SCORED_FLOOR = 0.90
ACCURACY_FLOOR = 0.82
HELD_OUT = 800_000_000  # the held-out seeds of test_world_models (no training run draws them)
LOOK = dict(width=320, height=240, background=(40, 50, 60), noise=4, colour_jitter=10, jitter_per_frame=True,
            encoding="rgb8")
QUESTIONS = [("what is there?", ["a circle", "a square", "nothing"]), ("Is it red?", ["yes", "no"]),
             ("which colour?", ["red", "green", "blue", "yellow"]), ("how many?", ["0", "1", "2", "3", "4"])]


def fed(adapter, mode: str, stream) -> Session:
    session = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=8, options_mode=mode))
    for i in range(len(stream)):
        session.add_frame(stream.frame(i), stamp=stream.stamp(i))
    return session


def test_generated_names_the_option_its_text_names(qwen_adapter, frames):
    session = Session(qwen_adapter, make_policy("full"), SessionConfig(chunk_frames=4, options_mode="generated"))
    for i, frame in enumerate(frames(8)):
        session.add_frame(frame, stamp=float(i))
    for question, options in QUESTIONS:
        answer = session.ask(question, options)
        assert answer.option_index == match_option(answer.text, options), (question, answer.text)
        assert -1 <= answer.option_index < len(options)
        assert answer.option_probabilities == []  # scored mode's alone
        assert 1 <= answer.answer_tokens <= SessionConfig().mc_max_new_tokens  # an option's short answer


@pytest.fixture(scope="module", params=["world-qwen2_5_vl", "world-llava_onevision"])
def world_model(request):
    return load_adapter(request.param, device="cpu", dtype="float32")


def test_a_trained_model_generates_an_option_and_mostly_the_scored_one(world_model):
    named = agreed = right = total = 0
    for seed in range(4):
        stream = world.make_stream(HELD_OUT + seed, 32, look=world.Look(**LOOK))
        generated, scored = fed(world_model, "generated", stream), fed(world_model, "scored", stream)
        for q in stream.questions(len(stream), np.random.default_rng((stream.seed, 1)), world.OPTION_KINDS):
            free, chosen = generated.ask(q.text, q.options), scored.ask(q.text, q.options)
            assert free.option_index == match_option(free.text, q.options) and chosen.option_index >= 0
            total += 1
            named += free.option_index >= 0
            agreed += free.option_index == chosen.option_index
            right += free.option_index == q.answer_index
    assert total >= 16
    assert named / total >= NAMES_AN_OPTION_FLOOR, (named, total)
    assert agreed / total >= AGREES_WITH_SCORED_FLOOR, (agreed, total)
    assert right / total >= ACCURACY_FLOOR, (right, total)


NS = "/sc_generated"
CAM = "/generated/cam"


def test_the_node_in_generated_mode_names_the_option_its_answer_names(domain, tmp_path):
    """Over DDS, the world model in options_mode generated: every world question with options is
    answered with the option its text names, no probabilities."""
    bag = bagfile.make_world_bag(tmp_path / "world", seed=HELD_OUT + 77, frames=16, look=world.Look(**LOOK), topic=CAM)
    node = tiny_node(NS, [CAM], model_path="world-qwen2_5_vl", policy="full", options_mode="generated")
    with Proc(node, child_env(domain)) as proc, client_of(proc, domain, NS) as client:
        replay_lock_step(domain, bag, NS, "--fast")
        asked = [q for q in bagfile.read_world_questions(bag)["questions"] if q.get("options")]
        assert asked
        for q in asked:
            reply = client.ask(q["text"], options=q["options"])
            assert reply.success, reply.error_message
            assert reply.option_index == match_option(reply.answer, q["options"]) >= 0, (q["text"], reply.answer)
            assert list(reply.option_probabilities) == []
