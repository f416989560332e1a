"""HERMES on both tiny models: bounded memory, positions in range, answering leaves the cache alone,
the guidance queries, keys after re-indexing, the configuration file, the old parameter names."""
import pathlib

import pytest
import torch
import yaml

from streamcache_ros.engine import Session, SessionConfig, load_adapter, make_policy
from streamcache_ros.engine.adapters.base import project_qk
from streamcache_ros.engine.cache import SUMMARY_UNIT, policy_parameters
from streamcache_ros.engine.cache.hermes import HermesPolicy
from streamcache_ros.engine.cache.hermes_rules import guidance_prompts
from streamcache_ros.engine.cache.rope import apply_rotary
from streamcache_ros.engine.errors import ConfigError
from streamcache_ros.engine.factory import build_session
from streamcache_ros.engine.ingest.guidance import GuidanceProvider

from conftest import FAMILIES, make_variant

BUDGET = 40
ROOT = pathlib.Path(__file__).resolve().parents[1]


def feed(session, frames, start=0):
    """Add frames one by one; yields each chunk report."""
    for i, frame in enumerate(frames):
        report = session.add_frame(frame, stamp=(start + i) * 0.5)
        if report is not None:
            yield report


def states_equal(a, b):
    return len(a["layers"]) == len(b["layers"]) and all(
        torch.equal(la[key], lb[key]) for la, lb in zip(a["layers"], b["layers"]) for key in la)


def test_memory_stays_bounded_over_a_long_stream(adapter, frames):
    session = Session(adapter, make_policy("hermes", budget_tokens=BUDGET), SessionConfig(chunk_frames=4))
    prefix = len(adapter.prefix_ids)
    # 4 layers: int(0.4) = 0 shallow layers, int(2.8) = 2, so mid 0-1 and deep 2-3
    assert session.policy.roles == ["mid", "mid", "deep", "deep"]
    sizes = []
    for report in feed(session, frames(64)):
        stats = session.status().cache
        # §3: with the uniform budget every layer holds prefix + min(M, N) (deep: M - 1 + summary)
        assert len(set(stats.layer_tokens)) == 1 and stats.layer_tokens[0] <= prefix + BUDGET
        sizes.append(stats.kv_bytes)
    assert len(sizes) == 16
    assert max(sizes[8:]) == min(sizes[8:]) and stats.layer_tokens[0] == prefix + BUDGET
    assert report.compress_info["evicted_tokens"] > 0
    summaries = stats.extra["summary_tokens"]
    assert summaries[0] == summaries[1] == 0 and summaries[2] >= 1 and summaries[3] >= 1
    assert session.status().frames_in_memory > 0


class RecordingHermes(HermesPolicy):
    """Remembers the largest position any token was stored or rotated at."""

    largest = -1.0

    def rotary_positions(self, layer, positions, new):
        rotated = super().rotary_positions(layer, positions, new)
        self.largest = max(self.largest, float(positions.max()), float(rotated.max()))
        return rotated

    def guidance_positions(self, layer, count):
        positions = super().guidance_positions(layer, count)
        self.largest = max(self.largest, float(positions.max()))
        return positions


@pytest.mark.parametrize("family, params", [
    ("tiny-llava_onevision", {}),
    ("tiny-qwen2_5_vl", {}),
    ("tiny-qwen2_5_vl", {"qwen_reindex": "dense_rank", "qwen_rope": "layer0"}),  # the old names still work
])
def test_positions_never_leave_the_model_range(tmp_path, frames, family, params):
    limit = 200
    # Qwen at 0.25 fps: t advances 16 per temporal patch, so a 4-frame chunk takes 17 positions
    adapter = load_adapter(make_variant(tmp_path, family, max_position_embeddings=limit), device="cpu",
                           dtype="float32", sample_fps=0.25)
    # the margin leaves room for a chunk and the longest guidance prompt (102 tokens with a history)
    policy = RecordingHermes(budget_tokens=BUDGET, reindex_margin=120, **params)
    session = Session(adapter, policy, SessionConfig(chunk_frames=4, max_new_tokens=6))
    advanced = 0.0
    for i, report in enumerate(feed(session, frames(64))):
        advanced += report.tokens if family == "tiny-llava_onevision" else 17
        assert session.status().cache.max_position < limit
        if i % 5 == 4:
            session.ask("what is on the table?")
    assert advanced > limit  # without re-indexing, positions would have passed the range
    assert policy.reindex_events >= 1
    assert policy.largest < limit


def test_answering_leaves_the_cache_unchanged_and_only_steers_the_next_prompts(adapter, frames, monkeypatch):
    texts = []
    session = Session(adapter, make_policy("hermes", budget_tokens=BUDGET), SessionConfig(chunk_frames=4))
    real = session.guidance.token_ids

    def token_ids(text):  # the session's guidance provider, with the prompt texts written down
        texts.append(text)
        return real(text)

    monkeypatch.setattr(session.guidance, "token_ids", token_ids)
    list(feed(session, frames(24)))
    before = session.policy.state_dict()
    first = session.ask("where is the red ball?", max_new_tokens=6)
    assert states_equal(before, session.policy.state_dict())
    second = session.ask("where is the red ball?", max_new_tokens=6)
    assert states_equal(before, session.policy.state_dict())
    assert first.text == second.text
    assert all("Question:" not in t for t in texts)
    texts.clear()
    list(feed(session, frames(4, start=24), start=24))
    exchange = session.history[-1]
    assert texts and all(f"Question: {exchange.question} Answer:" in t for t in texts)
    assert sorted(texts) == sorted(guidance_prompts(session.history)[p] for p in ("mixed", "global"))


def test_guidance_passes_are_skipped_when_nothing_will_be_pruned(llava_adapter, frames):
    # 21 prefix + 16 per chunk: chunk 2 gives 53 > 40 tokens (the reference's trigger) but 32 candidates
    # fit every layer's slots (40, deep 39): nothing is pruned, so the selection needs no guidance (D15)
    session = Session(llava_adapter, make_policy("hermes", budget_tokens=BUDGET), SessionConfig(chunk_frames=4))
    reports = feed(session, frames(12))
    next(reports)
    second = next(reports)
    assert second.compress_info["guidance_passes"] == 0 and second.compress_info["evicted_tokens"] == 0
    stats = session.status().cache
    assert stats.layer_tokens == [21 + 32] * 4 and stats.extra["summary_tokens"] == [0] * 4
    third = next(reports)
    # mid layer 0 has ω = 1 (p = 0): no pass; layer 1 reads the mixed prompt, layers 2-3 the global one
    assert third.compress_info["guidance_passes"] == 2 and third.compress_info["evicted_tokens"] > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_with_shallow_layers(tmp_path, frames, family):
    path = make_variant(tmp_path, family, num_hidden_layers=10, layer_types=["full_attention"] * 10)
    adapter = load_adapter(path, device="cpu", dtype="float32")
    for shallow_omega, passes in ((1.0, 2), (0.5, 3)):
        policy = make_policy("hermes", budget_tokens=BUDGET, shallow_omega=shallow_omega)
        session = Session(adapter, policy, SessionConfig(chunk_frames=4))
        reports = list(feed(session, frames(16)))
        assert policy.roles == ["shallow"] + ["mid"] * 6 + ["deep"] * 3  # int(1.0) = 1, int(7.0) = 7
        # D2: with ω = 1 in the shallow layer the local prompt cannot matter and is not computed
        assert reports[-1].compress_info["guidance_passes"] == passes
        stats = session.status().cache
        assert len(set(stats.layer_tokens)) == 1
        assert [n > 0 for n in stats.extra["summary_tokens"]] == [False] * 7 + [True] * 3


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_guidance_queries_start_from_the_embeddings_at_layer_0(family, frames, request):
    adapter = request.getfixturevalue("qwen_adapter" if "qwen" in family else "llava_adapter")
    session = Session(adapter, make_policy("hermes", budget_tokens=BUDGET, guidance_queries="hidden"),
                      SessionConfig(chunk_frames=4))
    list(feed(session, frames(16)))
    before = session.policy.state_dict()
    ids = session.guidance.token_ids("a red ball on the table")
    hidden = session.guidance.hidden_qk(ids, session.policy)
    embedded = session.guidance.embedding_qk(ids)
    assert states_equal(before, session.policy.state_dict())
    assert len(hidden) == len(embedded) == 4
    # layer 0's input is the embedding itself; later layers differ (D3 is what `embedding` keeps)
    for a, b in zip(hidden[0], embedded[0]):
        torch.testing.assert_close(a, b)
    assert (hidden[1][0] - embedded[1][0]).abs().max() > 1e-3
    layer = adapter.text_model.layers[1]
    q, _ = project_qk(layer.self_attn, layer.input_layernorm(adapter.embed_text(ids)))
    torch.testing.assert_close(embedded[1][0], q)


def _layer0_raw_keys(adapter, chunk_frames):
    """Pre-RoPE layer-0 keys of each unit's tokens: layer 0 reads the embeddings only, so they can be
    recomputed outside the cache. unit -> [Hkv, tokens, D]."""
    layer = adapter.text_model.layers[0]
    keys, unit = {}, 0
    with torch.inference_mode():
        for frames in chunk_frames:
            inputs = adapter.preprocess(frames)
            embeds = adapter.encode(inputs)[None]
            _, k = project_qk(layer.self_attn, layer.input_layernorm(embeds))
            per = inputs.tokens_per_unit
            for u in range(inputs.num_units):
                keys[unit + u] = k[0, :, u * per:(u + 1) * per]
            unit += inputs.num_units
    return keys


@pytest.mark.parametrize("family, qwen_reindex", [("tiny-llava_onevision", "shift"), ("tiny-qwen2_5_vl", "shift"),
                                                  ("tiny-qwen2_5_vl", "dense_rank")])
def test_cached_keys_after_eager_reindexing_equal_keys_computed_at_the_new_positions(family, qwen_reindex,
                                                                                    frames, request):
    adapter = request.getfixturevalue("qwen_adapter" if "qwen" in family else "llava_adapter")
    policy = make_policy("hermes", budget_tokens=BUDGET, reindex="eager", qwen_reindex=qwen_reindex)
    session = Session(adapter, policy, SessionConfig(chunk_frames=4))
    video = frames(32)
    reports = list(feed(session, video))
    assert sum(r.compress_info["reindexed"] for r in reports) >= 4
    raw = _layer0_raw_keys(adapter, [video[i:i + 4] for i in range(0, 32, 4)])
    store = policy.layers[0]
    rotary = policy.geometry.rotary
    checked = 0
    for j in (store.units >= 0).nonzero().flatten().tolist():
        cos, sin = rotary.cos_sin(store.positions[:, j:j + 1], torch.float32)
        candidates = apply_rotary(raw[int(store.units[j])], cos, sin)  # the unit's tokens at j's position
        error = (candidates - store.keys[0, :, j:j + 1]).abs().amax(dim=(0, 2)).min()
        assert error < 1e-4
        checked += 1
    assert checked == BUDGET


def test_snapshot_round_trip_keeps_summaries(qwen_adapter, frames, tmp_path):
    session = Session(qwen_adapter, make_policy("hermes", budget_tokens=BUDGET), SessionConfig(chunk_frames=4))
    list(feed(session, frames(20)))
    path = str(tmp_path / "memory.pt")
    session.save(path)
    state = session.policy.state_dict()
    other = Session(qwen_adapter, make_policy("hermes", budget_tokens=BUDGET), SessionConfig(chunk_frames=4))
    other.load(path)
    assert states_equal(state, other.policy.state_dict())
    assert (other.policy.layers[3].units == SUMMARY_UNIT).sum() >= 1


def test_factory_names_a_bad_hermes_parameter():
    with pytest.raises(ConfigError, match="qwen_rope"):
        build_session({"model_path": "tiny-llava_onevision", "device": "cpu", "policy": "hermes",
                       "hermes.qwen_rope": "sideways"})


def test_config_file_lists_every_parameter_with_its_default():
    params = yaml.safe_load((ROOT / "config" / "hermes.yaml").read_text())["/**"]["ros__parameters"]
    # the model folder's own budget unless a number is set for a model it suits (docs/hermes.md "Budgets")
    assert params["policy"] == "hermes" and params["budget_tokens"] == 0
    assert params["hermes"] == policy_parameters("hermes")


@pytest.mark.parametrize("family", FAMILIES)
def test_guidance_attention_matches_a_manual_pass_with_the_models_own_rope(family, frames, request):
    """docs/hermes.md §6, computed here from the transformers modules: embeddings -> input_layernorm_l ->
    q/k projections -> the model's rotary embedding at the layer's next positions -> softmax over the
    layer's cached keys and the guidance keys -> mean over heads, candidates, mean over tokens."""
    adapter = request.getfixturevalue("qwen_adapter" if "qwen" in family else "llava_adapter")
    session = Session(adapter, make_policy("hermes", budget_tokens=BUDGET), SessionConfig(chunk_frames=4))
    list(feed(session, frames(16)))
    policy = session.policy
    prefix = len(adapter.prefix_ids)
    request = policy.guidance_for([])
    attention = policy.layer_attention(GuidanceProvider(adapter).compute(request, policy), prefix)
    text = guidance_prompts([])
    model = adapter.text_model
    with torch.inference_mode():
        for layer_index, role in enumerate(policy.roles):
            if attention[layer_index] is None:
                continue
            prompt = text["global" if role == "deep" else "mixed"]
            ids = adapter.tokenizer(prompt, add_special_tokens=False).input_ids
            store = policy.layers[layer_index]
            layer = model.layers[layer_index]
            hidden = layer.input_layernorm(model.embed_tokens(torch.tensor([ids])))
            heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
            dim = layer.self_attn.head_dim
            q = layer.self_attn.q_proj(hidden).view(1, len(ids), heads, dim).transpose(1, 2)
            k = layer.self_attn.k_proj(hidden).view(1, len(ids), kv_heads, dim).transpose(1, 2)
            start = int(store.positions.max()) + 1
            pos = torch.arange(start, start + len(ids))[None]
            cos, sin = model.rotary_emb(hidden, pos.expand(3, 1, -1) if "qwen" in family else pos)
            cos, sin = cos[:, None], sin[:, None]
            half = dim // 2
            turn = lambda x: torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # noqa: E731
            q, k = q * cos + turn(q) * sin, k * cos + turn(k) * sin
            keys = torch.cat((store.keys, k), dim=2).repeat_interleave(heads // kv_heads, dim=1)
            weights = torch.softmax(q @ keys.transpose(-1, -2) / dim ** 0.5, dim=-1)
            expected = weights[0].mean(0)[:, prefix:-len(ids)].mean(0)
            torch.testing.assert_close(attention[layer_index], expected, atol=1e-6, rtol=1e-4)
