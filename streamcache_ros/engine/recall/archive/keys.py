"""Retrieval keys: what recall ranks archived chunks by, as ReKV does, on plain tensors.

A chunk's key is, at each retrieval layer, the mean of each unit's keys per KV head, taken before
the rotary embedding so that a chunk's place in the stream does not change its key. A question's
vector is the mean of its tokens' queries at the same layers, each KV head's group of query heads
averaged. Relevance is the scaled dot product of the two, averaged over layers and heads, at the
unit that matches best (docs/archive.md "Recall": how well this ranks on the bundled models).
"""
from __future__ import annotations

import numpy as np
import torch


def unit_keys(k: torch.Tensor, units: torch.Tensor) -> dict[int, torch.Tensor]:
    """Per stream unit among ``units`` [Q], the mean over its tokens of ``k`` [1, kv_heads, Q, d]:
    {unit: [kv_heads, d]} (text tokens, unit < 0, are left out)."""
    out = {}
    for unit in units.unique().tolist():
        if unit >= 0:
            out[int(unit)] = k[0][:, units == unit].float().mean(dim=1).cpu()
    return out


def chunk_key(per_layer: list[dict[int, torch.Tensor]]) -> np.ndarray:
    """One chunk's key [layers, units, kv_heads, d] from ``unit_keys`` of each retrieval layer."""
    units = sorted(per_layer[0])
    return np.stack([np.stack([layer[u].numpy() for u in units]) for layer in per_layer]).astype(np.float16)


def question_vector(per_layer_q: list[torch.Tensor], kv_heads: int) -> np.ndarray:
    """[layers, kv_heads, d] from each retrieval layer's queries [1, heads, T, d]: the mean over
    the question's tokens, each KV head's query group averaged (grouped-query attention)."""
    out = []
    for q in per_layer_q:
        mean = q[0].float().mean(dim=1)  # [heads, d]
        out.append(mean.view(kv_heads, mean.shape[0] // kv_heads, -1).mean(dim=1).cpu().numpy())
    return np.stack(out)


def relevance(question: np.ndarray, keys: list[np.ndarray]) -> np.ndarray:
    """Per chunk key [layers, units, kv_heads, d], the best unit's mean scaled dot product with
    ``question`` [layers, kv_heads, d]; each layer's scores are standardised over the chunks first,
    so that no layer's scale dominates. Keys of one shape are scored together, as one matrix
    product: a day holds some ten thousand chunks, and a question must not walk them one by one."""
    if not keys:
        return np.zeros(0)
    d = question.shape[-1]
    scores = np.zeros((question.shape[0], len(keys)))
    by_shape: dict[tuple, list[int]] = {}
    for i, key in enumerate(keys):
        by_shape.setdefault(key.shape, []).append(i)
    q = question.astype(np.float32)
    for indices in by_shape.values():
        stacked = np.stack([keys[i] for i in indices]).astype(np.float32)  # [n, layers, units, heads, d]
        per_unit = np.einsum("nluhd,lhd->nlu", stacked, q) / (q.shape[1] * np.sqrt(d))  # mean over heads
        scores[:, indices] = per_unit.max(axis=2).T
    spread = scores.std(axis=1, keepdims=True)
    standard = (scores - scores.mean(axis=1, keepdims=True)) / np.where(spread > 0, spread, 1.0)
    return standard.mean(axis=0)
