"""A chunk's tokens through the decoder over the cache, in blocks (docs/performance.md, "Prefill in
blocks").

A chunk of camera frames is a thousand tokens or more (1568 for 8 LLaVA-OneVision frames). In one
forward, the decoder's activations for all of them exist at once: the MLP's intermediate states,
attention's mask and output, hundreds of MiB in float32, more than a bounded cache holds. Here the
chunk goes through the decoder at most ``block_tokens`` tokens at a time. The policy stores a
block's keys and values before the block attends, so each block attends to the cache, to the
blocks before it and causally to itself (bottom-right, cache/attention.py): the attention of one
forward, the same numbers up to floating-point summation order.

What the policy sees of a chunk is unchanged. ``after_prefill`` runs once per step: after the whole
chunk, or after each stream unit for a policy that evicts between units
(``CachePolicy.prefill_unit_by_unit``, H2SVC's frame-by-frame arrival). A block never spans two
steps, and every block of a step carries the step's first unit (``NewTokens.first_unit``), so a
policy that hides tokens by the unit arriving (H2SVC's FIFO windows) hides the same ones in every
block. No block compresses: ``after_chunk`` stays the session's, once per chunk.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..adapters.base import ModelAdapter
from ..cache import CachePolicy, NewTokens


def prefill_steps(total: int, tokens_per_unit: int, unit_by_unit: bool, block_tokens: int) -> list[list[slice]]:
    """The forwards of a chunk of ``total`` tokens, grouped by step (``after_prefill`` after each
    group): one step, or one per unit of ``tokens_per_unit`` tokens; each step cut into blocks of
    at most ``block_tokens`` tokens (0: a step is one forward)."""
    step = tokens_per_unit if unit_by_unit else total
    steps = []
    for first in range(0, total, step):
        end = min(first + step, total)
        size = block_tokens if block_tokens > 0 else end - first
        steps.append([slice(start, min(start + size, end)) for start in range(first, end, size)])
    return steps


def prefill_chunk(adapter: ModelAdapter, policy: CachePolicy, embeds: torch.Tensor, chunk: NewTokens,
                  tokens_per_unit: int, block_tokens: int = 0, layer_hook: Callable | None = None,
                  observe: Callable | None = None) -> int:
    """Prefill ``embeds`` [Q, hidden], the tokens ``chunk`` describes (positions relative to the
    chunk's start), through ``policy``; returns the forwards run.

    A forward places its tokens at the policy's next offset on the chunk's clock (max + 1 of what
    that clock holds, cache/clocks.py), so each block's positions are rebased on the blocks before
    it: together they take the chunk's own."""
    rel = chunk.rel_positions
    forwards = 0
    for blocks in prefill_steps(rel.shape[1], tokens_per_unit, policy.prefill_unit_by_unit, block_tokens):
        step = slice(blocks[0].start, blocks[-1].stop)
        video = chunk.units[step][chunk.units[step] >= 0]
        first_unit = int(video.min()) if video.numel() else None
        for part in blocks:
            new = NewTokens(rel[:, part] - _offset(rel, part.start), chunk.units[part], chunk.chunks[part],
                            clock=chunk.clock, first_unit=first_unit)
            adapter.forward(embeds[None, part], new, policy, layer_hook=layer_hook, observe=observe)
            forwards += 1
        policy.after_prefill(NewTokens(rel[:, step] - _offset(rel, step.start), chunk.units[step], chunk.chunks[step],
                                       clock=chunk.clock, first_unit=first_unit))
    return forwards


def _offset(rel: torch.Tensor, start: int) -> torch.Tensor | float:
    """What the policy's next offset has moved by once the chunk's first ``start`` tokens are in:
    their largest position over every axis, + 1."""
    return rel[:, :start].max() + 1 if start else 0.0
