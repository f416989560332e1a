"""How a question runs on the model: decoded, or its options scored, over the cache.

    runner = QuestionRunner(adapter, policy, config)
    reply = runner.decode(ids, budget, started, selection, probe, on_text, should_stop)
    reply = runner.score(ids, options, selection, probe, on_text, started)
    p_yes = runner.yes(prompts, windows)      # many yes/no questions, one pass per rows_per_pass

The Session holds its lock around each call and has checked the question already (checks.py); a
question's tokens are removed from the cache again, whatever happens, and a failure inside the
model becomes an AnswerError with the memory unchanged. No ROS here.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from .. import failpoints
from ..adapters import ModelAdapter
from ..cache import CachePolicy
from ..cache.evidence import AttentionMass
from ..config import SessionConfig
from .decoding import greedy_decode
from ..errors import AnswerError, describe_failure, release_device_memory
from ..memory.ledger import Selection
from .scoring import score_options

YES_NO = ("yes", "no")  # the options a when search or a standing question is asked with


@dataclass
class Reply:
    """What answering produced, before it becomes an Answer."""

    text: str
    tokens: int
    ttft_ms: float
    cancelled: bool
    option_index: int | None = None  # None: match the text to an option
    probabilities: list[float] = field(default_factory=list)


class QuestionRunner:
    def __init__(self, adapter: ModelAdapter, policy: CachePolicy, config: SessionConfig):
        self.adapter, self.policy, self.config = adapter, policy, config
        self.attempts = 0  # every accepted question that reached the model (failpoint plans count these)

    def decode(self, ids: list[int], budget: int, started: float, seen: Selection, probe: AttentionMass | None,
                on_text, should_stop) -> Reply:
        """The question prefilled and its answer decoded over the cache, ``probe`` (evidence) lent to
        the policy meanwhile; the question's tokens are removed again, whatever happens."""
        policy = self.policy
        mark = policy.mark()
        key_filter = None if seen.key_filter is None else torch.tensor(seen.key_filter, dtype=torch.long)
        with self.answering(probe) as hook:
            try:
                decoded = greedy_decode(self.adapter, policy, ids, budget, started, key_filter, on_text, should_stop,
                                        self.config.repetition_penalty, hook, seen.clock)
            finally:
                policy.truncate(mark)
        return Reply(self.adapter.decode(decoded.tokens), len(decoded.tokens), decoded.ttft_ms, decoded.cancelled)

    def score(self, ids: list[int], options: list[str], seen: Selection, probe: AttentionMass | None, on_text,
               started: float) -> Reply:
        """The option the model finds most likely after the prompt (scoring.py), streamed as one piece."""
        key_filter = None if seen.key_filter is None else torch.tensor(seen.key_filter, dtype=torch.long)
        option_ids = [self.adapter.option_ids(options, i) for i in range(len(options))]
        with self.answering(probe) as hook:
            (scored,) = score_options(self.adapter, self.policy, [(ids, key_filter)], option_ids, hook, seen.clock)
        ttft_ms = (time.perf_counter() - started) * 1e3
        if on_text is not None:
            on_text(options[scored.best], options[scored.best])
        return Reply(options[scored.best], len(option_ids[scored.best]), ttft_ms, False, scored.best,
                     scored.probabilities)

    @contextlib.contextmanager
    def answering(self, probe: AttentionMass | None = None):
        """Around the model's work for a question: the failpoint hook, ``probe`` (evidence) lent to
        the policy, and any failure turned into an AnswerError (the memory is unchanged)."""
        self.attempts += 1
        hook = failpoints.layer_hook("question", question=self.attempts,
                                     layers=self.policy.geometry.num_layers)
        try:
            self.policy.probe = probe
            yield hook
        except Exception as err:
            release_device_memory(err)
            raise AnswerError(f"answering failed: {describe_failure(err)}; the memory is unchanged") from err
        finally:
            self.policy.probe = None

    def yes(self, prompts: list[list[int]], windows: list[list[int]], clock: int | None = None) -> list[float]:
        """P(yes) of each yes/no prompt over its window's units (the summary tokens hidden, as in any
        time window), ``rows_per_pass`` at a time; on a camera's ``clock`` or, with None, after every
        position held (cache/clocks.py)."""
        options = [self.adapter.option_ids(list(YES_NO), i) for i in range(2)]
        rows = self.config.rows_per_pass
        out = []
        with self.answering() as hook:
            for start in range(0, len(prompts), rows):
                asks = [(p, torch.tensor(w, dtype=torch.long)) for p, w in
                        zip(prompts[start:start + rows], windows[start:start + rows])]
                out += [s.probabilities[0] for s in score_options(self.adapter, self.policy, asks, options, hook,
                                                                  clock)]
        return out
