"""Options scored by their likelihood, many questions in one forward pass.

A question with options is answered by the option the model finds most likely after the prompt:
each option's tokens (its words, or its letter in the reference's layout) scored by teacher forcing,
the log-likelihoods renormalised over the options. Unlike free generation, the answer is always one
of the options, with a probability for each (docs/interfaces.md "Options").

Several questions that differ only in what they may see (the ``when`` search: one time window
each) are scored together: every (question, option) needs one row, the prompt followed by the
option's tokens but its last, and identical rows are asked once (single-token options such as
yes / no share one row per question). All rows go through the decoder in one pass over the same
cache, each with its own key mask (cache/rows.py); their tokens are removed again afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..adapters import ModelAdapter
from ..cache import TEXT_UNIT, CachePolicy, NewTokens, QueryRows
from ..stream.layout import text_positions


@dataclass
class Scored:
    """One question's options: log-likelihoods and probabilities (renormalised over the options)."""

    log_likelihoods: list[float]
    probabilities: list[float]

    @property
    def best(self) -> int:
        return max(range(len(self.probabilities)), key=self.probabilities.__getitem__)


@torch.inference_mode()
def score_options(adapter: ModelAdapter, policy: CachePolicy, asks: list[tuple[list[int], torch.Tensor | None]],
                  options: list[list[int]], layer_hook=None, clock: int | None = None) -> list[Scored]:
    """For each (prompt ids, key filter) in ``asks`` (a question and the keys it may see; None:
    all), the options' scores; ``options``: each option's token ids. One forward pass; the cache is
    as it was afterwards (the caller holds its lock). A single row goes the way of any question
    (so a policy's ``probe`` sees it: the evidence of an answer). Every row sits at the same
    positions on ``clock``: after that camera's positions (cache/clocks.py), or with None after
    every position held."""
    if not options or any(not ids for ids in options):
        raise ValueError("every option needs at least one token")
    continuations = sorted({tuple(ids[:-1]) for ids in options})  # rows one question needs
    rows = [prompt + list(c) for prompt, _ in asks for c in continuations]
    row_filters = [f for _, f in asks for _ in continuations]
    lengths = [len(r) for r in rows]
    new = NewTokens(torch.cat([text_positions(n, adapter.position_axes) for n in lengths], dim=1).to(adapter.device),
                    torch.full((sum(lengths),), TEXT_UNIT, dtype=torch.long),
                    torch.full((sum(lengths),), -1, dtype=torch.long), clock)
    key_filter = row_filters[0] if len(rows) == 1 else QueryRows.of(lengths, row_filters)
    mark = policy.mark()
    try:
        policy.ensure_room(max(lengths), clock)
        hidden = adapter.forward(adapter.embed_text([t for r in rows for t in r]), new, policy, key_filter,
                                 layer_hook)[0]
    finally:
        policy.truncate(mark)
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0).tolist()
    out = []
    for q, (prompt, _) in enumerate(asks):
        scores = []
        for ids in options:
            row = q * len(continuations) + continuations.index(tuple(ids[:-1]))
            # token t of the option is predicted at the row's position len(prompt) - 1 + t
            at = starts[row] + len(prompt) - 1 + torch.arange(len(ids))
            logp = torch.log_softmax(adapter.lm_head(hidden[at]).float(), dim=-1)
            scores.append(float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum()))
        probabilities = torch.softmax(torch.tensor(scores), dim=0).tolist()
        out.append(Scored(scores, probabilities))
    return out
