"""Attention over a cache with bottom-right causal alignment, against a dense per-query loop."""
import math

import pytest
import torch

from streamcache_ros.engine.cache.attention import bottom_right_causal_mask, cached_attention


def dense_reference(q, k, v, visible):
    """Plain softmax per (head, query): visible[i][j] says query i may see key j."""
    hq, hkv = q.shape[1], k.shape[1]
    out = torch.zeros_like(q)
    for h in range(hq):
        kv = h // (hq // hkv)
        for i in range(q.shape[2]):
            cols = [j for j in range(k.shape[2]) if visible[i][j]]
            logits = torch.stack([q[0, h, i] @ k[0, kv, j] for j in cols]) / math.sqrt(q.shape[-1])
            w = torch.softmax(logits, 0)
            out[0, h, i] = sum(w[n] * v[0, kv, j] for n, j in enumerate(cols))
    return out


def test_mask_is_bottom_right():
    assert bottom_right_causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_cached_attention_matches_dense_with_gqa():
    torch.manual_seed(0)
    q = torch.randn(1, 4, 3, 8)
    k, v = torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    visible = [[j <= 4 + i for j in range(7)] for i in range(3)]
    torch.testing.assert_close(cached_attention(q, k, v), dense_reference(q, k, v, visible), atol=1e-5, rtol=0)


def test_key_mask_hides_cached_keys_only():
    torch.manual_seed(1)
    q = torch.randn(1, 2, 2, 8)
    k, v = torch.randn(1, 1, 6, 8), torch.randn(1, 1, 6, 8)
    key_mask = torch.tensor([True, False, True, False, True, True])
    visible = [[key_mask[j].item() and j <= 4 + i for j in range(6)] for i in range(2)]
    out = cached_attention(q, k, v, key_mask=key_mask)
    torch.testing.assert_close(out, dense_reference(q, k, v, visible), atol=1e-5, rtol=0)


def test_single_query_sees_everything():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    torch.testing.assert_close(cached_attention(q, k, v), dense_reference(q, k, v, [[True] * 5]), atol=1e-5, rtol=0)


def test_on_a_cpu_the_split_at_the_cache_equals_the_masked_softmax(monkeypatch):
    # 14 query heads on 2 KV heads, 37 new tokens after 263 cached ones: merged by log-sum-exp
    # (cached_then_causal) against SDPA with the bottom-right mask, which a key mask still takes
    from streamcache_ros.engine.cache import attention

    kernel = attention.cpu_attention_with_lse()
    if kernel is None:
        pytest.skip("this PyTorch has no CPU attention kernel returning the log-sum-exp")
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 14, 37, 16, generator=gen)
    k, v = torch.randn(1, 2, 300, 16, generator=gen), torch.randn(1, 2, 300, 16, generator=gen)
    calls = []
    monkeypatch.setattr(attention, "cpu_attention_with_lse", lambda: lambda *a: calls.append(1) or kernel(*a))
    split = cached_attention(q, k, v)
    assert len(calls) == 2  # the cache, then the new tokens
    masked = cached_attention(q, k, v, key_mask=torch.ones(300, dtype=torch.bool))
    assert len(calls) == 2
    torch.testing.assert_close(split, masked, atol=1e-6, rtol=0)
    monkeypatch.setattr(attention, "cpu_attention_with_lse", lambda: None)  # a PyTorch without the kernel
    torch.testing.assert_close(cached_attention(q, k, v), masked, atol=1e-6, rtol=0)


def test_rowwise_attention_equals_the_dense_masked_pass():
    """Each row over only the keys it may see gives what one masked pass over every key gives, for
    GQA heads, rows that see almost nothing and a row that sees every cached key."""
    from streamcache_ros.engine.cache.attention import rowwise_attention  # noqa: PLC0415

    torch.manual_seed(0)
    cached, lengths = 40, [3, 5, 1, 4]
    q_len = sum(lengths)
    q = torch.randn(1, 4, q_len, 8)
    k, v = torch.randn(1, 2, cached + q_len, 8), torch.randn(1, 2, cached + q_len, 8)
    rows = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    windows = [torch.arange(cached) < 3, (torch.arange(cached) >= 10) & (torch.arange(cached) < 14),
               torch.ones(cached, dtype=torch.bool), torch.arange(cached) == 39]
    own = (rows[:, None] == rows[None, :]) & torch.ones(q_len, q_len, dtype=torch.bool).tril()
    mask = torch.cat([torch.stack([windows[r] for r in rows.tolist()]), own], dim=1)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.allclose(rowwise_attention(q, k, v, mask, rows), dense, atol=1e-6)
