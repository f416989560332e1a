"""The streaming session on both tiny models: ingest, bounded memory, questions, snapshots."""
import numpy as np
import pytest
import torch

from streamcache_ros.engine import (ChunkError, FrameError, QuestionError, Session, SessionConfig, SnapshotError,
                                    failpoints, load_adapter, make_policy)
from streamcache_ros.engine.cache.rope import apply_rotary

from conftest import make_variant


def cache_state(session):
    return session.policy.state_dict()


def assert_same_state(a, b):
    assert len(a["layers"]) == len(b["layers"])
    for la, lb in zip(a["layers"], b["layers"]):
        for key in la:
            assert torch.equal(la[key], lb[key]), key


def feed(session, frames, start_stamp=0.0, camera=""):
    for i, frame in enumerate(frames):
        session.add_frame(frame, stamp=start_stamp + i * 0.5, camera=camera)


def test_ingest_and_ask(adapter, frames):
    session = Session(adapter, make_policy("fifo", budget_tokens=128), SessionConfig(chunk_frames=4))
    feed(session, frames(10))
    answer = session.ask("what is on the table?", max_new_tokens=6)
    assert isinstance(answer.text, str) and 1 <= answer.answer_tokens <= 6
    # the two queued frames were encoded before answering: all 10 frames are in memory
    assert answer.frames_in_memory == 10
    assert (answer.oldest_stamp, answer.newest_stamp) == (0.0, 4.5)
    assert answer.ttft_ms > 0 and answer.total_ms >= answer.ttft_ms
    assert session.status().chunks_encoded == 3


def test_fifo_never_exceeds_its_budget_over_a_long_stream(adapter, frames):
    budget = 96
    session = Session(adapter, make_policy("fifo", budget_tokens=budget), SessionConfig(chunk_frames=4))
    prefix = len(adapter.prefix_ids)
    sizes = []
    for i, frame in enumerate(frames(200)):
        report = session.add_frame(frame, stamp=i * 0.5)
        if report is not None:
            stats = session.status().cache
            assert all(n <= prefix + budget for n in stats.layer_tokens)
            sizes.append(stats.kv_bytes)
    assert len(sizes) == 50
    steady = sizes[len(sizes) // 2:]
    assert max(steady) == min(steady)  # flat after warm-up
    # the window is the newest frames: the oldest frame in memory is recent
    status = session.status()
    per_unit = session.chunks.last.tokens // session.chunks.last.units
    assert status.frames_in_memory <= (budget // per_unit + 1) * adapter.frames_per_unit
    assert status.newest_stamp == 199 * 0.5


def test_full_cache_grows_linearly(adapter, frames):
    session = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=4))
    lengths = []
    for i, frame in enumerate(frames(16)):
        if session.add_frame(frame, stamp=float(i)) is not None:
            lengths.append(session.status().cache.layer_tokens[0])
    steps = np.diff(lengths)
    assert len(set(steps.tolist())) == 1 and steps[0] > 0


def test_answering_twice_gives_the_same_answer_and_leaves_the_cache_unchanged(adapter, frames):
    session = Session(adapter, make_policy("fifo", budget_tokens=64), SessionConfig(chunk_frames=4))
    feed(session, frames(12))
    before = cache_state(session)
    first = session.ask("where is the red ball?", max_new_tokens=8)
    assert_same_state(before, cache_state(session))
    second = session.ask("where is the red ball?", max_new_tokens=8)
    assert_same_state(before, cache_state(session))
    assert (first.text, first.answer_tokens) == (second.text, second.answer_tokens)


def test_answers_depend_on_what_was_seen(adapter, frames):
    """A different stream gives different logits: the answer reads the cache."""
    logits = []
    for start in (0, 48):
        session = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=4))
        feed(session, frames(8, start=start))
        ids = adapter.question_ids("what colour is the square?", [])
        mark = session.policy.mark()
        hidden = adapter.forward(adapter.embed_text(ids), adapter.text_tokens(len(ids)), session.policy)
        logits.append(adapter.logits(hidden[0, -1]))
        session.policy.truncate(mark)
    assert (logits[0] - logits[1]).abs().max() > 1e-3


def test_streamed_text_adds_up_to_the_answer(adapter, frames):
    session = Session(adapter, make_policy("fifo", budget_tokens=64), SessionConfig(chunk_frames=4))
    feed(session, frames(4))
    pieces = []
    answer = session.ask("describe the scene", max_new_tokens=10, on_text=lambda partial, new: pieces.append(new))
    assert "".join(pieces).strip() == answer.text


def test_cancel_stops_between_tokens(qwen_adapter, frames):
    session = Session(qwen_adapter, make_policy("fifo", budget_tokens=64), SessionConfig(chunk_frames=4))
    feed(session, frames(4))
    before = cache_state(session)
    calls = []
    answer = session.ask("describe the scene", max_new_tokens=30,
                         should_stop=lambda: calls.append(1) or len(calls) > 2)
    assert answer.cancelled and answer.answer_tokens <= 2
    assert_same_state(before, cache_state(session))


@pytest.mark.parametrize("question, message", [
    ("", "the question is empty"),
    ("   \n\t", "the question is empty"),
    ("why " * 400, r"tokens with its prompt; the limit is 512 \(max_question_tokens\)"),
])
def test_bad_questions_are_refused_and_the_cache_is_unchanged(qwen_adapter, frames, question, message):
    session = Session(qwen_adapter, make_policy("fifo", budget_tokens=64), SessionConfig(chunk_frames=4))
    feed(session, frames(4))
    before = cache_state(session)
    with pytest.raises(QuestionError, match=message):
        session.ask(question)
    assert_same_state(before, cache_state(session))


def test_question_before_any_frame(qwen_adapter):
    session = Session(qwen_adapter, make_policy("fifo", budget_tokens=64))
    with pytest.raises(QuestionError, match="no frames in memory yet"):
        session.ask("what do you see?")


def test_cameras_are_chunked_apart_and_questions_can_pick_one(qwen_adapter, frames):
    session = Session(qwen_adapter, make_policy("full"), SessionConfig(chunk_frames=2))
    video = frames(8)
    for i in range(4):
        session.add_frame(video[i], stamp=float(i), camera="/front")
        session.add_frame(video[4 + i], stamp=100.0 + i, camera="/wrist")
    assert {info.camera for info in session.ledger.units.values()} == {"/front", "/wrist"}
    front = session.ask("what is there?", camera="/front", max_new_tokens=2)
    assert (front.frames_in_memory, front.oldest_stamp, front.newest_stamp) == (4, 0.0, 3.0)
    both = session.ask("what is there?", max_new_tokens=2)
    assert (both.frames_in_memory, both.oldest_stamp, both.newest_stamp) == (8, 0.0, 103.0)
    with pytest.raises(QuestionError, match="unknown camera '/rear'"):
        session.ask("what is there?", camera="/rear")


def test_bad_frames_are_refused(qwen_adapter):
    session = Session(qwen_adapter, make_policy("fifo", budget_tokens=64))
    for bad, message in [(np.zeros((4, 4), np.uint8), r"RGB \[H, W, 3\]"),
                         (np.zeros((4, 4, 3), np.float32), "uint8"),
                         (np.zeros((0, 4, 3), np.uint8), "empty"),
                         ([[1, 2, 3]], "numpy array")]:
        with pytest.raises(FrameError, match=message):
            session.add_frame(bad, stamp=0.0)
    assert session.pending_frames() == 0


def test_a_failing_chunk_is_dropped_and_the_cache_is_unchanged(adapter, frames):
    session = Session(adapter, make_policy("fifo", budget_tokens=64), SessionConfig(chunk_frames=4))
    feed(session, frames(4))
    before = cache_state(session)

    def fail_in_layer_2(layer, **_):
        if layer == 2:
            raise RuntimeError("simulated fault")

    with failpoints.armed(prefill=fail_in_layer_2), pytest.raises(ChunkError, match="simulated fault"):
        feed(session, frames(4, start=4))
    assert_same_state(before, cache_state(session))
    assert session.status().chunks_failed == 1
    feed(session, frames(4, start=8))  # ingest continues
    assert session.status().chunks_encoded == 2


def test_snapshot_round_trip_and_refusal(adapter, frames, tmp_path):
    session = Session(adapter, make_policy("fifo", budget_tokens=64), SessionConfig(chunk_frames=4))
    feed(session, frames(8))
    expected = session.ask("what is on the table?", max_new_tokens=6)
    path = str(tmp_path / "memory.pt")
    assert session.save(path) > 0

    restored = Session(adapter, make_policy("fifo", budget_tokens=64), SessionConfig(chunk_frames=4))
    assert restored.load(path) == 8
    assert_same_state(cache_state(session), cache_state(restored))
    again = restored.ask("what is on the table?", max_new_tokens=6)
    assert (again.text, again.frames_in_memory) == (expected.text, expected.frames_in_memory)

    other = Session(adapter, make_policy("fifo", budget_tokens=64, camera_budget_share="shared"),
                    SessionConfig(chunk_frames=4))
    before = cache_state(other)
    with pytest.raises(SnapshotError, match="made with policy_config .camera_budget_share='equal'.; this node runs"):
        other.load(path)  # another setting than the budget: refused, nothing changed
    assert_same_state(before, cache_state(other))
    with pytest.raises(SnapshotError, match="no snapshot at"):
        other.load(str(tmp_path / "missing.pt"))


@pytest.mark.parametrize("policy", ["fifo", "hermes"])
def test_a_snapshot_made_at_a_larger_budget_loads_and_the_next_chunk_brings_it_to_the_budget(adapter, frames, tmp_path,
                                                                                             policy):
    """docs/interfaces.md "ResetMemory, SaveMemory, LoadMemory": a budget changed at runtime must
    not leave the robot's snapshot unloadable at the next start."""
    session = Session(adapter, make_policy(policy, budget_tokens=96), SessionConfig(chunk_frames=4))
    feed(session, frames(16))
    path = str(tmp_path / "memory.pt")
    session.save(path)
    smaller = Session(adapter, make_policy(policy, budget_tokens=32), SessionConfig(chunk_frames=4))
    assert smaller.load(path) == session.status().frames_in_memory  # the whole memory, as saved
    assert_same_state(cache_state(session), cache_state(smaller))
    assert smaller.policy.config_dict()["budget_tokens"] == 32  # its own budget stays in force
    prefix = len(adapter.prefix_ids)
    assert max(smaller.status().cache.layer_tokens) > prefix + 32
    feed(smaller, frames(20)[16:])  # the next chunk's compression
    assert max(smaller.status().cache.layer_tokens) <= prefix + 32


@pytest.mark.parametrize("name", ["tiny-llava_onevision", "tiny-qwen2_5_vl"])
def test_positions_stay_in_range_over_a_stream_longer_than_the_model_range(name, tmp_path, frames):
    max_pos = 160
    adapter = load_adapter(make_variant(tmp_path, name, max_position_embeddings=max_pos))
    session = Session(adapter, make_policy("fifo", budget_tokens=48, reindex_margin=64),
                      SessionConfig(chunk_frames=4, max_new_tokens=8))
    seen = []
    for i, frame in enumerate(frames(120)):
        session.add_frame(frame, stamp=float(i))
        seen.append(session.policy.max_position())
        if i % 40 == 39:
            session.ask("what happened?", on_text=lambda *_: seen.append(session.policy.max_position()))
    assert max(seen) < max_pos
    assert session.status().cache.reindex_events > 0


def test_reindexed_keys_equal_keys_computed_at_the_new_positions(llava_adapter, frames, tmp_path):
    """Layer-0 keys depend only on their token: after a re-index they must equal the token's key
    computed from scratch at its new position (the rotary delta is exact)."""
    adapter = load_adapter(make_variant(tmp_path, "tiny-llava_onevision", max_position_embeddings=96))
    session = Session(adapter, make_policy("fifo", budget_tokens=32, reindex_margin=40), SessionConfig(chunk_frames=4))
    video = frames(40)
    embeds = {}
    for c in range(10):
        batch = video[4 * c:4 * c + 4]
        embeds[c] = adapter.encode(adapter.preprocess(batch))
        feed(session, batch, start_stamp=4.0 * c)
    store = session.policy.layers[0]
    assert session.policy.reindex_events > 0
    layer = adapter.text_model.layers[0]
    attn = layer.self_attn
    with torch.inference_mode():
        hidden = torch.cat([adapter.embed_text(adapter.prefix_ids)[0],
                            *_cached_video_embeds(store, session, embeds)])
        k = attn.k_proj(layer.input_layernorm(hidden[None]))
        k = k.view(1, hidden.shape[0], -1, attn.head_dim).transpose(1, 2)
        cos, sin = adapter.rotary_spec().cos_sin(store.positions, k.dtype)
        torch.testing.assert_close(store.keys, apply_rotary(k, cos, sin), atol=2e-5, rtol=0)


def _cached_video_embeds(store, session, embeds):
    """The visual embedding of every cached video token, in cache order."""
    out = []
    per_unit = next(iter(embeds.values())).shape[0] // 4
    for slot, (unit, chunk) in enumerate(zip(store.units.tolist(), store.chunks.tolist())):
        if unit < 0:
            continue
        first_unit = min(u for u, info in session.ledger.units.items() if info.chunk == chunk)
        # the window may start inside a unit: count a unit's tokens from its end in the cache
        last_slot_of_unit = max(i for i, u in enumerate(store.units.tolist()) if u == unit)
        index = per_unit - 1 - (last_slot_of_unit - slot)
        out.append(embeds[chunk][(unit - first_unit) * per_unit + index][None])
    return out
