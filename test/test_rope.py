"""RoPE and re-indexing helpers on plain tensors, checked against hand values and transformers."""
import math

import pytest
import torch

from streamcache_ros.engine.cache.positions import sequential_positions, shift_positions
from streamcache_ros.engine.cache.rope import RotarySpec, apply_rotary, rotate_by_delta, rotate_half


def test_rotate_half_layout():
    assert rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [-3.0, -4.0, 1.0, 2.0]


def test_rotation_by_hand():
    # head_dim 4, inv_freq (1, 0.5): channel pairs (0,2) turn by pos·1, (1,3) by pos·0.5
    spec = RotarySpec(inv_freq=torch.tensor([1.0, 0.5]))
    cos, sin = spec.cos_sin(torch.tensor([[math.pi / 2]]), torch.float32)
    k = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    out = apply_rotary(k, cos, sin)[0]
    expected = [math.cos(math.pi / 2), math.cos(math.pi / 4), math.sin(math.pi / 2), math.sin(math.pi / 4)]
    assert out.tolist() == pytest.approx(expected, abs=1e-6)


def test_mrope_channels_follow_the_section():
    # mrope_section (1, 2, 1) over 4 half-channels: t, h, h, w (then repeated for the second half)
    spec = RotarySpec(inv_freq=torch.ones(4), mrope_section=(1, 2, 1))
    ang = spec.angles(torch.tensor([[10.0], [20.0], [30.0]]))
    assert ang[0].tolist() == [10.0, 20.0, 20.0, 30.0, 10.0, 20.0, 20.0, 30.0]


@pytest.mark.parametrize("family", ["tiny-qwen2_5_vl", "tiny-llava_onevision"])
def test_cos_sin_match_the_model_rotary(family, request):
    adapter = request.getfixturevalue("qwen_adapter" if "qwen" in family else "llava_adapter")
    spec = adapter.rotary_spec()
    rope = adapter.text_model.rotary_emb
    x = torch.zeros(1, 1, spec.head_dim)
    if spec.axes == 3:
        positions = torch.stack([torch.arange(7) * 4, torch.arange(7) % 3 + 5, torch.arange(7) + 9]).float()
        ref_cos, ref_sin = rope(x, positions[:, None, :].long())
    else:
        positions = (torch.arange(7) * 13).float()[None]
        ref_cos, ref_sin = rope(x, positions.long())
    cos, sin = spec.cos_sin(positions, torch.float32)
    torch.testing.assert_close(cos, ref_cos[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, ref_sin[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("section", [None, (2, 3, 3)])
def test_rotary_delta_equals_recomputing_at_new_positions(section):
    torch.manual_seed(0)
    spec = RotarySpec(inv_freq=1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)), mrope_section=section)
    raw = torch.randn(1, 2, 5, 16)
    # positions below ~300 keep fp32 angle rounding (the reference itself) under the tolerance
    old = torch.randint(0, 300, (spec.axes, 5)).float()
    new = torch.randint(0, 50, (spec.axes, 5)).float()
    at_old = apply_rotary(raw, *spec.cos_sin(old, torch.float32))
    at_new = apply_rotary(raw, *spec.cos_sin(new, torch.float32))
    moved = rotate_by_delta(at_old, spec, new - old)
    torch.testing.assert_close(moved, at_new, atol=2e-5, rtol=0)


def test_compact_1d_counts_from_zero():
    assert sequential_positions(4).tolist() == [[0.0, 1.0, 2.0, 3.0]]


def test_compact_shift_keeps_each_chunk_geometry():
    # prefix of 2; chunk 5 kept its two temporal rows t=18, 26 (t stride 8), h/w = o + (0, 1);
    # a summary token at (40, 40, 40) after it.
    old = torch.tensor([
        [0, 1, 18, 18, 26, 26, 40],
        [0, 1, 10, 11, 10, 11, 40],
        [0, 1, 10, 10, 11, 11, 40],
    ]).float()
    groups = torch.tensor([-1, -1, 5, 5, 5, 5, -9])
    new = shift_positions(old, groups, prefix_len=2)
    # chunk: min over axes 10 -> starts at 2: delta -8 on every axis
    assert new[:, 2:6].tolist() == [[10, 10, 18, 18], [2, 3, 2, 3], [2, 2, 3, 3]]
    # summary: next start = max(chunk) + 1 = 19
    assert new[:, 6].tolist() == [19, 19, 19]
    assert new[:, :2].tolist() == old[:, :2].tolist()
