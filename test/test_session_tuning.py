"""What may change while the stream runs: Session.tune changes max_new_tokens,
sample_fps (Qwen2.5-VL's time stride from the next chunk, the waiting frames encoded first at the old
rate) and a budget (the next chunk's compression brings the cache to it); anything it cannot take is
refused, with nothing changed (docs/interfaces.md, "Changing parameters at runtime")."""
import pytest
import torch

from streamcache_ros.engine import ConfigError, Session, SessionConfig

from conftest import policy_for

CHUNK = 4  # frames: two Qwen2.5-VL units


def feed(session, frames, first, step=1.0):
    for i, frame in enumerate(frames):
        session.add_frame(frame, stamp=first + i * step, camera="/cam")


def chunk_t_strides(policy, chunk_id):
    """The distinct steps of the M-RoPE t axis between the units of one chunk (layer 0)."""
    store = policy.layers[0]
    t = store.positions[0, store.chunks == chunk_id]
    return sorted(set(torch.diff(torch.unique(t)).tolist()))


def video_tokens(session):
    return max(len(store) for store in session.policy.layers) - len(session.adapter.prefix_ids)


def test_sample_fps_sets_the_time_stride_from_the_next_chunk(qwen_adapter, frames):
    tokens_per_second = qwen_adapter.model.config.vision_config.tokens_per_second
    qwen_adapter.set_sample_fps(1.0)
    session = Session(qwen_adapter, policy_for(qwen_adapter, "full"), SessionConfig(chunk_frames=CHUNK))
    try:
        feed(session, frames(CHUNK), 0.0)  # chunk 0 at 1 fps: a unit of 2 frames is 2 s of stream
        feed(session, frames(CHUNK, start=CHUNK), 10.0)  # chunk 1, still at 1 fps
        session.tune(sample_fps=2.0)
        feed(session, frames(CHUNK, start=2 * CHUNK), 20.0, step=0.5)  # chunk 2 at 2 fps
        assert chunk_t_strides(session.policy, 0) == [2 * tokens_per_second]
        assert chunk_t_strides(session.policy, 1) == [2 * tokens_per_second]
        assert chunk_t_strides(session.policy, 2) == [tokens_per_second]
    finally:
        qwen_adapter.set_sample_fps(1.0)  # the adapter is shared by the test session


def test_frames_waiting_for_their_chunk_are_encoded_at_the_old_rate(qwen_adapter, frames):
    qwen_adapter.set_sample_fps(1.0)
    session = Session(qwen_adapter, policy_for(qwen_adapter, "full"), SessionConfig(chunk_frames=CHUNK))
    try:
        feed(session, frames(2), 0.0)  # one unit waiting, not yet a chunk
        assert session.status().chunks_encoded == 0
        session.tune(sample_fps=4.0)
        assert session.status().chunks_encoded == 1 and session.pending_frames() == 0
    finally:
        qwen_adapter.set_sample_fps(1.0)


@pytest.mark.parametrize("name", ["fifo", "hermes", "uniform"])
def test_a_smaller_budget_compresses_at_the_next_chunk(qwen_adapter, frames, name):
    per_unit = qwen_adapter.preprocess(frames(2)).tokens_per_unit
    session = Session(qwen_adapter, policy_for(qwen_adapter, name, budget_tokens=8 * per_unit),
                      SessionConfig(chunk_frames=CHUNK))
    feed(session, frames(16), 0.0)  # 8 units: the budget
    assert video_tokens(session) <= 8 * per_unit
    held = video_tokens(session)
    session.tune(budget_tokens=3 * per_unit)
    assert video_tokens(session) == held and session.status().cache.budget_tokens == 3 * per_unit
    feed(session, frames(CHUNK, start=16), 16.0)
    assert video_tokens(session) <= 3 * per_unit + 1  # hermes's deep layers add one summary token


def test_max_new_tokens_is_the_next_answers_default(qwen_adapter, frames):
    session = Session(qwen_adapter, policy_for(qwen_adapter, "fifo", budget_tokens=96),
                      SessionConfig(chunk_frames=CHUNK, max_new_tokens=8))
    feed(session, frames(CHUNK), 0.0)
    session.tune(max_new_tokens=2)
    assert session.ask("describe the scene in detail").answer_tokens <= 2


@pytest.mark.parametrize("change, parameter", [
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"sample_fps": 0.0}, "sample_fps"),
    ({"budget_tokens": 64, "max_new_tokens": 3}, "budget_tokens")])
def test_what_cannot_be_taken_is_refused_and_nothing_changes(qwen_adapter, change, parameter):
    session = Session(qwen_adapter, policy_for(qwen_adapter, "full"), SessionConfig(max_new_tokens=8))
    with pytest.raises(ConfigError, match=f"parameter '{parameter}'"):
        session.tune(**change)  # full keeps no budget
    assert session.config.max_new_tokens == 8
