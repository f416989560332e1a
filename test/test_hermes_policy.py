"""The hermes policy on toy caches (no model): re-index with the rotary delta, summary tokens, the
``qwen_rope`` modes. Expected keys are recomputed from the raw keys at the expected positions."""
import pytest
import torch

from streamcache_ros.engine.cache import PREFIX_UNIT, SUMMARY_UNIT, CacheGeometry, NewTokens, make_policy
from streamcache_ros.engine.cache.rope import RotarySpec, apply_rotary

from conftest import family_traits

HEAD_DIM = 16


def geometry(family, num_layers=4):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    section = (2, 3, 3) if family == "qwen2_5_vl" else None
    return CacheGeometry(num_layers=num_layers, num_q_heads=2, num_kv_heads=1, head_dim=HEAD_DIM,
                         dtype=torch.float32, device=torch.device("cpu"),
                         rotary=RotarySpec(inv_freq=inv_freq, mrope_section=section),
                         max_position_embeddings=4096, traits=family_traits(family))


def chunk_rel(axes, units, rows=2, cols=2, t_stride=4):
    """Relative positions of ``units`` merged grids (Qwen: t = k·stride, h = row, w = col)."""
    if axes == 1:
        return torch.arange(units * rows * cols, dtype=torch.float32)[None]
    t = (torch.arange(units) * t_stride).repeat_interleave(rows * cols)
    h = torch.arange(rows).repeat_interleave(cols).repeat(units)
    w = torch.arange(cols).repeat(units * rows)
    return torch.stack([t, h, w]).float()


class Toy:
    """A policy filled through ``attend`` with known raw keys; every token is its own unit, so a
    cached token can be traced back to its raw key after a shrink."""

    def __init__(self, family, num_layers=4, **params):
        torch.manual_seed(0)
        self.policy = make_policy("hermes", **params)
        self.policy.setup(geometry(family, num_layers))
        self.axes = self.policy.geometry.rotary.axes
        self.raw_keys, self.raw_values = {}, {}  # (layer, unit) -> [Hkv, D]
        self.next_unit = 0
        self.add(torch.arange(3, dtype=torch.float32)[None].expand(self.axes, 3).clone(), prefix=True)

    def add(self, rel, prefix=False, chunk=0):
        n = rel.shape[1]
        units = torch.full((n,), PREFIX_UNIT) if prefix else torch.arange(self.next_unit, self.next_unit + n)
        if not prefix:
            self.next_unit += n
        new = NewTokens(rel, units, torch.full((n,), -1 if prefix else chunk))
        for layer in range(self.policy.geometry.num_layers):
            q, k, v = torch.randn(3, 1, 1, n, HEAD_DIM)
            self.policy.attend(layer, q.expand(1, 2, n, HEAD_DIM), k, v, new)
            if not prefix:
                for j, unit in enumerate(units.tolist()):
                    self.raw_keys[layer, unit] = k[0, :, j]
                    self.raw_values[layer, unit] = v[0, :, j]

    def at(self, raw, positions):
        cos, sin = self.policy.geometry.rotary.cos_sin(positions, torch.float32)
        return apply_rotary(raw, cos, sin)


@pytest.mark.parametrize("family, qwen_reindex", [("llava_onevision", "shift"), ("qwen2_5_vl", "shift"),
                                                  ("qwen2_5_vl", "dense_rank")])
def test_eager_shrink_rotates_kept_keys_exactly_to_their_new_positions(family, qwen_reindex):
    toy = Toy(family, budget_tokens=5, reindex="eager", qwen_reindex=qwen_reindex)
    toy.add(chunk_rel(toy.axes, 2), chunk=0)
    toy.add(chunk_rel(toy.axes, 2) + toy.policy.layers[0].next_offset(), chunk=1)
    policy = toy.policy
    before = [s.positions.clone() for s in policy.layers]
    keep = torch.tensor([0, 1, 2, 4, 5, 9, 12, 17, 18])  # the prefix, three tokens of each chunk
    policy.shrink([keep] * 4, compact=True)
    assert policy.reindex_events == 1
    for layer, store in enumerate(policy.layers):
        video = (store.units >= 0).nonzero().flatten()
        for j in video.tolist():
            expected = toy.at(toy.raw_keys[layer, int(store.units[j])], store.positions[:, j:j + 1])
            torch.testing.assert_close(store.keys[0, :, j], expected, atol=2e-5, rtol=0)
        kept_old = before[layer][:, keep]
        if family == "llava_onevision":  # §10.1: 0..n-1, prefix included
            assert store.positions[0, :9].tolist() == list(range(9))
        elif qwen_reindex == "dense_rank":  # §10.2: P + per-axis dense rank
            for axis in range(3):
                ranks = torch.unique(kept_old[axis, 3:], return_inverse=True)[1] + 3
                assert store.positions[axis, 3:9].tolist() == ranks.float().tolist()
        else:  # shift: each chunk moved by one delta on every axis, its geometry kept
            delta = store.positions[:, :9] - kept_old
            assert torch.all(delta[:, 3:6] == delta[0, 3]) and torch.all(delta[:, 6:9] == delta[0, 6])
        assert store.positions[:, :3].tolist() == [[0.0, 1.0, 2.0]] * toy.axes


@pytest.mark.parametrize("family", ["llava_onevision", "qwen2_5_vl"])
@pytest.mark.parametrize("compact", [False, True])
def test_summary_token_of_deep_layers(family, compact):
    toy = Toy(family, budget_tokens=5, reindex="eager" if compact else "lazy")
    toy.add(chunk_rel(toy.axes, 2))
    policy = toy.policy
    keep = torch.tensor([0, 1, 2, 3, 6, 8])
    pruned_units = [1, 2, 4, 6, 7]  # cache index = unit + 3
    policy.shrink([keep] * 4, compact=compact)
    roles = policy.roles  # 4 layers: mid, mid, deep, deep
    for layer, store in enumerate(policy.layers):
        summaries = (store.units == SUMMARY_UNIT).nonzero().flatten()
        if roles[layer] != "deep":
            assert summaries.numel() == 0 and len(store) == 6
            continue
        assert summaries.tolist() == [6]  # appended after the kept tokens
        target = store.positions[:, :6].max() + 1 if toy.axes == 3 else store.positions[0, 5] + 1
        assert store.positions[:, 6].tolist() == [float(target)] * toy.axes
        if family == "llava_onevision" and compact:
            assert float(target) == 6.0  # len(safe)
        # K = mean over pruned of R(s - p)·k_p = R(s)·mean(raw); V = mean of values
        raw = torch.stack([toy.raw_keys[layer, u] for u in pruned_units]).mean(0)
        expected = toy.at(raw[:, None], torch.full((toy.axes, 1), float(target)))[:, 0]
        torch.testing.assert_close(store.keys[0, :, 6], expected, atol=2e-5, rtol=0)
        values = torch.stack([toy.raw_values[layer, u] for u in pruned_units]).mean(0)
        torch.testing.assert_close(store.values[0, :, 6], values, atol=1e-6, rtol=0)


def test_a_kept_summary_stays_and_an_evicted_one_is_merged_with_weight_one():
    toy = Toy("llava_onevision", budget_tokens=4)
    toy.add(chunk_rel(1, 1))  # 4 video tokens, units 0..3
    policy = toy.policy
    policy.shrink([torch.tensor([0, 1, 2, 5, 6])] * 4, compact=False)  # deep: units 2, 3 kept, 0, 1 folded
    deep = policy.layers[3]
    assert deep.units.tolist() == [-1, -1, -1, 2, 3, SUMMARY_UNIT]
    first_summary = (deep.keys[0, :, 5].clone(), deep.values[0, :, 5].clone(), float(deep.positions[0, 5]))
    toy.add(chunk_rel(1, 1) + deep.next_offset())  # units 4..7 at the deep layer's own next positions
    # candidates of the deep layer: units 2, 3, summary, 4, 5, 6, 7 (cache 3..9). Keep 3 and the summary.
    policy.shrink([torch.tensor([0, 1, 2, 4, 5])] * 4, compact=False)
    deep = policy.layers[3]
    assert deep.units.tolist() == [-1, -1, -1, 3, SUMMARY_UNIT, SUMMARY_UNIT]  # D8: summaries accumulate
    torch.testing.assert_close(deep.keys[0, :, 4], first_summary[0])
    # second round: the pruned are unit 2 and units 4..7; now evict the kept summary too
    toy.add(chunk_rel(1, 1) + deep.next_offset())
    values_before = deep.values[0, :, 3:6].clone()  # unit 3, summary, summary
    policy.shrink([torch.tensor([0, 1, 2, 6, 7, 8, 9])] * 4, compact=False)
    deep = policy.layers[3]
    # pruned: unit 3 and both summaries, each with weight 1 in the plain mean of values
    torch.testing.assert_close(deep.values[0, :, -1], values_before.mean(dim=1))


@pytest.mark.parametrize("mode, family", [("per_layer", "qwen2_5_vl"), ("layer0", "qwen2_5_vl"),
                                          ("layer0", "llava_onevision")])
def test_qwen_rope_mode(mode, family):
    toy = Toy(family, budget_tokens=4, qwen_rope=mode)
    policy = toy.policy
    # put layer 1 one position ahead of layer 0, as a summary token does (§3)
    g = policy.geometry
    extra = torch.full((g.rotary.axes, 1), 3.0)
    policy.layers[1].append(torch.zeros(1, 1, 1, HEAD_DIM), torch.zeros(1, 1, 1, HEAD_DIM), extra,
                            torch.tensor([SUMMARY_UNIT]), torch.tensor([-1]))
    rel = chunk_rel(g.rotary.axes, 1)
    n = rel.shape[1]
    k = torch.randn(1, 1, n, HEAD_DIM)
    new = NewTokens(rel, torch.arange(n), torch.zeros(n, dtype=torch.long))
    for layer in range(g.num_layers):
        policy.attend(layer, torch.randn(1, 2, n, HEAD_DIM), k, torch.randn(1, 1, n, HEAD_DIM), new)
    layer1 = policy.layers[1]
    assert layer1.positions[:, -n:].tolist() == (rel + 4).tolist()  # recorded: the layer's own positions
    rotated_at = 3 if (mode == "layer0" and family == "qwen2_5_vl") else 4  # D1 reproduces layer 0's
    torch.testing.assert_close(layer1.keys[:, :, -n:], toy.at(k, rel + rotated_at), atol=1e-6, rtol=0)
    torch.testing.assert_close(policy.layers[0].keys[:, :, -n:], toy.at(k, rel + 3), atol=1e-6, rtol=0)


def test_bad_parameters_are_refused_with_their_name():
    for params, name in [({"qwen_rope": "x"}, "qwen_rope"), ({"guidance_queries": "y"}, "guidance_queries"),
                         ({"qwen_reindex": "z"}, "qwen_reindex"), ({"lambda_mid": 1.5}, "lambda_mid"),
                         ({"mid_k": [1.0]}, "mid_k"), ({"budget_tokens": 0}, "budget_tokens"),
                         ({"shallow_end_ratio": 0.8}, "shallow_end_ratio"), ({"score_dtype": "f8"}, "score_dtype")]:
        with pytest.raises(ValueError, match=name):
            make_policy("hermes", **params)


def test_shift_reindex_falls_back_to_dense_ranks_when_the_chunks_do_not_fit():
    # chunks with t stride 40; keeping the last token (t = 40, h = w = 1 from the chunk start) of each
    # of 4 chunks needs 40 positions per chunk under the shift rule: 162 > the threshold 4096 − 4000
    toy = Toy("qwen2_5_vl", budget_tokens=4, reindex="eager", reindex_margin=4000)
    for chunk in range(4):
        toy.add(chunk_rel(3, 2, t_stride=40) + toy.policy.layers[0].next_offset(), chunk=chunk)
    keep = torch.tensor([0, 1, 2, 3 + 7, 11 + 7, 19 + 7, 27 + 7])  # the last token (t = 40) of each chunk
    toy.policy.shrink([keep] * 4, compact=True)
    store = toy.policy.layers[0]
    assert toy.policy.dense_fallbacks == 4  # every layer
    assert store.positions[:, 3:].tolist() == [[3.0, 4.0, 5.0, 6.0]] * 3
    for j in range(3, 7):
        expected = toy.at(toy.raw_keys[0, int(store.units[j])], store.positions[:, j:j + 1])
        torch.testing.assert_close(store.keys[0, :, j], expected, atol=2e-5, rtol=0)
    # with room to spare the same shrink keeps each chunk's geometry: the kept token (o+40, o+1, o+1)
    # moves by one delta to (cursor+39, cursor, cursor), and the next chunk starts at its max + 1
    roomy = Toy("qwen2_5_vl", budget_tokens=4, reindex="eager")
    for chunk in range(4):
        roomy.add(chunk_rel(3, 2, t_stride=40) + roomy.policy.layers[0].next_offset(), chunk=chunk)
    roomy.policy.shrink([keep] * 4, compact=True)
    assert roomy.policy.dense_fallbacks == 0
    assert roomy.policy.layers[0].positions[0, 3:].tolist() == [42.0, 82.0, 122.0, 162.0]


# -- the whole step against a transcription of the reference's code (docs/hermes.md §7-§10) ---------------
def _reference_rotate(keys, rotary, old, new):
    """The reference's delta (reindex_1d.py): cosΔ = cos_new·cos_old + sin_new·sin_old,
    sinΔ = sin_new·cos_old − cos_new·sin_old."""
    cos_old, sin_old = rotary.cos_sin(old, torch.float32)
    cos_new, sin_new = rotary.cos_sin(new, torch.float32)
    cos_d = cos_new * cos_old + sin_new * sin_old
    sin_d = sin_new * cos_old - cos_new * sin_old
    half = keys.shape[-1] // 2
    return keys * cos_d + torch.cat((-keys[..., half:], keys[..., :half]), dim=-1) * sin_d


def _reference_step(keys, values, positions, attention, prefix_len, kv_size, qwen, streaming, threshold, rotary):
    """prune_kv_cache_by_attention + _shrink_positions_and_rerotate_keys, written out as docs/hermes.md quotes
    them (one loop per stage, no shared helpers), on per-layer lists of tensors."""
    layers = len(keys)
    short_end, long_start = int(layers * 0.1), int(layers * (1 - 0.3))
    raw, configs = [], []
    for layer in range(layers):
        if layer < short_end:
            kind, alpha, k = "short", 1, 20
        elif layer >= long_start:
            kind, alpha, k = "long", 0, 0.0
        else:
            progress = (layer - short_end) / (long_start - short_end)
            kind = "mid"
            alpha, k = (0.75 - 0.6 * progress, 20 - 12 * progress) if qwen else (1.0 - 0.9 * progress,
                                                                                 20 - 19.5 * progress)
        attn = attention[layer]
        count = attn.shape[0]
        index = torch.arange(count, dtype=torch.float32)
        rec = torch.exp(-k * ((count - 1 - index) / max(count - 1, 1)))
        attn_norm = (attn - attn.min()) / (attn.max() - attn.min() + 1e-6)
        rec_norm = (rec - rec.min()) / (rec.max() - rec.min() + 1e-6)
        raw.append(attn_norm * (1 - alpha) + rec_norm * alpha)
        budget = max(0, kv_size - 1) if kind == "long" else kv_size
        configs.append((min(budget, count), kind))
    refined = [r.clone() for r in raw]
    for i in range(layers - 2, -1, -1):
        gamma = {"long": 0.4, "mid": 0.3, "short": 0.1}[configs[i][1]]
        refined[i] = (1 - gamma) * refined[i] + gamma * refined[i + 1]
    keeps = [torch.cat((torch.arange(prefix_len), torch.sort(torch.topk(score, n, sorted=False)[1] + prefix_len)[0]))
             for score, (n, _) in zip(refined, configs)]
    current_max = max(float(p.max()) if qwen else float(p[0, -1]) for p in positions)
    compact = (current_max > threshold) if streaming else True
    out = []
    for layer in range(layers):
        safe = torch.unique(keeps[layer], sorted=True)
        k_kept, v_kept = keys[layer][:, :, safe], values[layer][:, :, safe]
        old = positions[layer][:, safe]
        new = old.clone()
        if compact:
            if qwen:
                for axis in range(3):
                    _, inverse = torch.unique(old[axis, prefix_len:], sorted=True, return_inverse=True)
                    new[axis, prefix_len:] = (torch.arange(inverse.max() + 1) + prefix_len)[inverse].float()
            else:
                new = torch.arange(len(safe), dtype=torch.float32)[None]
            k_kept = _reference_rotate(k_kept, rotary, old, new)
        if layer >= long_start:
            mask = torch.ones(keys[layer].shape[2], dtype=torch.bool)
            mask[safe] = False
            pruned = torch.nonzero(mask).squeeze(1)
            if pruned.numel() > 0:
                if qwen:
                    s = new.max().item() + 1
                else:
                    s = len(safe) if compact else new[0, -1].item() + 1
                target = torch.full((rotary.axes, pruned.numel()), float(s))
                aligned = _reference_rotate(keys[layer][:, :, pruned], rotary, positions[layer][:, pruned], target)
                k_kept = torch.cat((k_kept, aligned.mean(dim=2, keepdim=True)), dim=2)
                v_kept = torch.cat((v_kept, values[layer][:, :, pruned].mean(dim=2, keepdim=True)), dim=2)
                new = torch.cat((new, torch.full((rotary.axes, 1), float(s))), dim=1)
        out.append((k_kept, v_kept, new))
    return out


@pytest.mark.parametrize("family, mode", [("llava_onevision", "lazy"), ("llava_onevision", "eager"),
                                          ("qwen2_5_vl", "lazy"), ("qwen2_5_vl", "eager")])
def test_a_whole_step_matches_the_reference_transcription_on_28_layers(family, mode):
    qwen = family == "qwen2_5_vl"
    params = {"qwen_reindex": "dense_rank", "qwen_rope": "layer0"} if qwen else {}
    toy = Toy(family, num_layers=28, budget_tokens=10, reindex=mode, **params)
    policy = toy.policy
    for chunk in range(3):  # 3 prefix tokens + 3 chunks of 8: 24 candidates, 10 slots
        toy.add(chunk_rel(toy.axes, 2) + policy.layers[0].next_offset(), chunk=chunk)
    policy.shrink(policy.plan([torch.rand(24) for _ in range(28)], 3), compact=mode == "eager")  # a summary
    toy.add(chunk_rel(toy.axes, 2) + policy.layers[0].next_offset(), chunk=3)
    stores = [(s.keys.clone(), s.values.clone(), s.positions.clone()) for s in policy.layers]
    count = len(policy.layers[0]) - 3
    attention = [torch.rand(count) for _ in range(28)]
    expected = _reference_step(*zip(*stores), attention, 3, 10, qwen, mode == "lazy",
                               policy.rule.threshold, policy.geometry.rotary)
    # the policy skips the attention of layers with ω = 1 (it has weight 0): give it None there
    given = [None if omega == 1.0 else attn for (omega, _), attn in zip(policy.schedule, attention)]
    policy.shrink(policy.plan(given, 3), compact=mode == "eager")
    for layer, (store, (k, v, positions)) in enumerate(zip(policy.layers, expected)):
        assert store.positions.tolist() == positions.tolist(), layer
        torch.testing.assert_close(store.keys, k, atol=1e-4, rtol=0)
        torch.testing.assert_close(store.values, v, atol=1e-6, rtol=0)
