"""The h2svc policy on hand-made geometries (no model): windows, STCE through the cache, memory
held, attention per bank, ragged stores, undo, snapshots, per-head re-index, head maps (the
factory's errors naming the parameter, the policy's shape check)."""
import math
from types import SimpleNamespace

import pytest
import torch

from streamcache_ros.engine.cache import (PAD_UNIT, PREFIX_UNIT, TEXT_UNIT, CacheGeometry, ChunkContext, FamilyTraits,
                                          NewTokens, make_policy)
from streamcache_ros.engine.cache.attention import bottom_right_causal_mask
from streamcache_ros.engine.cache.rope import RotarySpec, rotate_by_delta
from streamcache_ros.engine.cache.sap import HeadMap
from streamcache_ros.engine.errors import ConfigError
from streamcache_ros.engine.factory import resolve_head_map

from test_h2svc_stce import tc3_vectors
from conftest import states_equal

D = 8


def write_map(path, kinds, model_id="synthetic"):
    """A head map whose scores put the heads of ``kinds`` [L][H] into those banks."""
    scores = [[kind + 0.01 * (layer * len(row) + h) for h, kind in enumerate(row)] for layer, row in enumerate(kinds)]
    HeadMap(model_id=model_id, config_hash="c0ffee", num_layers=len(kinds), num_kv_heads=len(kinds[0]),
            tad_v2v=scores, tad_t2v=scores, score=scores, bank_id=kinds).save(path)
    total = sum(len(row) for row in kinds)
    return [sum(k == b for row in kinds for k in row) / total for b in range(3)]


def make(tmp_path, kinds, group=2, rope=True, max_pos=100_000, dtype=torch.float32, model_id="synthetic", **params):
    ratios = write_map(tmp_path / "map.json", kinds)
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, D, 2).float() / D)) if rope else torch.zeros(D // 2)
    geometry = CacheGeometry(num_layers=len(kinds), num_q_heads=len(kinds[0]) * group, num_kv_heads=len(kinds[0]),
                             head_dim=D, dtype=dtype, device=torch.device("cpu"), rotary=RotarySpec(inv_freq),
                             max_position_embeddings=max_pos)
    params.setdefault("ratios", ratios)
    policy = make_policy("h2svc", head_map=HeadMap.load(tmp_path / "map.json"), **params)
    policy.setup(geometry)
    return policy


class Stream:
    """Feeds a policy as the adapter and the session would: per layer attend, then the arrival hooks."""

    def __init__(self, policy, prefix=2, seed=0):
        self.policy, self.g = policy, policy.geometry
        self.gen = torch.Generator().manual_seed(seed)
        self.raw_keys = {}  # (layer, unit, token) -> pre-RoPE key [Hkv, D]
        self.forward(torch.full((prefix,), PREFIX_UNIT))

    def rand(self, *shape):
        return torch.randn(*shape, generator=self.gen).to(self.g.dtype)

    def forward(self, units, values=None, keys=None, key_filter=None, rel=None):
        g, q_len = self.g, units.numel()
        rel = torch.arange(q_len, dtype=torch.float32)[None].expand(g.rotary.axes, -1) if rel is None else rel
        new = NewTokens(rel.clone(), units, torch.zeros_like(units))
        outs, self.last_q = [], []
        for layer in range(g.num_layers):
            q = self.rand(1, g.num_q_heads, q_len, D)
            k = self.rand(1, g.num_kv_heads, q_len, D) if keys is None else keys.to(g.dtype)
            v = self.rand(1, g.num_kv_heads, q_len, D) if values is None else values.to(g.dtype)
            index = {}
            for i, u in enumerate(units.tolist()):
                index[u] = index.get(u, -1) + 1
                self.raw_keys[(layer, u, index[u])] = k[0, :, i].clone()
            self.last_q.append(q)
            outs.append(self.policy.attend(layer, q, k, v, new, key_filter))
        return new, outs

    def frame(self, unit, n_f=2, values=None, keys=None, finish=True):
        new, outs = self.forward(torch.full((n_f,), unit), values, keys)
        self.policy.after_prefill(new)
        if finish:
            self.policy.after_chunk(ChunkContext(unit))
        return outs


def held(policy, layer, kind, row=0):
    return sorted({u for u in bank_of(policy, layer, kind).units[row].tolist() if u >= 0})


def bank_of(policy, layer, kind):
    """The store of the layer's heads in bank ``kind``."""
    return next(g.store for g in policy.groups[layer] if g.bank == kind)


# -- the worked example (TC1, TC2) -----------------------------------------------------------------------
def test_tc1_tc2_windows_and_capacity_after_frame_65(tmp_path):
    policy = make(tmp_path, [[0, 1, 2]])  # one head of each bank; defaults W_s 4, W_w 16, N_e 64
    stream = Stream(policy, prefix=2)
    for t in range(1, 65):
        stream.frame(t, n_f=2)
    assert held(policy, 0, 2) == list(range(1, 65)) and policy.trajectory.evictions == 0
    stream.frame(65, n_f=2)
    assert held(policy, 0, 0) == [62, 63, 64, 65] and len(bank_of(policy, 0, 0)) == 2 + 4 * 2
    assert held(policy, 0, 1) == list(range(50, 66)) and len(bank_of(policy, 0, 1)) == 2 + 16 * 2
    episodic = held(policy, 0, 2)
    assert len(episodic) == 64 and 1 in episodic and 65 in episodic and len(bank_of(policy, 0, 2)) == 2 + 64 * 2
    assert policy.trajectory.evictions == 1
    stats = policy.stats()
    assert stats.bank_tokens == [2 + 4 * 2, 2 + 16 * 2, 2 + 64 * 2]
    assert set(stats.units) == set(episodic) | set(range(50, 66))  # held by any bank


def reference_attention(q, keys, values, n_new):
    """Plain attention of q [G, Q, D] over keys [T, D] whose last ``n_new`` are the queries' own."""
    mask = bottom_right_causal_mask(q.shape[1], keys.shape[0])
    logits = (q.double() @ keys.double().T / math.sqrt(D)).masked_fill(~mask, float("-inf"))
    return torch.softmax(logits, -1) @ values.double()


def test_tc1_while_frame_65_is_encoded_each_head_sees_its_window_and_the_frame_so_far(tmp_path):
    policy = make(tmp_path, [[0, 1, 2]], group=2, rope=False)  # identity RoPE: the reference needs raw q
    stream = Stream(policy, prefix=2)
    for t in range(1, 65):
        stream.frame(t, n_f=3)
    new, (out,) = stream.forward(torch.full((3,), 65))
    q = stream.last_q[0]
    for kind, visible in ((0, {62, 63, 64}), (1, set(range(50, 65))), (2, set(range(1, 65)))):
        bank = bank_of(policy, 0, kind)
        units = bank.units[0]
        cols = [j for j, u in enumerate(units.tolist()) if u == PREFIX_UNIT or u in visible or u == 65]
        expected = reference_attention(q[0, 2 * kind:2 * kind + 2], bank.keys[0, 0, cols], bank.values[0, 0, cols], 3)
        torch.testing.assert_close(out[0, 2 * kind:2 * kind + 2].double(), expected, atol=1e-5, rtol=0)
    # the instantaneous bank still stores frame 61 (removed when the chunk ends), but did not see it
    assert 61 in bank_of(policy, 0, 0).units[0].tolist()
    policy.after_prefill(new)
    policy.after_chunk(ChunkContext(65))
    assert held(policy, 0, 0) == [62, 63, 64, 65]


# -- STCE through the cache (TC3, TC4, TC7) -----------------------------------------------------------
def test_tc3_tc4_the_cache_evicts_frame_28_from_values_not_keys(tmp_path):
    policy = make(tmp_path, [[2]], group=1)
    stream = Stream(policy, prefix=1)
    vectors = tc3_vectors()
    noise = torch.Generator().manual_seed(5)
    for t in range(1, 66):
        value = vectors[t].float().view(1, 1, 1, D)
        key = value + torch.randn(1, 1, 1, D, generator=noise)  # TC4: keys are rotated and noisy
        stream.frame(t, n_f=1, values=value, keys=key)
    assert held(policy, 0, 2) == list(range(1, 28)) + list(range(29, 66))
    assert policy.stats().extra["score_evaluations_last_arrival"] == 3
    assert policy.stats().extra["stce_evictions"] == 1


def test_frame_vector_is_the_mean_value_of_the_frame(tmp_path):
    policy = make(tmp_path, [[2, 2]], group=1)
    stream = Stream(policy, prefix=1)
    values = torch.randn(1, 2, 3, D)
    stream.frame(1, n_f=3, values=values)
    torch.testing.assert_close(policy.trajectory.vec[:, 0], values[0].mean(dim=1))


def test_flatten_frame_vector_sees_motion_that_the_mean_washes_out(tmp_path):
    """Two tokens swap places every frame (an object crossing a background): the mean Value never
    moves, so with 'mean' every interior frame scores 0; token-aligned 'flatten' sees the zig-zag."""
    a, b = torch.zeros(D), torch.ones(D)
    scores = {}
    for vector in ("mean", "flatten"):
        policy = make(tmp_path, [[2]], group=1, n_e=4, frame_vector=vector)
        stream = Stream(policy, prefix=1)
        for t in range(1, 5):
            pair = (a, b) if t % 2 else (b, a)
            stream.frame(t, n_f=2, values=torch.stack(pair)[None, None])
        scores[vector] = [policy.trajectory.score_of(0, t) for t in (2, 3)]
        assert policy.trajectory.vec.shape[-1] == (D if vector == "mean" else 2 * D)
    assert scores["mean"] == [0.0, 0.0] and min(scores["flatten"]) > 1.0


def test_flatten_needs_the_same_tokens_per_frame(tmp_path):
    policy = make(tmp_path, [[2]], group=1, frame_vector="flatten")
    stream = Stream(policy, prefix=1)
    stream.frame(1, n_f=2)
    with pytest.raises(ValueError, match="'flatten' needs the same tokens per frame"):
        stream.frame(2, n_f=3)


def test_layer_granularity_gives_every_head_of_a_layer_one_bank(tmp_path):
    kinds = [[0, 2], [2, 1], [1, 1], [2, 0], [2, 2], [1, 1], [2, 0], [1, 2], [1, 2], [0, 2]]
    policy = make(tmp_path, kinds, granularity="layer", ratios=[0.1, 0.4, 0.5])
    banks = policy.bank_id
    assert (banks[:, 0] == banks[:, 1]).all()
    assert [int((banks[:, 0] == b).sum()) for b in range(3)] == [1, 4, 5]  # 10 layers: 10/40/50
    assert all(len(layer) == 1 for layer in policy.groups)


# -- memory held ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, size", [(torch.float32, 4), (torch.float16, 2)])
def test_memory_held_is_the_sum_over_heads_of_bank_length(tmp_path, dtype, size):
    kinds = [[0, 1, 2], [2, 2, 1]]
    windows = {0: 2, 1: 3, 2: 4}  # w_s, w_w, n_e
    policy = make(tmp_path, kinds, dtype=dtype, w_s=2, w_w=3, n_e=4)
    prefix, n_f = 2, 3
    stream = Stream(policy, prefix=prefix)
    for t in range(1, 11):
        stream.frame(t, n_f=n_f)
        lengths = [prefix + min(t, windows[k]) * n_f for row in kinds for k in row]
        stats = policy.stats()
        assert stats.kv_bytes == sum(lengths) * D * 2 * size
        assert stats.bank_tokens == [sum(n for n, k in zip(lengths, sum(kinds, [])) if k == b) for b in range(3)]
        assert stats.layer_tokens == [round(sum(lengths[:3]) / 3), round(sum(lengths[3:]) / 3)]
        assert stats.kv_tokens == round(sum(lengths) / 3)


# -- ragged banks ----------------------------------------------------------------------------------------
def test_episodic_heads_with_frames_of_different_sizes_pad_and_mask(tmp_path):
    policy = make(tmp_path, [[2, 2]], group=2, n_e=3, rope=False)
    stream = Stream(policy, prefix=1, seed=3)
    padded_seen = False
    for t in range(1, 12):
        values = torch.randn(1, 2, 2 + t % 2, D, generator=stream.gen)  # odd frames 3 tokens, even 2
        stream.frame(t, n_f=2 + t % 2, values=values)
        bank = bank_of(policy, 0, 2)
        padded_seen |= bank.padded
        for row in range(2):
            frames = policy.trajectory.frames(row)
            tokens = bank.units[row]
            assert sorted({u for u in tokens.tolist() if u >= 0}) == frames
            assert int((tokens != PAD_UNIT).sum()) == 1 + sum(2 + f % 2 for f in frames)
        assert policy.stats().kv_bytes == 2 * len(bank) * D * 2 * 4
    assert padded_seen, "the two heads never held frames of different sizes: the test proves nothing"
    # a question token attends to each head's own tokens only, padding excluded
    _, (out,) = stream.forward(torch.full((1,), TEXT_UNIT))
    q, bank = stream.last_q[0], bank_of(policy, 0, 2)
    for row in range(2):
        cols = torch.nonzero(bank.units[row] != PAD_UNIT).flatten()
        expected = reference_attention(q[0, 2 * row:2 * row + 2], bank.keys[0, row, cols], bank.values[0, row, cols], 1)
        torch.testing.assert_close(out[0, 2 * row:2 * row + 2].double(), expected, atol=1e-5, rtol=0)


# -- questions through a camera filter -------------------------------------------------------------------
def test_key_filter_hides_other_units_in_every_bank(tmp_path):
    policy = make(tmp_path, [[0, 2]], group=2, w_s=3, rope=False)
    stream = Stream(policy, prefix=2)
    for t in range(1, 6):
        stream.frame(t, n_f=2)
    allowed = torch.tensor([1, 3, 5])
    _, (out,) = stream.forward(torch.full((2,), TEXT_UNIT), key_filter=allowed)
    q = stream.last_q[0]
    for kind, row_heads in ((0, slice(0, 2)), (2, slice(2, 4))):
        bank = bank_of(policy, 0, kind)
        units = bank.units[0].tolist()
        cols = [j for j, u in enumerate(units) if u < 0 or u in (1, 3, 5)]
        expected = reference_attention(q[0, row_heads], bank.keys[0, 0, cols], bank.values[0, 0, cols], 2)
        torch.testing.assert_close(out[0, row_heads].double(), expected, atol=1e-5, rtol=0)
    assert held(policy, 0, 0) == [3, 4, 5]  # the FIFO head saw only frames 3 and 5 of the allowed ones


# -- undo and snapshots ---------------------------------------------------------------------------------
def test_truncate_undoes_a_half_prefilled_chunk_with_evictions(tmp_path):
    policy = make(tmp_path, [[0, 1, 2], [2, 1, 0]], w_s=2, w_w=3, n_e=3)
    stream = Stream(policy)
    for t in range(1, 7):
        stream.frame(t)
    before = policy.state_dict()
    mark = policy.mark()
    for t in (7, 8, 9):  # three units of a chunk prefilled, each evicting; then the chunk fails
        stream.frame(t, finish=False)
    assert policy.trajectory.evictions > before["trajectory"]["evictions"]
    policy.truncate(mark)
    assert states_equal(policy.state_dict(), before)
    stream.frame(7)  # and the stream goes on
    assert held(policy, 0, 0) == [6, 7]


def test_snapshot_round_trip_continues_identically(tmp_path):
    a = make(tmp_path, [[0, 2, 2]], n_e=3, w_s=2)
    stream_a = Stream(a, seed=4)
    for t in range(1, 8):
        stream_a.frame(t)
    b = make(tmp_path, [[0, 2, 2]], n_e=3, w_s=2)
    b.load_state_dict(a.state_dict())
    assert states_equal(a.state_dict(), b.state_dict())
    values = torch.randn(1, 3, 2, D)
    new = NewTokens(torch.arange(2.0)[None], torch.full((2,), 8), torch.zeros(2, dtype=torch.long))
    q, k = torch.randn(1, 6, 2, D), torch.randn(1, 3, 2, D)
    out_a, out_b = a.attend(0, q, k, values, new), b.attend(0, q, k, values, new)
    torch.testing.assert_close(out_a, out_b, atol=0, rtol=0)
    for p in (a, b):
        p.after_prefill(new)
        p.after_chunk(ChunkContext(8))
    assert states_equal(a.state_dict(), b.state_dict())


def test_snapshot_of_another_split_is_refused(tmp_path):
    a = make(tmp_path, [[0, 2]])
    b = make(tmp_path, [[2, 0]])
    with pytest.raises(ValueError, match="other banks"):
        b.load_state_dict(a.state_dict())


# -- positions ---------------------------------------------------------------------------------------------
def assert_keys_unrotate_to_raw(policy, stream):
    """Every cached key turned back by its stored position is the raw key that came in."""
    rotary = policy.geometry.rotary
    for layer, groups in enumerate(policy.groups):
        for bank in (group.store for group in groups):
            for row, head in enumerate(bank.heads.tolist()):
                seen = {}
                for col, unit in enumerate(bank.units[row].tolist()):
                    if unit == PAD_UNIT:
                        continue
                    index = seen[unit] = seen.get(unit, -1) + 1
                    back = rotate_by_delta(bank.keys[0, row, col][None], rotary, -bank.positions[row][:, col:col + 1])
                    torch.testing.assert_close(back[0], stream.raw_keys[(layer, unit, index)][head], atol=1e-4, rtol=0)


def test_lazy_reindex_per_head_renumbers_and_turns_the_keys(tmp_path):
    # threshold 60 - 10 = 50: the FIFO head (4 frames) and the episodic head (6) both overflow
    policy = make(tmp_path, [[0, 2]], max_pos=60, reindex_margin=10, n_e=6)
    stream = Stream(policy, prefix=2)
    apart = False
    for t in range(1, 40):
        stream.frame(t, n_f=2)
        assert policy.max_position() <= 50
        offsets = [float(g.store.next_offsets()[0]) for g in policy.groups[0]]
        apart |= offsets[0] != offsets[1]  # heads continue from their own next position
    assert apart and policy.reindex_events > 0 and policy.stats().extra["reindexed_heads"] >= 2
    assert_keys_unrotate_to_raw(policy, stream)
    stream.forward(torch.full((3,), TEXT_UNIT))
    assert_keys_unrotate_to_raw(policy, stream)
    # 1D re-index (§5): P + rank·n_f + offset, i.e. every kept token numbered 0..n-1 in stream order
    policy._reindex(lambda offsets: torch.ones_like(offsets, dtype=torch.bool))
    for bank in (g.store for g in policy.groups[0]):
        assert bank.positions[0, 0].tolist() == [float(i) for i in range(len(bank))]
    assert_keys_unrotate_to_raw(policy, stream)


def test_eager_reindex_with_mrope_keeps_each_frame_grid(tmp_path):
    ratios = write_map(tmp_path / "map.json", [[0, 2]])
    geometry = CacheGeometry(num_layers=1, num_q_heads=2, num_kv_heads=2, head_dim=D, dtype=torch.float32,
                             device=torch.device("cpu"), rotary=RotarySpec(torch.ones(D // 2), mrope_section=(2, 1, 1)),
                             max_position_embeddings=10_000, traits=FamilyTraits(rope_layout="mrope"))
    policy = make_policy("h2svc", head_map=HeadMap.load(tmp_path / "map.json"), ratios=ratios, reindex="eager",
                         w_s=2, n_e=3)
    policy.setup(geometry)
    stream = Stream(policy, prefix=2)
    grid = torch.tensor([[0.0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1]])  # a 2x2 frame: t, h, w
    for t in range(1, 8):
        new, _ = stream.forward(torch.full((4,), t), rel=grid)
        policy.after_prefill(new)
        policy.after_chunk(ChunkContext(t))
    assert_keys_unrotate_to_raw(policy, stream)
    bank = bank_of(policy, 0, 0)
    # prefix 0, 1; each kept frame laid at max + 1 of what precedes it, with its 2x2 grid intact
    assert bank.positions[0][:, :2].tolist() == [[0.0, 1.0]] * 3
    assert bank.positions[0][:, 2:6].tolist() == (grid + 2).tolist()
    assert bank.positions[0][:, 6:10].tolist() == (grid + 4).tolist()


# -- configuration --------------------------------------------------------------------------------------
def fake_adapter(model_id, config_hash, layers=1, kv_heads=2, model_dir=""):
    """What the factory reads of an adapter to find and check a head map."""
    geometry = CacheGeometry(layers, 2 * kv_heads, kv_heads, D, torch.float32, torch.device("cpu"),
                             RotarySpec(torch.ones(D // 2)), 100)
    return SimpleNamespace(model_id=model_id, config_hash=config_hash, model_dir=model_dir, geometry=lambda: geometry)


def test_missing_head_map_names_the_command_and_the_parameter(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve_head_map("", fake_adapter("my-own-model", "x", model_dir=str(tmp_path)))
    message = str(err.value)
    assert message.startswith("parameter 'h2svc.head_map_path': ")
    assert "streamcache-profile --model my-own-model" in message and "'my-own-model'" in message


def test_a_model_folder_s_own_head_map_is_found(tmp_path):
    write_map(tmp_path / "h2svc_head_map.json", [[0, 2]], model_id="my-own-model")
    head_map, path = resolve_head_map("", fake_adapter("my-own-model", "x", model_dir=str(tmp_path)))
    assert path == str(tmp_path / "h2svc_head_map.json") and head_map.bank_id == [[0, 2]]


def test_head_map_of_another_model_names_both(tmp_path):
    write_map(tmp_path / "map.json", [[0, 2]], model_id="model-a")
    with pytest.raises(ConfigError, match="profiled on model 'model-a'.*this node runs 'model-b'"):
        resolve_head_map(str(tmp_path / "map.json"), fake_adapter("model-b", "other"))


def test_the_policy_takes_a_head_map_of_its_model_s_shape_only(tmp_path):
    geometry = fake_adapter("m", "x").geometry()
    with pytest.raises(ValueError, match="needs a head map"):
        make_policy("h2svc").setup(geometry)
    write_map(tmp_path / "map.json", [[0, 2, 1]])
    with pytest.raises(ValueError, match="1 layers x 3 KV heads; this model has 1 x 2"):
        make_policy("h2svc", head_map=HeadMap.load(tmp_path / "map.json")).setup(geometry)


@pytest.mark.parametrize("params, message", [
    ({"n_e": 1}, "n_e must be >= 2"),
    ({"w_s": 0}, "w_s and w_w must be >= 1"),
    ({"ratios": [0.5, 0.5, 0.5]}, "sum to 1"),
    ({"granularity": "model"}, "granularity must be"),
    ({"frame_vector": "max"}, "frame_vector must be"),
])
def test_bad_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=message):
        make_policy("h2svc", **params)


def test_chunked_approximation_gives_the_same_banks_as_unit_by_unit(tmp_path):
    """With the frame vectors fixed, prefilling 3 units at once (§3.2's approximation) ends with
    the same frames in every bank: drops and evictions are taken unit by unit after the chunk."""
    vectors = tc3_vectors()
    ends = []
    for unit_by_unit in (True, False):
        policy = make(tmp_path, [[0, 1, 2]], group=1, w_s=2, w_w=5, n_e=6)
        stream = Stream(policy, prefix=1)
        for start in range(1, 31, 3):
            units = torch.arange(start, start + 3)
            values = torch.stack([vectors[int(u)].float() for u in units])[None, None].expand(1, 3, -1, -1)
            steps = [slice(i, i + 1) for i in range(3)] if unit_by_unit else [slice(0, 3)]
            for part in steps:  # as the session does with prefill_unit_by_unit on or off
                new, _ = stream.forward(units[part], values=values[:, :, part])
                policy.after_prefill(new)
            policy.after_chunk(ChunkContext(start))
        ends.append([held(policy, 0, kind) for kind in range(3)])
    assert ends[0] == ends[1] and ends[0][0] == [29, 30] and len(ends[0][2]) == 6


def test_evicted_age_mean_is_the_mean_over_evictions_not_times_the_heads(tmp_path):
    policy = make(tmp_path, [[2, 2], [2, 0]], n_e=3, w_s=2)  # three episodic heads
    stream = Stream(policy, prefix=1, seed=2)
    heads = policy.trajectory.heads
    ages = []
    for t in range(1, 12):
        before = [policy.trajectory.frames(row) for row in range(heads)]
        stream.frame(t, n_f=2)
        for row in range(heads):  # an arrival at t evicts at most one frame a head
            ages += [t - gone for gone in set(before[row]) - set(policy.trajectory.frames(row))]
    extra = policy.stats().extra
    assert heads == 3 and len(ages) == extra["stce_evictions"] * heads
    assert extra["evicted_age_mean"] == pytest.approx(sum(ages) / len(ages))


def test_empty_ratios_take_the_head_maps_own_and_a_setting_overrides_them(tmp_path):
    kinds = [[0, 1], [2, 2]]
    write_map(tmp_path / "map.json", kinds)
    head_map = HeadMap.load(tmp_path / "map.json").resplit([0.0, 0.0, 1.0])
    head_map.save(tmp_path / "all_episodic.json")
    geometry = make(tmp_path, kinds).geometry
    by_map = make_policy("h2svc", head_map=HeadMap.load(tmp_path / "all_episodic.json"))
    by_map.setup(geometry)
    assert by_map.ratios == [0.0, 0.0, 1.0] and by_map.bank_id.tolist() == [[2, 2], [2, 2]]
    assert by_map.config_dict()["ratios"] == [0.0, 0.0, 1.0]
    given = make_policy("h2svc", head_map=HeadMap.load(tmp_path / "all_episodic.json"), ratios=[0.25, 0.25, 0.5])
    given.setup(geometry)
    assert given.ratios == [0.25, 0.25, 0.5] and given.bank_id.flatten().tolist().count(2) == 2
    assert given.config_dict()["ratios"] != by_map.config_dict()["ratios"]  # a snapshot of one is not the other's


def test_held_units_are_the_units_stats_lists(tmp_path):
    policy = make(tmp_path, [[0, 1], [2, 2]], w_s=2, w_w=3, n_e=4)
    stream = Stream(policy)
    for unit in range(12):
        stream.frame(unit)
        assert policy.storage.held_units() == policy.stats().units
    assert policy.storage.held_units() != list(range(12))  # some were evicted
