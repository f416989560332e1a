"""HERMES's rules on hand-made tensors. Expected values are worked out by hand from docs/hermes.md."""
import math

import pytest
import torch

from streamcache_ros.engine.cache import CacheGeometry, NewTokens, make_policy
from streamcache_ros.engine.cache.hermes_rules import (DEEP, GLOBAL_PROMPT, LOCAL_PROMPT, MID, SHALLOW,
                                                       frame_keep_indices, guidance_attention, guidance_prompts,
                                                       interpolate_linear, keep_indices, layer_budget, layer_roles,
                                                       layer_split, raw_scores, recency_norm, sanitize_keep,
                                                       smooth_scores, summary_token)
from streamcache_ros.engine.cache.rope import RotarySpec
from streamcache_ros.engine.cache.positions import dense_rank_positions
from streamcache_ros.engine.status import Exchange

from conftest import family_traits

LN2, LN3 = math.log(2.0), math.log(3.0)


def toy_geometry(num_layers, family="llava_onevision", head_dim=8, rotary=None):
    traits = family_traits(family)
    section = (head_dim // 4, head_dim // 8, head_dim // 8) if traits.rope_layout == "mrope" else None
    rotary = rotary or RotarySpec(inv_freq=torch.ones(head_dim // 2), mrope_section=section)
    return CacheGeometry(num_layers=num_layers, num_q_heads=2, num_kv_heads=1, head_dim=head_dim,
                         dtype=torch.float32, device=torch.device("cpu"), rotary=rotary,
                         max_position_embeddings=4096, traits=traits)


# -- §1 layer split ---------------------------------------------------------------------------------
@pytest.mark.parametrize("layers, split", [(28, (2, 19)), (24, (2, 16)), (36, (3, 25)), (64, (6, 44)),
                                           (80, (8, 56)), (4, (0, 2))])
def test_layer_split_truncates_like_the_reference(layers, split):
    assert layer_split(layers, 0.1, 0.7) == split


def test_layer_roles_at_28_layers_are_2_17_9():
    roles = layer_roles(28, *layer_split(28, 0.1, 0.7))
    assert [roles.count(r) for r in (SHALLOW, MID, DEEP)] == [2, 17, 9]
    assert roles[1] == SHALLOW and roles[2] == MID and roles[18] == MID and roles[19] == DEEP


# -- §7 ω and k schedules (docs/hermes.md's L=28 table) ----------------------------------------------------------
TABLE_28 = {  # layer: (ω LLaVA, k LLaVA, ω Qwen, k Qwen)
    0: (1, 20, 1, 20), 1: (1, 20, 1, 20),
    2: (1.0, 20.0, 0.75, 20.0), 3: (0.9471, 18.8529, 0.7147, 19.2941),
    10: (0.5765, 10.8235, 0.4676, 14.3529), 18: (0.1529, 1.6471, 0.1853, 8.7059),
    19: (0, 0, 0, 0), 27: (0, 0, 0, 0),
}


@pytest.mark.parametrize("family, column", [("llava_onevision", 0), ("qwen2_5_vl", 2)])
def test_omega_and_k_per_layer_match_the_docs_table(family, column):
    policy = make_policy("hermes")
    policy.setup(toy_geometry(28, family))
    for layer, row in TABLE_28.items():
        omega, k = policy.schedule[layer]
        assert omega == pytest.approx(row[column], abs=5e-5), layer
        assert k == pytest.approx(row[column + 1], abs=5e-5), layer


# -- §7 raw scores --------------------------------------------------------------------------------------
def test_raw_scores_by_hand():
    # N = 3: dist = (1, 1/2, 0); k = 2 ln 2 gives recency (1/4, 1/2, 1) -> minmax (0, 1/3, 1)
    # attention (0.2, 0.6, 0.4) -> minmax (0, 1, 1/2); ω = 1/2 -> (0, 2/3, 3/4)
    scores = raw_scores(torch.tensor([0.2, 0.6, 0.4]), omega=0.5, k=2 * LN2)
    assert scores.tolist() == pytest.approx([0.0, 2 / 3, 0.75], abs=1e-5)


def test_deep_scores_are_the_normalised_attention_and_k0_recency_is_zero():
    assert recency_norm(5, 0.0).tolist() == [0.0] * 5
    scores = raw_scores(torch.tensor([0.3, 0.1, 0.2]), omega=0.0, k=0.0)
    assert scores.tolist() == pytest.approx([1.0, 0.0, 0.5], abs=1e-5)


def test_recency_is_a_rank_not_a_time():
    # the same three candidates get the same recency whatever their positions or ages (D7)
    assert recency_norm(3, 2 * LN2).tolist() == pytest.approx([0.0, 1 / 3, 1.0], abs=1e-5)
    assert recency_norm(1, 20.0).tolist() == [0.0]


def test_shallow_recency_with_k20_is_negligible_for_old_tokens():
    # §7: k = 20 puts the recency below 1e-5 beyond ~60% of the span
    norm = recency_norm(101, 20.0)
    assert float(norm[:40].max()) < 1e-5 and float(norm[-1]) == pytest.approx(1.0, abs=1e-5)


# -- §8 smoothing -------------------------------------------------------------------------------------------
LAMBDAS = {SHALLOW: 0.1, MID: 0.3, DEEP: 0.4}


def test_smoothing_cascades_from_deep_to_shallow():
    raw = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])]
    refined = smooth_scores(raw, [SHALLOW, MID, DEEP], LAMBDAS)
    assert refined[2].tolist() == [1.0, 0.0]  # the deepest layer is not smoothed
    assert refined[1].tolist() == pytest.approx([0.3, 0.7])  # 0.7·raw1 + 0.3·raw2
    # 0.9·raw0 + 0.1·refined1, not 0.1·raw1 (which would give 0.9, 0.1)
    assert refined[0].tolist() == pytest.approx([0.93, 0.07])


def test_smoothing_weight_follows_the_role_of_the_shallower_layer():
    raw = [torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.0])]
    assert smooth_scores(raw, [MID, DEEP, DEEP], LAMBDAS)[0].tolist() == pytest.approx([0.7])
    assert smooth_scores(raw, [DEEP, DEEP, DEEP], LAMBDAS)[0].tolist() == pytest.approx([0.6])


def test_interpolation_is_linear_with_half_pixel_centres():
    # src = (j + 0.5)·2/4 − 0.5 = (−0.25 -> 0, 0.25, 0.75, 1.25 -> last)
    assert interpolate_linear(torch.tensor([0.0, 1.0]), 4).tolist() == pytest.approx([0.0, 0.25, 0.75, 1.0])


def test_smoothing_interpolates_a_deeper_layer_of_another_length():
    raw = [torch.zeros(4), torch.tensor([0.0, 1.0])]
    refined = smooth_scores(raw, [MID, DEEP], LAMBDAS)
    assert refined[0].tolist() == pytest.approx([0.0, 0.075, 0.225, 0.3])


# -- §9 selection ---------------------------------------------------------------------------------------
def test_budgets_deep_layers_give_one_slot_to_the_summary():
    assert layer_budget(MID, 5, 10) == 5
    assert layer_budget(DEEP, 5, 10) == 4
    assert layer_budget(DEEP, 5, 10, summary=False) == 5
    assert layer_budget(SHALLOW, 5, 3) == 3 and layer_budget(DEEP, 5, 3) == 3
    assert layer_budget(DEEP, 1, 3) == 0


def test_keep_indices_keep_the_prefix_on_top_of_the_slots():
    keep = keep_indices(torch.tensor([0.1, 0.9, 0.5, 0.7]), slots=2, prefix_len=3)
    assert keep.tolist() == [0, 1, 2, 4, 6]


def test_sanitize_keep():
    assert sanitize_keep(torch.tensor([5, 1, 1, -1, 9, 3]), 6).tolist() == [1, 3, 5]
    assert sanitize_keep(torch.tensor([7, 8]), 6).tolist() == [0]


# -- §5 prompts -------------------------------------------------------------------------------------------
def test_prompts_without_history():
    prompts = guidance_prompts([])
    assert prompts["local"] == ("Describe the current scene in detail, focusing on specific objects, "
                                "fine-grained actions, and spatial relationships.") == LOCAL_PROMPT
    assert prompts["global"] == ("Summarize the video narrative, identifying main characters, key events, "
                                 "timeline changes, and the overall theme.") == GLOBAL_PROMPT
    assert prompts["mixed"] == LOCAL_PROMPT + "; " + GLOBAL_PROMPT


def test_prompts_use_the_last_exchange_with_a_letter_answer_as_its_option():
    history = [Exchange("first?", "nothing", []), Exchange("what colour?", " (B) \n", ["red", "blue"])]
    prompts = guidance_prompts(history)
    exchange = "Question: what colour? Answer: blue"
    assert prompts["local"] == f"Find recent details related to: {exchange}. {LOCAL_PROMPT}"
    assert prompts["global"] == f"Context summary: {exchange}. {GLOBAL_PROMPT}"
    assert prompts["mixed"] == prompts["local"] + "; " + prompts["global"]
    assert "first?" not in prompts["mixed"]


@pytest.mark.parametrize("answer, options, seen", [
    ("A) red ball", ["red ball", "blue"], "Answer: red ball"),  # not a bare letter: labels removed
    ("D", ["red", "blue"], "Answer: D"),  # a letter with no such option stays
    ("B", [], "Answer: B"),  # open question
])
def test_prompt_answer_text(answer, options, seen):
    assert seen + "." in guidance_prompts([Exchange("q", answer, options)])["global"]


# -- §6 guidance attention --------------------------------------------------------------------------------
def _attention(q_rows, cache_x, guidance_x, prefix_len):
    """q [Hq rows of 2], keys with the given x components (y = 0); head_dim 2, so logits = x·q_x·/√2."""
    q = torch.tensor(q_rows, dtype=torch.float32)[None, :, None, :]  # [1, Hq, 1, 2]
    cache = torch.tensor([[[x, 0.0] for x in head] for head in cache_x])[None]
    guid = torch.tensor([[[x, 0.0] for x in head] for head in guidance_x])[None]
    return guidance_attention(q, guid, cache, prefix_len)


def test_guidance_attention_pooling_by_hand():
    # head 0: logits (0, ln3, 0 | 0) -> (1/6, 1/2, 1/6 | 1/6); head 1 reads y = 0 everywhere -> 1/4 each.
    # mean over heads, drop the prefix column and the guidance column: ((1/2+1/4)/2, (1/6+1/4)/2)
    pooled = _attention([[math.sqrt(2), 0.0], [0.0, math.sqrt(2)]], [[0.0, LN3, 0.0]], [[0.0]], prefix_len=1)
    assert pooled.tolist() == pytest.approx([0.375, 5 / 24], abs=1e-6)


def test_guidance_attention_groups_heads_like_repeat_interleave():
    # 4 query heads on 2 kv heads: heads 0,1 read kv head 0 (x-logits), heads 2,3 read kv head 1, where
    # their queries see only zeros. A tiled mapping (h % 2) would give 7/24 for both candidates.
    q = [[math.sqrt(2), 0.0], [math.sqrt(2), 0.0], [0.0, math.sqrt(2)], [0.0, math.sqrt(2)]]
    pooled = _attention(q, [[0.0, LN3, 0.0], [0.0, 0.0, LN3]], [[0.0], [0.0]], prefix_len=1)
    assert pooled.tolist() == pytest.approx([0.375, 5 / 24], abs=1e-6)


def test_guidance_tokens_see_each_other_without_a_causal_mask():
    # two guidance tokens with the same query; guidance keys x = (0, ln2): every row is (1,1,1,2)/5, so
    # each cached candidate gets 1/5 (with a causal mask the first row would give 1/3)
    q = torch.tensor([math.sqrt(2), 0.0]).expand(1, 1, 2, 2)
    cache = torch.zeros(1, 1, 2, 2)
    guid = torch.tensor([[0.0, 0.0], [LN2, 0.0]])[None, None]
    pooled = guidance_attention(q, guid, cache, prefix_len=0)
    assert pooled.tolist() == pytest.approx([0.2, 0.2], abs=1e-6)


def test_guidance_attention_in_blocks_of_rows_equals_the_whole_matrix(monkeypatch):
    # 8 query heads on 2 kv heads, 5 guidance tokens, 40 cached keys (3 of them the prefix): the
    # pooled attention of the whole softmax matrix, against the same taken 7 elements' worth of rows
    # at a time (one row a block: 45 > 7) and 200 at a time (several rows a block, the last one short)
    from streamcache_ros.engine.cache import hermes_rules

    gen = torch.Generator().manual_seed(0)
    q, guid, cache = (torch.randn(*shape, generator=gen) for shape in ((1, 8, 5, 4), (1, 2, 5, 4), (1, 2, 40, 4)))
    stacked = torch.cat((cache, guid), dim=2).repeat_interleave(4, dim=1)
    whole = torch.softmax(q @ stacked.transpose(-1, -2) / 2.0, dim=-1)[0].mean(0)[:, 3:40].mean(0)
    for elements in (7, 200, 1 << 20):
        monkeypatch.setattr(hermes_rules, "GUIDANCE_BLOCK_ELEMENTS", elements)
        torch.testing.assert_close(guidance_attention(q, guid, cache, prefix_len=3), whole, atol=1e-7, rtol=1e-5)


def test_guidance_attention_can_round_like_the_reference():
    q = torch.tensor([math.sqrt(2), 0.0]).expand(1, 1, 1, 2)
    pooled = guidance_attention(q, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 3, 2), 1,
                                softmax_dtype=torch.float16, weights_dtype=torch.float16)
    assert pooled.dtype == torch.float16 and pooled.tolist() == [0.25, 0.25]


# -- §10 summary and re-index -----------------------------------------------------------------------------
QUARTER_TURN = RotarySpec(inv_freq=torch.tensor([math.pi / 2]))  # head_dim 2: position p turns by p·90°


def test_summary_key_rotates_each_pruned_key_to_the_target_then_averages():
    # raw (1,0) at position 1 is cached as (0,1); raw (0,1) at position 2 as (0,-1). Moved to
    # position 3: R(270°)(1,0) = (0,-1) and R(270°)(0,1) = (1,0); mean (0.5, -0.5).
    # Token 0 (position 0) is kept and must not count.
    keys = torch.tensor([[5.0, 5.0], [0.0, 1.0], [0.0, -1.0]])[None, None]
    values = torch.tensor([[9.0, 9.0], [1.0, 2.0], [3.0, 6.0]])[None, None]
    positions = torch.tensor([[0.0, 1.0, 2.0]])
    key, value = summary_token(keys, values, positions, torch.tensor([1, 2]), 3.0, QUARTER_TURN)
    assert key.flatten().tolist() == pytest.approx([0.5, -0.5], abs=1e-6)
    assert value.flatten().tolist() == [2.0, 4.0]


def test_summary_key_on_mrope_moves_every_axis_to_the_target():
    # head_dim 6, one channel pair per axis (t, h, w), 90° per position. Raw (1,1,1,0,0,0) cached at
    # (1,5,7) is (cos 90°, cos 450°, cos 630°, sin ...) = (0,0,0,1,1,-1); at (2,6,8): (-1,-1,1,0,0,0).
    # Both moved to (8,8,8) are the raw vector turned by 720° on every axis: (1,1,1,0,0,0).
    spec = RotarySpec(inv_freq=torch.full((3,), math.pi / 2), mrope_section=(1, 1, 1))
    keys = torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0, -1.0], [-1.0, -1.0, 1.0, 0.0, 0.0, 0.0]])[None, None]
    positions = torch.tensor([[1.0, 2.0], [5.0, 6.0], [7.0, 8.0]])
    key, _ = summary_token(keys, torch.zeros(1, 1, 2, 6), positions, torch.tensor([0, 1]), 8.0, spec)
    assert key.flatten().tolist() == pytest.approx([1, 1, 1, 0, 0, 0], abs=1e-5)


def test_dense_rank_reindex_ranks_each_axis_on_its_own():
    # docs/hermes.md §10.2: with P = 5, t 12,12,13,21 becomes 5,5,6,7; h and w are ranked separately
    prefix = [0.0, 1.0, 2.0, 3.0, 4.0]
    old = torch.tensor([prefix + [12, 12, 13, 21], prefix + [20, 18, 18, 30], prefix + [7, 9, 8, 7]])
    new = dense_rank_positions(old, prefix_len=5)
    assert new.tolist() == [prefix + [5, 5, 6, 7], prefix + [6, 5, 5, 7], prefix + [5, 7, 6, 5]]


# -- the rules together, on a 3-layer toy with known attention -----------------------------------------------
def _toy_stores(policy, prefix_len, video):
    """Fill every layer with ``prefix_len`` prefix tokens and ``video`` tokens of unit 0 (chunk 0)."""
    g = policy.geometry
    for units, chunk in ((torch.full((prefix_len,), -1), -1), (torch.zeros(video, dtype=torch.long), 0)):
        n = len(units)
        new = NewTokens(torch.arange(n, dtype=torch.float32)[None].expand(g.rotary.axes, n).clone(), units,
                        torch.full((n,), chunk))
        for layer in range(g.num_layers):
            qkv = torch.randn(3, 1, 1, n, g.head_dim)
            policy.attend(layer, qkv[0].expand(1, g.num_q_heads, n, g.head_dim), qkv[1], qkv[2], new)


def test_selection_on_a_three_layer_toy():
    # roles shallow / mid / deep (int(3·0.34) = 1, int(3·0.67) = 2); mid at p = 0 with ω = 1/2, k = 3 ln 2
    policy = make_policy("hermes", budget_tokens=2, shallow_end_ratio=0.34, deep_start_ratio=0.67,
                         mid_omega=[0.5, 0.0], mid_k=[3 * LN2, 0.0])
    policy.setup(toy_geometry(3))
    torch.manual_seed(0)
    _toy_stores(policy, prefix_len=1, video=4)
    attention = [None, torch.tensor([0.1, 0.5, 0.1, 0.3]), torch.tensor([0.4, 0.1, 0.3, 0.2])]
    keep = policy.plan(attention, prefix_len=1)
    # deep: minmax (1, 0, 2/3, 1/3), one slot (the other is the summary's) -> candidate 0
    assert keep[2].tolist() == [0, 1]
    # mid: attention (0, 1, 0, 1/2), recency (1/8, 1/4, 1/2, 1) -> (0, 1/7, 3/7, 1);
    # raw = (0, 4/7, 3/14, 3/4); refined = 0.7·raw + 0.3·deep = (0.3, 0.4, 0.35, 0.625) -> 3 and 1
    assert keep[1].tolist() == [0, 2, 4]
    # shallow: recency with k = 20 is ~(0, 1.6e-6, 1.3e-3, 1); refined = 0.9·that + 0.1·mid refined
    # = (0.03, 0.040, 0.036, 0.96): candidate 1 beats the more recent 2 because of the deeper layers
    assert keep[0].tolist() == [0, 2, 4]


# -- selection by frames -----------------------------------------------------------------------------
def test_frame_selection_keeps_whole_units_by_mean_score_and_fills_the_slots():
    # units 10 (3 tokens), 11 (3), 12 (2); means 0.5, 0.8, 0.2 -> unit 11 first, then unit 10
    units = torch.tensor([10, 10, 10, 11, 11, 11, 12, 12])
    refined = torch.tensor([0.9, 0.3, 0.3, 0.8, 0.8, 0.8, 0.1, 0.3])
    keep = frame_keep_indices(refined, units, slots=6, prefix_len=2)
    assert keep.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # the prefix, then units 10 and 11 whole
    # 5 slots: unit 11 (3), unit 10 does not fit, unit 12 (2) does
    assert frame_keep_indices(refined, units, slots=5, prefix_len=0).tolist() == [3, 4, 5, 6, 7]
    # 4 slots: unit 11, then no whole unit fits one slot: the best single token left (0.9, of unit 10)
    assert frame_keep_indices(refined, units, slots=4, prefix_len=0).tolist() == [0, 3, 4, 5]
    # the token selection would break unit 11 up for the 0.9 token
    assert keep_indices(refined, 4, 0).tolist() == [0, 3, 4, 5]
    assert keep_indices(refined, 3, 0).tolist() != frame_keep_indices(refined, units, 3, 0).tolist()


def test_frame_selection_keeps_everything_that_fits_and_as_many_tokens_as_token_selection():
    units = torch.arange(12) // 3
    refined = torch.rand(12, generator=torch.Generator().manual_seed(0))
    assert frame_keep_indices(refined, units, 20, 1).tolist() == list(range(13))
    for slots in range(13):
        assert len(frame_keep_indices(refined, units, slots, 1)) == len(keep_indices(refined, slots, 1))
