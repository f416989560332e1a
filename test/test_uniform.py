"""The ``uniform`` policy (the H2SVC paper's ablation baseline): units kept evenly spread over the
stream so far, whole units within the token budget, the prefix on top; through the session on both
model families, and through the factory as the node builds it."""
import pytest

from streamcache_ros.engine import Session, SessionConfig, make_policy
from streamcache_ros.engine.cache.uniform import spread
from streamcache_ros.engine.errors import ConfigError
from streamcache_ros.engine.factory import build_session


def test_spread_by_hand():
    assert spread(list(range(10)), 4) == [0, 3, 6, 9]
    # points 0, 4.5, 9: 4.5 is nearer 3 than 7
    assert spread([0, 2, 3, 7, 8, 9], 3) == [0, 3, 9]
    assert spread([0, 1, 2, 3], 2) == [0, 3] and spread([0, 1, 2, 3], 1) == [3]
    assert spread([5, 6], 5) == [5, 6] and spread([5, 6], 0) == []
    # every point gets a unit of its own, even where units crowd: point 33.3 takes the nearest it may
    # (2, leaving 3 for point 66.7)
    assert spread([0, 1, 2, 3, 100], 4) == [0, 2, 3, 100]


def test_memory_stays_within_the_budget_and_spread_over_the_stream(adapter, frames):
    budget = 40
    session = Session(adapter, make_policy("uniform", budget_tokens=budget), SessionConfig(chunk_frames=4))
    prefix = len(adapter.prefix_ids)
    per_unit = adapter.preprocess(frames(1)).tokens_per_unit
    sizes = []
    for i, frame in enumerate(frames(96)):
        report = session.add_frame(frame, stamp=float(i))
        if report is None:
            continue
        stats = session.status().cache
        assert len(set(stats.layer_tokens)) == 1 and stats.layer_tokens[0] <= prefix + budget
        sizes.append(stats.kv_bytes)
        assert set(report.outcome.evicted_units).isdisjoint(stats.units)  # the outcome lists what left
    assert max(sizes[len(sizes) // 2:]) == min(sizes[len(sizes) // 2:])  # flat once full
    units = session.status().cache.units
    newest = max(session.ledger.units)
    assert len(units) == budget // per_unit
    assert units[0] == 0 and units[-1] == newest  # the first and the newest unit stay
    # evenly spread: no gap much wider than the even one (a FIFO window would leave one gap of ~newest)
    even = newest / (len(units) - 1)
    assert max(b - a for a, b in zip(units, units[1:])) <= 2 * even
    assert session.ask("what happened?", max_new_tokens=3).answer_tokens >= 1


def test_the_factory_builds_it_with_the_node_s_parameters():
    session = build_session({"policy": "uniform", "budget_tokens": 64, "uniform.reindex": "eager",
                             "model_path": "tiny-llava_onevision", "device": "cpu", "dtype": "float32"})
    assert session.policy.name == "uniform" and session.policy.budget_tokens == 64
    assert session.policy.settings.reindex == "eager"
    with pytest.raises(ConfigError, match="parameter 'budget_tokens': 1 cannot hold one frame"):
        build_session({"policy": "uniform", "budget_tokens": 1, "model_path": "tiny-llava_onevision",
                       "device": "cpu"})


def test_config_file_lists_every_parameter_with_its_default():
    import pathlib

    import yaml

    from streamcache_ros.engine.cache import policy_parameters

    root = pathlib.Path(__file__).resolve().parents[1]
    params = yaml.safe_load((root / "config" / "uniform.yaml").read_text())["/**"]["ros__parameters"]
    assert params["policy"] == "uniform" and params["budget_tokens"] == 0
    assert params["uniform"] == policy_parameters("uniform")
