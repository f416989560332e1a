"""The plain data that crosses the cache-policy boundary (base.py): the model's shapes and the
family's traits, the new tokens of a chunk, guidance requests, what a chunk's compression did, and
what the cache holds. The storage (storage.py) and the policies both build on these, so they live
below both."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from .rope import RotarySpec
from .units import SUMMARY_UNIT

ROPE_LAYOUTS = ("1d", "mrope")


@dataclass(frozen=True)
class FamilyTraits:
    """What a model family means to a cache policy, as data (the adapter gives it).

    ``rope_layout``: ``1d`` (one position per token; kept tokens are renumbered 0..n-1) or
    ``mrope`` (t/h/w axes; kept groups are shifted or ranked per axis, positions.py).
    ``presets``: per policy name, setting values for this family, filling the settings a user
    left empty (e.g. HERMES's mid-layer schedule, docs/hermes.md §7).
    """

    rope_layout: str = "1d"
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self):
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope_layout must be one of {', '.join(ROPE_LAYOUTS)}, got '{self.rope_layout}'")


@dataclass(frozen=True)
class CacheGeometry:
    """Shapes of the language model a policy stores K/V for, and its family's traits."""

    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    rotary: RotarySpec
    max_position_embeddings: int
    traits: FamilyTraits = FamilyTraits()
    attention_backend: str = "sdpa"

    def __post_init__(self):
        if (self.traits.rope_layout == "mrope") != (self.rotary.axes == 3):
            raise ValueError(f"rope_layout '{self.traits.rope_layout}' does not fit a RotarySpec of "
                             f"{self.rotary.axes} axes")

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads


@dataclass(frozen=True)
class ChunkShape:
    """How one chunk of camera frames is laid out in positions (what ``kept_positions`` reads):
    ``unit_positions`` is what a stream unit takes alone, ``chunk_positions`` what a chunk takes by
    the chunk-start rule; with 1D RoPE both are their token counts, with M-RoPE their largest t/h/w
    extent (e.g. 23 for a chunk of 2 temporal patches of 17x23 tokens)."""

    unit_tokens: int
    unit_positions: int
    chunk_tokens: int
    chunk_positions: int


@dataclass
class NewTokens:
    """The tokens one forward pass appends: the same for every layer. ``clock``: the camera clock
    the pass is on (clocks.py): it starts after that clock's positions and sees only the prefix and
    that clock's tokens; None: after the largest position held, seeing every token."""

    rel_positions: torch.Tensor  # [axes, Q] float32, relative to the layer's next offset on the clock
    units: torch.Tensor  # [Q] int64: unit id (>= 0) or PREFIX_UNIT / TEXT_UNIT
    chunks: torch.Tensor  # [Q] int64: chunk id, -1 for text
    clock: int | None = None
    # the first unit of the prefill step this forward belongs to: a block of a step carries its
    # step's (engine/ingest/prefill.py); None: the smallest unit among ``units``, if any
    first_unit: int | None = None

    def arriving_unit(self) -> int | None:
        """The stream unit whose arrival this forward is part of (None: no video)."""
        if self.first_unit is not None:
            return self.first_unit
        video = self.units[self.units >= 0]
        return int(video.min()) if video.numel() else None

    def __len__(self) -> int:
        return int(self.units.numel())


@dataclass
class GuidancePrompt:
    """A text whose queries a policy wants to score the cache with, and the layers that read it."""

    text: str
    layers: list[int]


@dataclass
class GuidanceRequest:
    """What a policy that needs guidance asks the session to compute before ``after_chunk``:
    ``queries`` ``embedding`` (each layer's q/k projected from the token embeddings) or ``hidden``
    (from the layer's own input, the text run over the cache and removed again)."""

    prompts: list[GuidancePrompt]
    queries: str = "embedding"


@dataclass
class GuidancePass:
    """One prompt's un-rotated queries and keys, for the layers that read it."""

    layers: list[int]
    qk: list[tuple[torch.Tensor, torch.Tensor]]  # per entry of ``layers``: q [1, Hq, n, D], k [1, Hkv, n, D]

    @property
    def length(self) -> int:
        return int(self.qk[0][0].shape[2]) if self.qk else 0


@dataclass
class ChunkContext:
    """What a policy may use when it compresses after a chunk."""

    chunk_id: int
    guidance: list[GuidancePass] | None = None  # the passes a GuidanceRequest asked for
    unit_frames: dict[int, tuple[int, ...]] = field(default_factory=dict)  # unit -> frame indices


@dataclass
class ChunkOutcome:
    """What compressing after a chunk did. ``evicted_units``: the units no longer held anywhere
    (the session forgets them); ``details``: the policy's own figures (summary tokens, guidance
    passes, STCE evictions ...)."""

    evicted_units: list[int] = field(default_factory=list)
    evicted_tokens: int = 0
    reindexed: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"evicted_units": list(self.evicted_units), "evicted_tokens": self.evicted_tokens,
                "reindexed": self.reindexed, **self.details}


@dataclass
class CacheStats:
    policy: str = ""
    layer_tokens: list[int] = field(default_factory=list)  # per layer (H2SVC: the mean over its KV heads)
    kv_tokens: int = 0  # all layers (or heads) summed
    kv_bytes: int = 0  # bytes the cache tensors hold
    budget_tokens: int = 0  # 0: the policy takes none
    instant_tokens: int = 0  # the instant window's video tokens in a layer, held beside the budget (instant.py)
    units: list[int] = field(default_factory=list)  # video units with a token held anywhere, ascending
    max_position: float = -1.0
    reindex_events: int = 0
    bank_tokens: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class UnitTokens:
    """Tokens held per video unit: ``counts[r, i]`` tokens of ``units[i]`` in storage row ``r`` (a
    layer, or for H2SVC one KV head); ``rows_per_layer`` rows make one layer's worth; ``summary``:
    the summary tokens (HERMES) over every row."""

    units: torch.Tensor  # [U] ascending unit ids
    counts: torch.Tensor  # [R, U]
    rows_per_layer: int = 1
    summary: int = 0

    @classmethod
    def of(cls, rows: list[torch.Tensor], rows_per_layer: int = 1) -> "UnitTokens":
        """From each row's unit ids (negative ids: no unit, not counted, summary tokens aside)."""
        summary = sum(int((r == SUMMARY_UNIT).sum()) for r in rows)
        rows = [r[r >= 0] for r in rows]
        units = torch.unique(torch.cat(rows)) if rows else torch.empty(0, dtype=torch.long)
        counts = [torch.bincount(torch.searchsorted(units, r), minlength=len(units)) for r in rows]
        return cls(units.cpu(), torch.stack(counts).cpu() if counts else torch.zeros(0, 0, dtype=torch.long),
                   rows_per_layer, summary)
