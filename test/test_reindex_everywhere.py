"""Every policy on both model families through many re-indexes, eager and lazy (a small position
range and margin, so positions are renumbered again and again): no chunk fails, answers keep coming,
positions stay inside the range, and the bounded policies stay within their bounds. (That re-indexed
keys are exactly the keys at their new positions: test_hermes, test_session, test_h2svc_policy.)"""
import pytest

from streamcache_ros.engine import Session, SessionConfig, load_adapter
from streamcache_ros.engine.cache import PAD_UNIT
from streamcache_ros.engine.cache.sap import HEAD_MAP_FILE, HeadMap
from streamcache_ros.engine.adapters.models import BUNDLED_DIR

from conftest import FAMILIES, make_variant, policy_for

MAX_POSITIONS = 160
MARGIN = 64  # lazy: renumber once positions pass 96
CHUNK = 4
SETTINGS = {"full": {}, "fifo": {"budget_tokens": 32}, "uniform": {"budget_tokens": 32},
            "hermes": {"budget_tokens": 32}, "h2svc": {"w_s": 1, "w_w": 2, "n_e": 3}}
FRAMES = {"full": 24}  # the full cache grows: a stream it can hold in the range; the others run long


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Both families with a small position range (Qwen at 0.25 fps: t advances 16 a temporal patch)."""
    folder = tmp_path_factory.mktemp("small_range")
    return {family: load_adapter(make_variant(folder, family, max_position_embeddings=MAX_POSITIONS), device="cpu",
                                 dtype="float32", sample_fps=0.25) for family in FAMILIES}


@pytest.mark.parametrize("mode", ["eager", "lazy"])
@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize("family", FAMILIES)
def test_answers_keep_coming_through_many_reindexes(adapters, frames, family, name, mode):
    adapter = adapters[family]
    settings = dict(SETTINGS[name])
    if name == "h2svc":  # the variant is the bundled model with another position range: the same heads
        settings["head_map"] = HeadMap.load(BUNDLED_DIR / family / HEAD_MAP_FILE)
    policy = policy_for(adapter, name, reindex=mode, reindex_margin=MARGIN, **settings)
    # short questions: the full cache keeps room for the largest one (max_question_tokens + max_new_tokens)
    session = Session(adapter, policy, SessionConfig(chunk_frames=CHUNK, max_question_tokens=32, max_new_tokens=4,
                                                  mc_max_new_tokens=4))
    prefix = len(adapter.prefix_ids)
    per_unit = adapter.preprocess(frames(1)).tokens_per_unit
    answers = 0
    for i, frame in enumerate(frames(FRAMES.get(name, 96))):
        session.add_frame(frame, stamp=float(i), camera="/cam")  # a failing chunk would raise here
        stats = session.status().cache
        assert stats.max_position < MAX_POSITIONS
        if name in ("fifo", "uniform", "hermes"):
            assert max(stats.layer_tokens) <= prefix + SETTINGS[name]["budget_tokens"]
        if name == "h2svc":  # a head holds the prefix and at most its window (N_e here) of units
            longest = max(int((g.store.units != PAD_UNIT).sum(dim=1).max()) for groups in policy.groups
                          for g in groups)
            assert longest <= prefix + SETTINGS[name]["n_e"] * per_unit
        if i % 12 == 11:
            answer = session.ask("what happened?", max_new_tokens=4)
            assert answer.answer_tokens >= 1 and answer.frames_in_memory > 0
            answers += 1
    status = session.status()
    assert status.chunks_failed == 0 and answers >= 2
    # many re-indexes (the full cache, which cannot run long in this range, at least one)
    assert status.cache.reindex_events >= (1 if name == "full" else 3), status.cache.reindex_events
