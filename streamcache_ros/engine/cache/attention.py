"""Attention over a cache whose newest keys are the queries' own tokens.

Queries are the last Q tokens of a key sequence of length T >= Q, so causality is aligned
bottom-right: query i sees keys 0 .. T-Q+i. PyTorch SDPA's ``is_causal`` aligns top-left, which is
wrong for cached prefill and decode, so an explicit mask is built (docs/h2svc.md §4).

On a CPU, where SDPA turns that mask into a float tensor of Q x T (30 KiB a query over 7 600 keys)
and runs small query blocks slowly, several queries over a cache with no hidden key are computed
as two softmaxes merged by their log-sum-exp instead (``cached_then_causal``): over the T - Q cached
keys, which every query sees, and causally over the Q new ones (docs/performance.md, "Prefill in
blocks").
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=1)
def flash_attn_func():
    """flash_attn.flash_attn_func when flash-attn is installed (CUDA machines), else None."""
    try:
        from flash_attn import flash_attn_func as fn  # noqa: PLC0415
    except Exception:  # ImportError, or a CUDA/ABI mismatch raised at import
        return None
    return fn


@functools.lru_cache(maxsize=1)
def cpu_attention_with_lse():
    """PyTorch's CPU flash-attention kernel, which also returns each query's log-sum-exp (an ATen op
    of PyTorch >= 2.3, not a public API), or None where this PyTorch has none."""
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@functools.lru_cache(maxsize=1)
def flash_attn_varlen_func():
    """flash_attn.flash_attn_varlen_func when flash-attn is installed, else None."""
    try:
        from flash_attn import flash_attn_varlen_func as fn  # noqa: PLC0415
    except Exception:
        return None
    return fn


def resolve_backend(requested: str, device: torch.device) -> str:
    """'auto' picks flash-attn on CUDA when it imports, else SDPA."""
    if requested not in ("auto", "sdpa", "flash"):
        raise ValueError(f"unknown attention backend '{requested}' (auto|sdpa|flash)")
    if requested == "sdpa":
        return "sdpa"
    available = device.type == "cuda" and flash_attn_func() is not None
    if requested == "flash" and not available:
        raise ValueError("attention backend 'flash' needs CUDA and the flash-attn package")
    return "flash" if available else "sdpa"


def bottom_right_causal_mask(q_len: int, k_len: int, device=None) -> torch.Tensor:
    """[Q, T] bool: True where query i may attend to key j (j <= T - Q + i)."""
    rows = torch.arange(q_len, device=device)[:, None]
    cols = torch.arange(k_len, device=device)[None, :]
    return cols <= rows + (k_len - q_len)


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    backend: str = "sdpa",
    query_mask: torch.Tensor | None = None,
    query_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, Hq, Q, D]; k, v [B, Hkv, T, D] with Hq a multiple of Hkv -> [B, Hq, Q, D].

    ``key_mask`` [T] bool, or [Hkv, T] for a mask per KV head (optional), hides cached keys (e.g.
    another camera's frames); the queries' own tokens must stay visible. ``query_mask`` [Q, T] or
    [Hkv, Q, T] replaces the causal mask with one per query (several questions in one pass,
    rows.QueryRows); it already holds every key mask. ``query_rows`` [Q] (the row of each query,
    rows contiguous) lets each row attend to the keys it may see alone (``rowwise_attention``).
    """
    if query_mask is not None:
        mask = query_mask.to(q.device)
        if mask.dim() == 3:
            mask = mask.repeat_interleave(q.shape[1] // mask.shape[0], dim=0)[None]
        if query_rows is not None and int(query_rows[-1]) > 0:
            return rowwise_attention(q, k, v, mask, query_rows)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    q_len, k_len = q.shape[2], k.shape[2]
    if backend == "flash" and key_mask is None and q.is_cuda:
        # flash-attn >= 2.1 aligns its causal mask bottom-right; layout [B, T, H, D]; GQA native
        out = flash_attn_func()(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return out.transpose(1, 2)
    if key_mask is None and 1 < q_len < k_len and q.device.type == "cpu" and cpu_attention_with_lse() is not None:
        return cached_then_causal(q, k, v, cpu_attention_with_lse())
    mask = None
    if q_len > 1 or key_mask is not None:
        mask = bottom_right_causal_mask(q_len, k_len, q.device)
        if key_mask is not None and key_mask.dim() == 2:
            # one row per KV head, shared by the query heads of its group
            per_head = mask[None] & key_mask.to(q.device)[:, None, :]
            mask = per_head.repeat_interleave(q.shape[1] // key_mask.shape[0], dim=0)[None]
        elif key_mask is not None:
            mask = mask & key_mask.to(q.device)[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def cached_then_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel) -> torch.Tensor:
    """``cached_attention`` with no key hidden, as two softmaxes merged by their log-sum-exp: the Q
    queries over the T - Q cached keys, all visible, then over the Q new keys, causally (a square:
    top-left is bottom-right). In the first, a KV head's query heads are stacked along the query
    axis (GQA without copying the cache): G·Q queries and no mask, so the kernel takes the large
    query blocks it takes for a whole chunk however short the block (engine/ingest/prefill.py).
    ``kernel(q, k, v, dropout, is_causal) -> (out, lse)``: ``cpu_attention_with_lse``'s signature."""
    batch, q_heads, q_len, dim = q.shape
    kv_heads, cached = k.shape[1], k.shape[2] - q_len
    group = q_heads // kv_heads
    stacked = q.reshape(batch, kv_heads, group * q_len, dim)
    out, lse = kernel(stacked, k[:, :, :cached], v[:, :, :cached], 0.0, False)
    new_k, new_v = k[:, :, cached:], v[:, :, cached:]
    if group > 1:
        new_k, new_v = new_k.repeat_interleave(group, dim=1), new_v.repeat_interleave(group, dim=1)
    out_new, lse_new = kernel(q, new_k, new_v, 0.0, True)
    out, lse = out.reshape(batch, q_heads, q_len, dim).float(), lse.reshape(batch, q_heads, q_len)
    top = torch.maximum(lse, lse_new)
    weight, weight_new = (lse - top).exp_().unsqueeze(-1), (lse_new - top).exp_().unsqueeze(-1)
    merged = out.mul_(weight).add_(out_new.float().mul_(weight_new)).div_(weight.add_(weight_new))
    return merged.to(q.dtype)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
                     kernel=None) -> torch.Tensor:
    """Attention where every KV head is a sequence of its own length (docs/h2svc.md §4, option B).

    q [1, Hq, Q, D]; k, v [1, Hkv, T, D]; ``key_mask`` [Hkv, T] (None: every key) says which keys
    belong to each head's sequence; the queries' own tokens must be the last Q of each. Each head's
    keys are packed back to back and its G query heads ride on the sequence as heads, so one
    ``flash_attn_varlen_func`` call (causal: bottom-right in flash-attn >= 2.1) serves them all.
    ``kernel`` has that function's signature (default: flash-attn's; tests pass a reference).
    """
    kernel = kernel or flash_attn_varlen_func()
    if kernel is None:
        raise RuntimeError("flash-attn is not installed")
    _, hq, q_len, dim = q.shape
    hkv, k_len = k.shape[1], k.shape[2]
    group = hq // hkv
    if key_mask is None:
        lengths = torch.full((hkv,), k_len, dtype=torch.int32, device=k.device)
        k_var, v_var = k[0].reshape(hkv * k_len, 1, dim), v[0].reshape(hkv * k_len, 1, dim)
    else:
        keep = key_mask.to(k.device)
        lengths = keep.sum(dim=1, dtype=torch.int32)
        k_var, v_var = k[0][keep][:, None], v[0][keep][:, None]  # row-major: head by head
    zero = torch.zeros(1, dtype=torch.int32, device=k.device)
    cu_k = torch.cat((zero, lengths.cumsum(0, dtype=torch.int32)))
    cu_q = torch.arange(hkv + 1, dtype=torch.int32, device=q.device) * q_len
    q_var = q[0].reshape(hkv, group, q_len, dim).transpose(1, 2).reshape(hkv * q_len, group, dim)
    out = kernel(q_var, k_var, v_var, cu_q, cu_k, q_len, int(lengths.max()), causal=True)
    return out.reshape(hkv, q_len, group, dim).transpose(1, 2).reshape(1, hq, q_len, dim)


def head_rows_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None,
                        backend: str) -> torch.Tensor:
    """docs/h2svc.md §4: the query heads of a group of KV heads against those heads' rows only
    (option A: SDPA with an explicit bottom-right mask; on CUDA with flash-attn, flash per group,
    or varlen (option B) when the heads see different keys). ``visible`` [Hkv, T] or None."""
    flash = backend == "flash" and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    if flash and visible is not None:
        return varlen_attention(q, k, v, visible)
    return cached_attention(q, k, v, visible, "flash" if flash else "sdpa")


def rowwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      rows: torch.Tensor) -> torch.Tensor:
    """``cached_attention`` with a per-query ``mask`` ([Q, T] or [1, Hq, Q, T]), one row of queries
    at a time over only the keys that row may see: the same softmax (a hidden key weighs nothing
    either way), without the Q x T scores of keys no query of the row sees. The when search asks
    64 short windows of a long memory in one pass; each sees a few dozen of thousands of keys, and
    the dense pass spent three quarters of its time on the rest (docs/performance.md "When")."""
    out = torch.empty_like(q)
    bounds = torch.cumsum(torch.bincount(rows.cpu()), 0).tolist()
    gqa = q.shape[1] != k.shape[1]
    start = 0
    for end in bounds:
        block = mask[..., start:end, :]
        seen = block.reshape(-1, block.shape[-1]).any(0).nonzero().squeeze(1)
        out[:, :, start:end] = F.scaled_dot_product_attention(
            q[:, :, start:end], k[:, :, seen], v[:, :, seen], attn_mask=block[..., seen], enable_gqa=gqa)
        start = end
    return out
