"""H2SVC in the streaming session on the bundled tiny models: equivalence with the full cache,
memory held, the worked example, questions, failures, snapshots, the factory's errors."""
import json
import pathlib

import pytest
import torch
import yaml

from streamcache_ros.engine import (ChunkError, ConfigError, Session, SessionConfig, SnapshotError, failpoints,
                                    make_policy)
from streamcache_ros.engine.cache import policy_parameters
from streamcache_ros.engine.cache.sap import HEAD_MAP_FILE, HeadMap
from streamcache_ros.engine.factory import build_policy, build_session
from streamcache_ros.engine.adapters.models import BUNDLED_DIR

from conftest import FAMILIES, make_variant, policy_for
from test_h2svc_policy import states_equal

EVERYTHING = dict(w_s=10_000, w_w=10_000, n_e=10_000)


def feed(session, frames, camera=""):
    for i, frame in enumerate(frames):
        session.add_frame(frame, stamp=float(i), camera=camera)


def question_logits(adapter, policy, key_filter=None):
    ids = adapter.question_ids("what moved first?", [])
    mark = policy.mark()
    hidden = adapter.forward(adapter.embed_text(ids), adapter.text_tokens(len(ids)), policy, key_filter)
    policy.truncate(mark)
    return adapter.logits(hidden[0])


def test_banks_that_hold_everything_equal_the_full_cache(adapter, frames):
    """Every bank keeps every frame: per-bank attention, per-head positions and unit-by-unit prefill
    must give the logits of the plain full cache (itself checked against transformers)."""
    full = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=4))
    banked = Session(adapter, policy_for(adapter, "h2svc", **EVERYTHING), SessionConfig(chunk_frames=4))
    video = frames(12)
    feed(full, video[:6], camera="left")
    feed(banked, video[:6], camera="left")
    feed(full, video[6:], camera="right")
    feed(banked, video[6:], camera="right")
    full.flush(), banked.flush()
    assert banked.status().cache.kv_tokens == full.status().cache.kv_tokens
    torch.testing.assert_close(question_logits(adapter, banked.policy), question_logits(adapter, full.policy),
                               atol=1e-4, rtol=1e-4)
    right = torch.tensor([u for u, info in full.ledger.units.items() if info.camera == "right"])
    torch.testing.assert_close(question_logits(adapter, banked.policy, right),
                               question_logits(adapter, full.policy, right), atol=1e-4, rtol=1e-4)


def expected_bytes(adapter, policy, units_seen, tokens_per_unit):
    g = adapter.geometry()
    windows = {0: policy.windows[0], 1: policy.windows[1], 2: policy.n_e}
    prefix = len(adapter.prefix_ids)
    lengths = [prefix + min(units_seen, windows[int(b)]) * tokens_per_unit for b in policy.bank_id.flatten()]
    return sum(lengths) * g.head_dim * 2 * torch.tensor([], dtype=g.dtype).element_size()


def test_memory_held_matches_the_bank_lengths(adapter, frames):
    session = Session(adapter, policy_for(adapter, "h2svc", w_s=1, w_w=2, n_e=3), SessionConfig(chunk_frames=2))
    full = Session(adapter, make_policy("full"), SessionConfig(chunk_frames=2))
    units = 0
    for i, frame in enumerate(frames(16)):
        full.add_frame(frame, float(i))
        report = session.add_frame(frame, float(i))
        if report is None:
            continue
        units += report.units
        per_unit = report.tokens // report.units
        stats = session.status().cache
        assert stats.kv_bytes == expected_bytes(adapter, session.policy, units, per_unit)
        assert len(stats.bank_tokens) == 3 and sum(stats.bank_tokens) == stats.kv_bytes // (
            2 * adapter.geometry().head_dim * 4)
    # and it really is smaller than the full cache once the windows are full
    assert session.status().cache.kv_bytes < full.status().cache.kv_bytes / 2


def test_the_worked_example_on_a_model(llava_adapter, frames):
    """TC1/TC2 with the defaults of docs/h2svc.md: frames 1..65 are units 0..64 of the session."""
    session = Session(llava_adapter, policy_for(llava_adapter, "h2svc"), SessionConfig(chunk_frames=8))
    feed(session, frames(65))
    session.flush()
    policy = session.policy
    for groups in policy.groups:
        for group in groups:
            for row in range(group.store.rows):
                held = sorted({u for u in group.store.units[row].tolist() if u >= 0})
                if group.bank == 0:
                    assert held == list(range(61, 65))  # frames 62..65
                elif group.bank == 1:
                    assert held == list(range(49, 65))  # frames 50..65
                else:
                    assert len(held) == 64 and held[0] == 0 and held[-1] == 64
    assert policy.trajectory.evictions == 1  # one per episodic head (they are one vectorised bank)
    assert session.status().frames_in_memory == 65 - len(set(range(65)) - set(session.ledger.units))


def test_unit_by_unit_prefill_runs_one_forward_per_unit(adapter, frames):
    calls = []
    for unit_by_unit in (True, False):
        policy = policy_for(adapter, "h2svc", unit_by_unit=unit_by_unit)
        session = Session(adapter, policy, SessionConfig(chunk_frames=4))
        layer0 = []
        report = None
        with failpoints.armed(prefill=lambda layer, **_: layer0.append(layer) if layer == 0 else None):
            for i, frame in enumerate(frames(4)):
                report = session.add_frame(frame, float(i)) or report
        calls.append((len(layer0), report.units))
    assert calls[0][0] == calls[0][1] and calls[1][0] == 1


def test_questions_leave_the_cache_as_it_was_and_failures_undo_the_chunk(adapter, frames):
    session = Session(adapter, policy_for(adapter, "h2svc", w_s=1, w_w=2, n_e=3), SessionConfig(chunk_frames=4))
    feed(session, frames(16))
    before = session.policy.state_dict()
    first = session.ask("where is the red ball?", max_new_tokens=5)
    assert states_equal(session.policy.state_dict(), before)
    assert session.ask("where is the red ball?", max_new_tokens=5).text == first.text

    # a fault in the chunk's last unit's forward: its earlier units already evicted; all undone
    layers = adapter.geometry().num_layers
    earlier_units = 4 // adapter.frames_per_unit - 1
    forwards = []

    def fault(layer, **_):
        forwards.append(layer)
        if len(forwards) > earlier_units * layers and layer == 2:
            raise RuntimeError("injected")

    units_before = dict(session.ledger.units)
    with failpoints.armed(prefill=fault), pytest.raises(ChunkError, match="injected"):
        feed(session, frames(4, start=16))
    assert len(forwards) == earlier_units * layers + 3
    assert states_equal(session.policy.state_dict(), before) and session.ledger.units == units_before
    feed(session, frames(4, start=40))
    assert session.status().chunks_encoded == 5


def test_snapshot_round_trip_and_refusal(adapter, frames, tmp_path):
    session = Session(adapter, policy_for(adapter, "h2svc", w_s=2, w_w=3, n_e=4), SessionConfig(chunk_frames=4))
    feed(session, frames(20))
    path = str(tmp_path / "memory.pt")
    session.save(path)
    other = Session(adapter, policy_for(adapter, "h2svc", w_s=2, w_w=3, n_e=4), SessionConfig(chunk_frames=4))
    other.load(path)
    assert states_equal(other.policy.state_dict(), session.policy.state_dict())
    assert other.ask("what?", max_new_tokens=4).text == session.ask("what?", max_new_tokens=4).text
    different = Session(adapter, policy_for(adapter, "h2svc", w_s=3, w_w=3, n_e=4), SessionConfig(chunk_frames=4))
    with pytest.raises(SnapshotError, match="policy_config"):
        different.load(path)


def test_per_head_reindex_on_a_1d_rope_model(tmp_path, frames):
    path = make_variant(tmp_path, "tiny-llava_onevision", max_position_embeddings=160)
    base = json.loads((BUNDLED_DIR / "tiny-llava_onevision" / HEAD_MAP_FILE).read_text())
    base["model_id"] = path.rsplit("/", 1)[-1]
    (tmp_path / "map.json").write_text(json.dumps(base))
    session = build_session({"model_path": path, "policy": "h2svc", "h2svc.head_map_path": str(tmp_path / "map.json"),
                             "h2svc.w_s": 2, "h2svc.w_w": 4, "h2svc.n_e": 6, "reindex_margin": 60,
                             "device": "cpu", "dtype": "float32", "chunk_frames": 4})
    feed(session, frames(60))
    stats = session.status().cache
    assert stats.reindex_events > 0 and stats.max_position <= 160 - 60
    answer = session.ask("what is there?", max_new_tokens=4)
    assert answer.answer_tokens >= 1 and session.status().cache.max_position == stats.max_position


# -- head maps and the factory ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", FAMILIES)
def test_bundled_head_maps_fit_their_models(name, request):
    adapter = request.getfixturevalue("qwen_adapter" if "qwen" in name else "llava_adapter")
    head_map = HeadMap.load(BUNDLED_DIR / name / HEAD_MAP_FILE)
    g = adapter.geometry()
    assert (head_map.model_id, head_map.config_hash) == (adapter.model_id, adapter.config_hash)
    assert (head_map.num_layers, head_map.num_kv_heads) == (g.num_layers, g.num_kv_heads)
    assert head_map.split == [1, 3, 4] and head_map.profile["videos"] == 16
    # the bundled map is what the factory finds by default, in the model's folder
    policy = build_policy(adapter, "h2svc", {})
    policy.setup(g)
    assert policy.bank_id.tolist() == head_map.bank_id


def test_factory_without_a_head_map_names_the_command_and_the_parameter(tmp_path):
    path = make_variant(tmp_path, "tiny-qwen2_5_vl", rms_norm_eps=1e-5)
    (pathlib.Path(path) / HEAD_MAP_FILE).unlink()  # a model folder without a head map of its own
    with pytest.raises(ConfigError) as err:
        build_session({"model_path": path, "policy": "h2svc", "device": "cpu"})
    assert err.value.parameter == "h2svc.head_map_path"
    assert "streamcache-profile --model tiny-qwen2_5_vl-variant" in str(err.value)


def test_factory_with_the_head_map_of_another_model_names_both():
    other = str(BUNDLED_DIR / "tiny-llava_onevision" / HEAD_MAP_FILE)
    with pytest.raises(ConfigError, match="profiled on model 'tiny-llava_onevision'.*runs 'tiny-qwen2_5_vl'"):
        build_session({"model_path": "tiny-qwen2_5_vl", "policy": "h2svc", "h2svc.head_map_path": other,
                       "device": "cpu"})


def test_factory_passes_h2svc_parameters_and_refuses_bad_ones():
    session = build_session({"policy": "h2svc", "h2svc.w_s": 2, "h2svc.ratios": [0.25, 0.25, 0.5], "device": "cpu"})
    assert session.policy.windows == (2, 16) and session.status().cache.extra["split"] == [2, 2, 4]
    with pytest.raises(ConfigError, match="parameter 'h2svc': n_e must be >= 2"):
        build_session({"policy": "h2svc", "h2svc.n_e": 1, "device": "cpu"})


def test_config_file_holds_the_documented_defaults():
    params = yaml.safe_load((pathlib.Path(__file__).resolve().parents[1] / "config" / "h2svc.yaml").read_text())
    params = params["/**"]["ros__parameters"]
    assert params["policy"] == "h2svc"
    defaults = {k: v for k, v in policy_parameters("h2svc").items() if k not in ("reindex", "reindex_margin")}
    assert params["h2svc"] == defaults
    assert (defaults["w_s"], defaults["w_w"], defaults["n_e"], defaults["ratios"]) == (4, 16, 64, [])
    flat = {"policy": "h2svc", **{f"h2svc.{k}": v for k, v in params["h2svc"].items()}, "device": "cpu"}
    assert build_session(flat).policy.config_dict()["w_w"] == 16
