"""HERMES's rules as functions on plain tensors, about one per section of docs/hermes.md (§5–§10).

The policy (hermes.py) applies them to its per-layer stores. Each one follows the reference code as
docs/hermes.md describes it, down to the order of operations where that decides ties or rounding, and is
unit-tested on hand-made tensors (test/test_hermes_rules.py).
"""
from __future__ import annotations

import math
import re
from typing import Sequence

import torch
import torch.nn.functional as F

from .rope import RotarySpec, rotate_by_delta

SHALLOW, MID, DEEP = "shallow", "mid", "deep"

# docs/hermes.md §5: the reference's guidance texts
LOCAL_PROMPT = ("Describe the current scene in detail, focusing on specific objects, fine-grained actions, "
                "and spatial relationships.")
GLOBAL_PROMPT = ("Summarize the video narrative, identifying main characters, key events, timeline changes, "
                 "and the overall theme.")
# §5: shallow layers read the local prompt, mid layers the mixed one, deep layers the global one
ROLE_PROMPT = {SHALLOW: "local", MID: "mixed", DEEP: "global"}
_LETTER_ANSWER = re.compile(r"^\s*(?:\()?([A-Z])(?:\))?\.?\s*$")
_OPTION_LABEL = re.compile(r"[A-Z]\) ")


# -- §1 layer roles ------------------------------------------------------------------------------
def layer_split(num_layers: int, shallow_end_ratio: float, deep_start_ratio: float) -> tuple[int, int]:
    """(shallow_end, deep_start) with the reference's truncation: L=28 gives (2, 19)."""
    return int(num_layers * shallow_end_ratio), int(num_layers * deep_start_ratio)


def layer_roles(num_layers: int, shallow_end: int, deep_start: int) -> list[str]:
    # the shallow test comes first, as in the reference, should the two boundaries cross
    return [SHALLOW if layer < shallow_end else DEEP if layer >= deep_start else MID
            for layer in range(num_layers)]


def mid_progress(layer: int, shallow_end: int, deep_start: int) -> float:
    """p = (l − s)/(d − s) for a mid layer: 0 at the first one, never 1 (§7)."""
    return (layer - shallow_end) / (deep_start - shallow_end)


def recency_weight_and_rate(role: str, progress: float, shallow: Sequence[float], mid_omega: Sequence[float],
                            mid_k: Sequence[float], deep: Sequence[float]) -> tuple[float, float]:
    """(ω, k) of one layer (§7). ``shallow`` / ``deep`` are (ω, k); mid layers use
    ω = mid_omega[0] − mid_omega[1]·p and k = mid_k[0] − mid_k[1]·p (LLaVA 1 − 0.9p, 20 − 19.5p;
    Qwen 0.75 − 0.6p, 20 − 12p)."""
    if role == SHALLOW:
        return float(shallow[0]), float(shallow[1])
    if role == DEEP:
        return float(deep[0]), float(deep[1])
    return mid_omega[0] - mid_omega[1] * progress, mid_k[0] - mid_k[1] * progress


# -- §5 guidance prompts -------------------------------------------------------------------------
def guidance_prompts(history: Sequence, local_text: str = LOCAL_PROMPT,
                     global_text: str = GLOBAL_PROMPT) -> dict[str, str]:
    """The local, global and mixed prompts; only the last exchange (question, answer, options) counts."""
    if history:
        last = history[-1]
        answer, options = last.answer, list(last.options or [])
        letter = _LETTER_ANSWER.match(answer)
        if letter and 0 <= ord(letter.group(1)) - ord("A") < len(options):
            answer = options[ord(letter.group(1)) - ord("A")]  # a bare letter becomes its option text
        answer = _OPTION_LABEL.sub("", answer)
        exchange = f"Question: {last.question} Answer: {answer}"
        local_text = f"Find recent details related to: {exchange}. {local_text}"
        global_text = f"Context summary: {exchange}. {global_text}"
    return {"local": local_text, "global": global_text, "mixed": local_text + "; " + global_text}


# -- §6 guidance attention -----------------------------------------------------------------------
# Logit elements computed at once in a guidance pass: its extra memory is about three float32
# temporaries of this size whatever the prompt and cache lengths, instead of heads x prompt x cache
# (136 MiB at the Qwen2.5-VL-3B shape; docs/performance.md "Real widths").
GUIDANCE_BLOCK_ELEMENTS = 1 << 20


def guidance_attention(q: torch.Tensor, guidance_keys: torch.Tensor, cache_keys: torch.Tensor, prefix_len: int,
                       softmax_dtype: torch.dtype = torch.float32,
                       weights_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Pooled attention of the guidance queries on each cached candidate: [T − P].

    q [1, Hq, Q, D] and guidance_keys [1, Hkv, Q, D] are already rotated at the guidance positions;
    cache_keys [1, Hkv, T, D]. W = softmax(q·[K_cache; K_guid]ᵀ/√D) with no causal mask among the
    guidance tokens (D4), then: mean over query heads, drop the prefix and guidance-key columns, mean
    over guidance tokens. Logits are float32; ``softmax_dtype`` / ``weights_dtype`` let the caller
    round where the reference rounds (LLaVA: softmax fp32 then cast; Qwen: cast, then softmax).

    Each row of W (one query head, one guidance token) is a softmax of its own, and the result is the
    mean of all rows: in float32 the rows are taken a block at a time (``GUIDANCE_BLOCK_ELEMENTS``)
    and summed. Rounded like the reference, the whole matrix is made as the reference makes it, so
    that its two rounded means are the reference's.
    """
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, cached = cache_keys.shape[1], cache_keys.shape[2]
    # GQA as repeat_interleave: query head h reads kv head h // group, so the group's queries are
    # stacked per kv head and meet its keys in one matrix product (no copy of the cache)
    stacked = q.float().reshape(batch, kv_heads, (q_heads // kv_heads) * q_len, head_dim)
    cache_t, guidance_t = cache_keys.float().transpose(-1, -2), guidance_keys.float().transpose(-1, -2)
    if weights_dtype != torch.float32 or softmax_dtype != torch.float32:
        logits = torch.cat((stacked @ cache_t, stacked @ guidance_t), dim=-1) / math.sqrt(head_dim)
        weights = torch.softmax(logits.to(softmax_dtype), dim=-1).to(weights_dtype)
        weights = weights.reshape(batch, q_heads, q_len, cached + q_len)
        return weights[0].mean(dim=0)[:, prefix_len:cached].mean(dim=0)
    stacked = stacked / math.sqrt(head_dim)  # 1/√D on the queries, not on every logit
    step = max(1, GUIDANCE_BLOCK_ELEMENTS // (kv_heads * (cached + q_len)))
    total = torch.zeros(cached - prefix_len, dtype=torch.float32, device=q.device)
    for start in range(0, stacked.shape[2], step):
        total += _row_softmax_column_sums(stacked[:, :, start:start + step], cache_t, guidance_t, prefix_len)
    return total / (q_heads * q_len)


def _row_softmax_column_sums(rows: torch.Tensor, cache_t: torch.Tensor, guidance_t: torch.Tensor,
                             prefix_len: int) -> torch.Tensor:
    """Σ over ``rows`` (queries already divided by √D) of softmax(row · [K_cache; K_guid]ᵀ), the
    candidate columns only. The softmax is not materialised: exp(l − max) in place, then
    Σ_rows exp / Z as one product with 1/Z, so a block costs its logits and nothing more (no
    concatenation, no normalised copy)."""
    on_cache, on_guidance = rows @ cache_t, rows @ guidance_t
    top = torch.maximum(on_cache.amax(dim=-1, keepdim=True), on_guidance.amax(dim=-1, keepdim=True))
    on_cache.sub_(top).exp_()
    on_guidance.sub_(top).exp_()
    inverse_z = 1.0 / (on_cache.sum(dim=-1) + on_guidance.sum(dim=-1))  # [1, Hkv, rows]
    return (inverse_z.unsqueeze(-2) @ on_cache[..., prefix_len:]).sum(dim=(0, 1, 2))


# -- §7 raw scores -------------------------------------------------------------------------------
def recency_norm(count: int, k: float, eps: float = 1e-6, device=None) -> torch.Tensor:
    """minmax(exp(−k·dist)) with dist = (N−1−i)/max(N−1, 1): the age is the rank among the current
    candidates, oldest first (D7), not time. k = 0 gives all zeros."""
    index = torch.arange(count, device=device, dtype=torch.float32)
    distance = (count - 1 - index) / max(count - 1, 1)
    recency = torch.exp(-k * distance)
    return (recency - recency.min()) / (recency.max() - recency.min() + eps)


def raw_scores(attention: torch.Tensor, omega: float, k: float, eps: float = 1e-6) -> torch.Tensor:
    """S = (1 − ω)·minmax(attention) + ω·recency_norm (§7)."""
    if attention.shape[0] == 0:
        return torch.empty(0, device=attention.device)
    attn_norm = (attention - attention.min()) / (attention.max() - attention.min() + eps)
    return attn_norm * (1 - omega) + recency_norm(attention.shape[0], k, eps, attention.device) * omega


# -- §8 cross-layer smoothing --------------------------------------------------------------------
def interpolate_linear(scores: torch.Tensor, size: int) -> torch.Tensor:
    """Resample [n] scores to [size] (PyTorch linear, align_corners=False)."""
    if scores.shape[0] == size:
        return scores
    return F.interpolate(scores.view(1, 1, -1), size=size, mode="linear", align_corners=False).view(-1)


def smooth_scores(raw: Sequence[torch.Tensor], roles: Sequence[str], lambdas: dict[str, float]) -> list[torch.Tensor]:
    """§8: from the second-deepest layer up, refined_i = (1−γ)·raw_i + γ·refined_{i+1}, γ by the role
    of layer i; the deepest layer stays raw. The blend cascades: a deep score reaches every shallower layer."""
    refined = [r.clone() for r in raw]
    for i in range(len(raw) - 2, -1, -1):
        gamma = lambdas[roles[i]]
        deeper = refined[i + 1]
        if deeper.shape[0] != raw[i].shape[0]:
            if deeper.shape[0] == 0 or raw[i].shape[0] == 0:
                continue  # nothing to blend with
            deeper = interpolate_linear(deeper, raw[i].shape[0])  # never with uniform budgets (§8)
        refined[i] = (1 - gamma) * raw[i] + gamma * deeper
    return refined


# -- §9 selection --------------------------------------------------------------------------------
def layer_budget(role: str, budget: int, candidates: int, summary: bool = True) -> int:
    """Video slots a layer keeps: M, or M − 1 in deep layers (one goes to the summary), capped at N."""
    slots = max(0, budget - 1) if role == DEEP and summary else budget
    return min(slots, candidates)


def keep_indices(refined: torch.Tensor, slots: int, prefix_len: int) -> torch.Tensor:
    """[0..P−1] ++ sort(top-``slots`` of refined + P): the prefix is kept on top of the slots."""
    top = torch.topk(refined, slots, sorted=False).indices + prefix_len
    prefix = torch.arange(prefix_len, device=refined.device)
    return torch.cat((prefix, torch.sort(top).values))


def frame_keep_indices(refined: torch.Tensor, units: torch.Tensor, slots: int, prefix_len: int) -> torch.Tensor:
    """Selection by frames (docs/hermes.md "Selection by frames"): the candidates' stream units
    ranked by the mean refined score of their tokens, whole units kept best first while they fit in
    ``slots``; the slots left are the best remaining tokens, so a layer keeps as many tokens as
    ``keep_indices`` would. Same output form: the prefix, then the kept candidates + P, sorted."""
    count = refined.numel()
    if slots >= count:
        return torch.arange(prefix_len + count, device=refined.device)
    ids, inverse, sizes = torch.unique(units, return_inverse=True, return_counts=True)
    means = torch.zeros(len(ids), dtype=torch.float64, device=refined.device)
    means.index_add_(0, inverse, refined.to(torch.float64))
    means /= sizes
    chosen = torch.zeros(count, dtype=torch.bool, device=refined.device)
    left = slots
    for unit in torch.argsort(means, descending=True, stable=True).tolist():
        if left == 0:
            break
        size = int(sizes[unit])
        if size <= left:
            chosen |= inverse == unit
            left -= size
    if left:  # no whole unit fits what is left: the best single tokens fill it
        rest = refined.masked_fill(chosen, float("-inf"))
        chosen[torch.topk(rest, left, sorted=False).indices] = True
    kept = torch.nonzero(chosen).flatten() + prefix_len
    return torch.cat((torch.arange(prefix_len, device=refined.device), kept))


def sanitize_keep(indices: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Clip to [0, seq_len), unique and sorted; an empty result keeps token 0 (reference)."""
    indices = indices.to(torch.long)
    if indices.numel() and bool((indices[1:] > indices[:-1]).all()) and 0 <= indices[0] and indices[-1] < seq_len:
        return indices  # already so (keep_indices' output): no sort
    indices = indices[(indices >= 0) & (indices < seq_len)]
    if indices.numel() == 0:
        return torch.zeros(1, dtype=torch.long, device=indices.device)
    return torch.unique(indices, sorted=True)


def pruned_indices(keep: torch.Tensor, seq_len: int) -> torch.Tensor:
    mask = torch.ones(seq_len, dtype=torch.bool, device=keep.device)
    mask[keep] = False
    return torch.nonzero(mask).flatten()


# -- §10 summary token and re-indexing -----------------------------------------------------------
def summary_token(keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, pruned: torch.Tensor,
                  target: float, rotary: RotarySpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The deep-layer summary of the pruned tokens: V = mean of their values; K = mean of their keys,
    each first rotated from its own position to ``target`` (§10.1/10.2). Returns [1, H, 1, D] each."""
    moved = rotate_by_delta(keys.index_select(2, pruned).float(), rotary,
                            target - positions.index_select(1, pruned))
    key = moved.mean(dim=2, keepdim=True).to(keys.dtype)
    value = values.index_select(2, pruned).float().mean(dim=2, keepdim=True).to(values.dtype)
    return key, value

