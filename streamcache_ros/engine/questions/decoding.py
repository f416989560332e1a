"""Greedy decoding from the cache: a question's tokens prefilled, then the answer one token at a time,
streamed and cancellable between tokens. The caller removes the tokens again (policy.truncate)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..adapters import ModelAdapter
from ..cache import CachePolicy

REPLACEMENT_CHARACTER = "\ufffd"  # what a piece of text that ends inside a multi-byte character decodes to


@dataclass
class Decoded:
    tokens: list[int]
    ttft_ms: float
    cancelled: bool


@torch.inference_mode()
def greedy_decode(adapter: ModelAdapter, policy: CachePolicy, ids: list[int], budget: int, started: float,
                  key_filter: torch.Tensor | None = None, on_text: Callable[[str, str], None] | None = None,
                  should_stop: Callable[[], bool] | None = None, repetition_penalty: float = 1.0,
                  layer_hook: Callable[[int], None] | None = None, clock: int | None = None) -> Decoded:
    """Prefill ``ids`` over the cache and decode up to ``budget`` tokens. ``on_text(partial, new)``
    streams the answer; ``should_stop()`` cancels before a token; TTFT is taken from ``started``
    (time.perf_counter() when the question arrived). ``clock``: the camera clock the question is
    on (its positions follow that camera's, cache/clocks.py); None: after every position held."""
    hidden = adapter.forward(adapter.embed_text(ids), adapter.text_tokens(len(ids), clock=clock), policy, key_filter,
                             layer_hook)
    logits = adapter.logits(hidden[0, -1])
    out: list[int] = []
    ttft = 0.0
    text = ""
    for step in range(budget):
        if should_stop is not None and should_stop():
            return Decoded(out, ttft, True)
        token = pick_token(logits, out, repetition_penalty)
        if step == 0:
            ttft = (time.perf_counter() - started) * 1e3
        if token in adapter.stop_ids:
            break
        out.append(token)
        if on_text is not None:
            partial = adapter.decode(out)
            # byte-level BPE: hold back a piece that ends inside a multi-byte character
            if len(partial) > len(text) and not partial.endswith(REPLACEMENT_CHARACTER):
                on_text(partial, partial[len(text):])
                text = partial
        if step + 1 < budget:
            hidden = adapter.forward(adapter.embed_text([token]), adapter.text_tokens(1, clock=clock), policy,
                                     key_filter, layer_hook)
            logits = adapter.logits(hidden[0, -1])
    if on_text is not None:
        final = adapter.decode(out)
        if len(final) > len(text) and final.startswith(text):
            on_text(final, final[len(text):])  # whatever was held back
    return Decoded(out, ttft, False)


def pick_token(logits: torch.Tensor, previous: list[int], penalty: float = 1.0) -> int:
    """The greedy choice, after the repetition penalty (docs/hermes.md §11: negative logits of tokens
    already said are multiplied, positive ones divided)."""
    if penalty != 1.0 and previous:
        logits = logits.clone()
        seen = torch.tensor(sorted(set(previous)), device=logits.device)
        picked = logits[seen]
        logits[seen] = torch.where(picked < 0, picked * penalty, picked / penalty)
    return int(torch.argmax(logits).item())
