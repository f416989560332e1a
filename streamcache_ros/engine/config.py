"""A session's configuration: what may be set once, checked once."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

OPTIONS_MODES = ("scored", "generated")


@dataclass
class SessionConfig:
    """Checked here, once; a bad value is a ConfigError naming the node's parameter."""

    chunk_frames: int = 8
    max_question_tokens: int = 512
    max_new_tokens: int = 64
    mc_max_new_tokens: int = 16  # docs/hermes.md §2: multiple choice answers are short
    repetition_penalty: float = 1.0  # the HERMES reference driver uses 1.1 (docs/hermes.md §11)
    # Past exchanges kept (HERMES guidance reads the last one); bounded so a robot asked questions
    # for days does not grow its memory with them
    history_size: int = 32
    # The cameras a question may name (the node's camera_topics); empty: any camera seen so far
    cameras: tuple[str, ...] = ()
    # Evidence (docs/interfaces.md "Time windows and evidence"): the frames an answer names (0: none,
    # and no attention mass is computed), and the layers whose attention defines it (empty: the
    # middle half of the layers, ``default_evidence_layers``)
    evidence_k: int = 3
    evidence_layers: tuple[int, ...] = ()
    # How a question with options is answered (docs/interfaces.md "Options"): "scored", the option
    # the model finds most likely (always an option, with probabilities); "generated", free
    # generation matched to an option afterwards (the HERMES reference's way)
    options_mode: str = "scored"
    # Questions asked together in one forward pass (the when search, standing questions): more is
    # faster and takes more memory for the pass
    rows_per_pass: int = 64
    # A chunk is prefilled this many tokens at a time at most (0: in one forward), which bounds the
    # decoder's activations (engine/ingest/prefill.py; the default: docs/performance.md "Prefill in blocks")
    prefill_block_tokens: int = 128
    # `when` and "did you see" over the archive (docs/archive.md "When with the index"): the index's
    # candidates replayed at most, and the chunks walked at most where the index cannot settle a window;
    # together they bound a search's worst case (the reply says what it did not read)
    when_verify_chunks: int = 4
    when_walk_chunks: int = 16

    def largest_question(self, max_position_embeddings: int) -> int:
        """Positions the largest question and its answer take: max_question_tokens + max_new_tokens,
        at most half the model's range (``ask`` refuses more)."""
        answer = max(self.max_new_tokens, self.mc_max_new_tokens)
        return min(self.max_question_tokens + answer, max_position_embeddings // 2)

    def __post_init__(self):
        for name in ("chunk_frames", "max_question_tokens", "max_new_tokens", "mc_max_new_tokens", "history_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        self.cameras = tuple(self.cameras)
        if int(self.evidence_k) < 0:
            raise ConfigError("evidence_k", f"must be >= 0, got {self.evidence_k}")
        self.evidence_layers = tuple(int(layer) for layer in self.evidence_layers)
        if self.options_mode not in OPTIONS_MODES:
            raise ConfigError("options_mode", f"must be one of {', '.join(OPTIONS_MODES)}, got '{self.options_mode}'")
        for name in ("rows_per_pass", "when_verify_chunks"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if int(self.when_walk_chunks) < 0:
            raise ConfigError("when_walk_chunks", f"must be >= 0, got {self.when_walk_chunks}")
        block = self.prefill_block_tokens  # an int (numpy's too), not a bool, a float or a string
        if isinstance(block, bool) or not hasattr(block, "__index__") or block.__index__() < 0:
            raise ConfigError("prefill_block_tokens", f"must be a whole number of tokens >= 0 (0: the whole chunk "
                                                      f"in one forward), got {block!r}")
        self.prefill_block_tokens = block.__index__()


def default_evidence_layers(num_layers: int) -> tuple[int, ...]:
    """The layers whose attention defines evidence when none are chosen: the middle half, where a
    question's attention to the image is strongest in vision-language models
    (docs/interfaces.md "Which layers"); bench/evidence_layers.py chooses them for a model."""
    first = num_layers // 4
    return tuple(range(first, max(first + 1, (3 * num_layers) // 4)))
