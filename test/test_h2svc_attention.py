"""Attention over banks of different lengths (docs/h2svc.md §4, TC10): option A (SDPA per bank with a
bottom-right mask), option B (varlen packing, run here with a reference kernel because flash-attn
needs CUDA) and a dense reference that pads every head to the longest bank with -inf."""
import math

import pytest
import torch

from streamcache_ros.engine.cache.attention import bottom_right_causal_mask, cached_attention, varlen_attention

P, NF, D, G = 3, 5, 16, 7  # prefix, tokens per frame, head dim, query heads per KV head (as 7B models)


def padded_dense_reference(q, banks):
    """Every head padded to T_max; padding and future keys get -inf; plain softmax in float64."""
    q_len = q.shape[2]
    t_max = max(k.shape[0] for k, _ in banks)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for g, (k, v) in enumerate(banks):
        t = k.shape[0]
        kp = torch.zeros(t_max, D, dtype=torch.float64)
        vp = torch.zeros(t_max, D, dtype=torch.float64)
        kp[:t], vp[:t] = k, v
        for h in range(g * G, (g + 1) * G):
            logits = q[0, h].double() @ kp.T / math.sqrt(D)  # [Q, T_max]
            allowed = torch.zeros(q_len, t_max, dtype=torch.bool)
            allowed[:, :t] = bottom_right_causal_mask(q_len, t)
            out[0, h] = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ vp
    return out


def reference_varlen_kernel(q, k, v, cu_q, cu_k, max_q, max_k, causal=True):
    """flash_attn_varlen_func's documented semantics, in torch: each sequence on its own, causal
    aligned bottom-right, GQA by head count."""
    assert causal and q.dtype == k.dtype and cu_q.dtype == cu_k.dtype == torch.int32
    out = torch.empty_like(q)
    for s in range(cu_q.numel() - 1):
        qs = q[cu_q[s]:cu_q[s + 1]].transpose(0, 1)[None]  # [1, G, Q, D]
        ks, vs = k[cu_k[s]:cu_k[s + 1]].transpose(0, 1)[None], v[cu_k[s]:cu_k[s + 1]].transpose(0, 1)[None]
        assert qs.shape[2] <= max_q and ks.shape[2] <= max_k
        out[cu_q[s]:cu_q[s + 1]] = cached_attention(qs, ks, vs)[0].transpose(0, 1)
    return out


def random_banks(q_len, frames=(4, 16, 64)):
    """Three KV heads' caches of P + W·n_f tokens (the new Q tokens are the last of each)."""
    return [(torch.randn(P + w * NF, D), torch.randn(P + w * NF, D)) for w in frames]


def option_a(q, banks):
    """One SDPA call per bank (here one KV head per bank), outputs concatenated by head."""
    outs = [cached_attention(q[:, g * G:(g + 1) * G], k[None, None], v[None, None]) for g, (k, v) in enumerate(banks)]
    return torch.cat(outs, dim=1)


def option_b(q, banks):
    """All heads in one varlen call: heads padded into one tensor, the mask says each head's length."""
    t_max = max(k.shape[0] for k, _ in banks)
    keys, values = torch.zeros(1, len(banks), t_max, D), torch.zeros(1, len(banks), t_max, D)
    mask = torch.zeros(len(banks), t_max, dtype=torch.bool)
    for g, (k, v) in enumerate(banks):
        # the queries' own keys must end each sequence: place each head's keys at the end of its row
        keys[0, g, t_max - k.shape[0]:], values[0, g, t_max - k.shape[0]:] = k, v
        mask[g, t_max - k.shape[0]:] = True
    return varlen_attention(q, keys, values, mask, kernel=reference_varlen_kernel)


@pytest.mark.parametrize("q_len", [1, NF])
def test_tc10_option_a_equals_option_b_equals_padded_dense(q_len):
    torch.manual_seed(q_len)
    banks = random_banks(q_len)
    q = torch.randn(1, G * len(banks), q_len, D)
    reference = padded_dense_reference(q, banks).float()
    torch.testing.assert_close(option_a(q, banks), reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(option_b(q, banks), reference, atol=1e-5, rtol=0)


def test_one_sdpa_call_with_a_mask_per_kv_head_equals_the_reference():
    """A bank whose heads hold different keys (episodic heads after different evictions)."""
    torch.manual_seed(7)
    t, q_len = P + 6 * NF, NF
    q = torch.randn(1, 3 * G, q_len, D)
    k, v = torch.randn(1, 3, t, D), torch.randn(1, 3, t, D)
    mask = torch.ones(3, t, dtype=torch.bool)
    mask[0, P:P + NF] = False  # head 0 lost frame 1, head 2 frame 3, head 1 nothing
    mask[2, P + 3 * NF:P + 4 * NF] = False
    banks = [(k[0, g][mask[g]], v[0, g][mask[g]]) for g in range(3)]
    reference = padded_dense_reference(q, banks).float()
    torch.testing.assert_close(cached_attention(q, k, v, key_mask=mask), reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(varlen_attention(q, k, v, mask, kernel=reference_varlen_kernel), reference,
                               atol=1e-5, rtol=0)


def test_varlen_without_a_mask_packs_every_key():
    torch.manual_seed(8)
    q = torch.randn(1, 2 * G, 2, D)
    k, v = torch.randn(1, 2, 9, D), torch.randn(1, 2, 9, D)
    torch.testing.assert_close(varlen_attention(q, k, v, None, kernel=reference_varlen_kernel),
                               cached_attention(q, k, v), atol=1e-6, rtol=0)


def test_varlen_without_flash_attn_says_so(monkeypatch):
    import streamcache_ros.engine.cache.attention as attention

    monkeypatch.setattr(attention, "flash_attn_varlen_func", lambda: None)
    with pytest.raises(RuntimeError, match="flash-attn is not installed"):
        varlen_attention(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cannot run here: flash-attn needs a CUDA GPU")
def test_flash_varlen_kernel_matches_the_reference_on_cuda():
    attention = pytest.importorskip("flash_attn", reason="cannot run here: flash-attn is not installed")
    del attention
    torch.manual_seed(9)
    banks = [(k.cuda().half(), v.cuda().half()) for k, v in random_banks(NF)]
    q = torch.randn(1, G * 3, NF, D).cuda().half()
    t_max = max(k.shape[0] for k, _ in banks)
    keys = torch.zeros(1, 3, t_max, D, device="cuda", dtype=torch.half)
    values, mask = keys.clone(), torch.zeros(3, t_max, dtype=torch.bool, device="cuda")
    for g, (k, v) in enumerate(banks):
        keys[0, g, t_max - k.shape[0]:], values[0, g, t_max - k.shape[0]:] = k, v
        mask[g, t_max - k.shape[0]:] = True
    ours = varlen_attention(q, keys, values, mask)
    reference = padded_dense_reference(q.float().cpu(), [(k.float().cpu(), v.float().cpu()) for k, v in banks])
    torch.testing.assert_close(ours.float().cpu(), reference.float(), atol=2e-3, rtol=0)
