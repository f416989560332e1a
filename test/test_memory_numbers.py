"""Numbers with one meaning (docs/interfaces.md, "What the numbers mean"):

- ``frames_in_memory`` counts the frames of which some layer (H2SVC: some KV head) still holds at
  least half the tokens. HERMES under a tiny budget keeps a token or two of very many frames in some
  layer; those frames are not "in memory" (counted so, 60 tokens held 206 frames).
- ``kv_tokens`` of an answer is what it attended over: the system prompt, summary tokens and the
  asked camera's frames (every camera's without one); summed over layers.
The expected figures are worked out here from the cache's own storage, independently of the session."""
import pytest
import torch

from streamcache_ros.engine import Session, SessionConfig

from conftest import policy_for


def feed(session, frames, camera, first=0.0):
    for i, frame in enumerate(frames):
        session.add_frame(frame, stamp=first + i, camera=camera)


def held_per_layer(policy):
    """{unit: [tokens held in each layer]}."""
    out = {}
    for layer, store in enumerate(policy.layers):
        units, counts = torch.unique(store.units[store.units >= 0], return_counts=True)
        for unit, count in zip(units.tolist(), counts.tolist()):
            out.setdefault(unit, [0] * len(policy.layers))[layer] = count
    return out


def test_hermes_under_a_tiny_budget_counts_only_frames_half_held_somewhere(qwen_adapter, frames):
    per_unit = qwen_adapter.preprocess(frames(2)).tokens_per_unit
    budget = 5 * per_unit  # five units' worth of tokens per layer
    session = Session(qwen_adapter, policy_for(qwen_adapter, "hermes", budget_tokens=budget),
                      SessionConfig(chunk_frames=8))
    feed(session, frames(160), "/cam")
    session.flush()
    held = held_per_layer(session.policy)
    counted = [u for u, per_layer in held.items() if 2 * max(per_layer) >= per_unit]
    status = session.status()
    assert len(held) > 3 * len(counted)  # many frames keep a token somewhere: they are not counted
    assert status.frames_in_memory == 2 * len(counted)  # two frames per Qwen2.5-VL unit
    assert status.frames_in_memory <= 2 * 2 * budget // per_unit * len(session.policy.layers)
    stamps = [s for u in counted for s in session.ledger.units[u].stamps]
    assert (status.oldest_stamp, status.newest_stamp) == (min(stamps), max(stamps))
    answer = session.ask("what is on the table?", max_new_tokens=1)
    assert answer.frames_in_memory == status.frames_in_memory and answer.kv_tokens == status.cache.kv_tokens


@pytest.mark.parametrize("name, settings", [("fifo", {"budget_tokens": 6}), ("h2svc", {"n_e": 3})])
def test_a_per_camera_answer_reports_that_cameras_frames_and_tokens(qwen_adapter, frames, name, settings):
    per_unit = qwen_adapter.preprocess(frames(2)).tokens_per_unit
    if "budget_tokens" in settings:
        settings = {"budget_tokens": settings["budget_tokens"] * per_unit}
    session = Session(qwen_adapter, policy_for(qwen_adapter, name, **settings), SessionConfig(chunk_frames=4))
    feed(session, frames(8), "/front")
    feed(session, frames(4, start=8), "/rear", first=100.0)
    whole = session.ask("what is on the table?", max_new_tokens=1)
    rear = session.ask("what is on the table?", camera="/rear", max_new_tokens=1)
    status = session.status()
    assert whole.kv_tokens == status.cache.kv_tokens
    front_units = [u for u, info in session.ledger.units.items() if info.camera == "/front"]
    front_tokens = sum(session.policy.unit_tokens().counts[:, i].sum().item()
                       for i, u in enumerate(session.policy.unit_tokens().units.tolist()) if u in front_units)
    rows_per_layer = session.policy.unit_tokens().rows_per_layer
    assert rear.kv_tokens == status.cache.kv_tokens - round(front_tokens / rows_per_layer) < whole.kv_tokens
    assert rear.frames_in_memory == 4 and (rear.oldest_stamp, rear.newest_stamp) == (100.0, 103.0)
    assert status.camera_memory["/rear"].frames == 4
    assert status.camera_memory["/front"].frames + 4 == status.frames_in_memory == whole.frames_in_memory
