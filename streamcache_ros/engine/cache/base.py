"""The cache-policy interface: what the session and the adapters give a policy, and what it returns.

A policy decides what its KV storage keeps; the storage (storage.py) holds the tensors, the
positions of what is kept, and which stream unit (a frame; a temporal patch of 2 frames on
Qwen2.5-VL) each cached token came from. The model adapter runs the decoder layers and hands each
layer's new (pre-RoPE) q/k/v to ``attend``; the policy has its storage rotate them at its own
positions and store them, and attends over what it keeps. So HERMES can give every layer its own
positions and H2SVC every KV head its own length, behind one interface.

Across this boundary go tensors and typed data only: the model's shapes and the family's traits
(``CacheGeometry``), the policy's settings (a dataclass, settings.py), the new tokens, and, for a
policy that asks for it, the guidance queries the session computed. A policy never sees a model, an
adapter or a family's name.
"""
from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import torch

from .evidence import AttentionMass
from .rope import RotarySpec
from .settings import PolicySettings, SettingError
from .store import KVStore
from .units import SUMMARY_UNIT

if TYPE_CHECKING:  # storage.py builds on the types below
    from .storage import CacheStorage

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


class CachePolicy(abc.ABC):
    """The interface the session and the adapters use. One subclass per method, one file each, with
    its settings dataclass; registered by name in ``cache/__init__.py``.

    A subclass says what it keeps: where its tokens live (``new_storage``), what each head attends
    to (``attend``), what stays after a chunk (``compress``) and when positions are renumbered
    (``ensure_room``); and, if it wants guidance, what (``guidance_request``). Storing, marks,
    accounting, snapshots and re-indexing are the storage's (storage.py)."""

    name: ClassVar[str] = "base"
    settings_class: ClassVar[type[PolicySettings]] = PolicySettings
    # objects a policy is built with besides its settings (H2SVC: the head map the factory loaded)
    inputs: ClassVar[tuple[str, ...]] = ()
    # True: before after_chunk the session computes what guidance_request asks for (HERMES)
    needs_guidance: ClassVar[bool] = False
    # True: the session prefills a chunk one unit per forward (encoding its pixels once) and calls
    # after_prefill after each, so the policy can evict between units (H2SVC's frame-by-frame arrival)
    prefill_unit_by_unit: bool = False

    def __init__(self, settings: PolicySettings | None = None, **params: Any):
        # as given; ``settings`` (below) adds the model family's presets at setup
        self.given_settings = settings if settings is not None else self.settings_class.from_params(params)
        self.settings = self.given_settings
        self.geometry: CacheGeometry | None = None
        self.storage: CacheStorage | None = None
        self.reindex_events = 0
        # while a question is answered: the attention mass ``attend`` reports (evidence.py), else None
        self.probe: AttentionMass | None = None

    @property
    def budget_tokens(self) -> int:
        """The token budget (0: the policy takes none)."""
        return int(getattr(self.settings, "budget_tokens", 0))

    @property
    def instant_frames(self) -> int:
        """The newest frames of each camera kept whole beside the bound (0: none; instant.py)."""
        return int(getattr(self.settings, "instant_frames", 0))

    # -- what a policy decides --------------------------------------------------------------------
    @abc.abstractmethod
    def new_storage(self) -> CacheStorage:
        """Empty storage for the model's shapes: per layer, or per group of heads (storage.py)."""

    @abc.abstractmethod
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               new: NewTokens, key_filter: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate the new q [1,Hq,Q,D] / k [1,Hkv,Q,D] at this policy's positions, store k/v
        (``store``), and return attention over the layer's storage [1,Hq,Q,D].

        ``key_filter``: unit ids a question may look at (None = all); the prefix and the text stay
        visible, a summary token only when SUMMARY_UNIT is listed (``KVStore.visible``). A pass on
        a clock (``new.clock``) sees only the prefix and that clock's tokens (clocks.py). With a
        ``probe`` set, each store attended over is reported to it (``AttentionMass.observe``).
        """

    @abc.abstractmethod
    def compress(self, context: ChunkContext) -> ChunkOutcome:
        """The policy's own step after a chunk: evict, re-index, report."""

    @abc.abstractmethod
    def ensure_room(self, n_tokens: int, clock: int | None = None) -> None:
        """Make sure ``n_tokens`` more tokens on ``clock`` (None: after every position held) get
        positions inside the model's range (re-indexing if need be); raises
        positions.PositionRangeError where even a re-index leaves too little room."""

    def guidance_request(self, history: list, context: ChunkContext | None = None) -> GuidanceRequest | None:
        """What guidance the coming ``after_chunk`` needs (None: none). ``history``: past exchanges
        (question, answer, options), oldest first; ``context``: the chunk's, as ``after_chunk`` will
        get it (without its guidance), where the caller has it."""
        return None

    def video_stored(self, new: NewTokens) -> None:
        """Called when a forward's video tokens were stored (once per forward, at layer 0)."""

    def after_prefill(self, new: NewTokens) -> None:
        """Called after each forward of a chunk's video tokens (one per unit when
        ``prefill_unit_by_unit``), before ``after_chunk``. A failure later in the chunk is undone
        by ``truncate`` to the mark taken before the chunk."""

    @property
    def bounding_setting(self) -> str:
        """The setting that bounds what this policy keeps ("" where nothing does: ``full``)."""
        return ""

    def kept_positions(self, value: int, shape: "ChunkShape") -> int:
        """The most positions the stream units this policy keeps can take once re-indexed, with its
        bounding setting at ``value``; the factory checks them, a chunk and a question against the
        model's range (docs/architecture.md#the-position-range)."""
        raise NotImplementedError(f"policy '{self.name}' keeps no bound")

    # -- life cycle ---------------------------------------------------------------------------
    def setup(self, geometry: CacheGeometry) -> None:
        self.geometry = geometry
        self.settings = self.given_settings.with_preset(geometry.traits.presets.get(self.name, {}))
        self.reset()

    def reset(self) -> None:
        """Forget everything (the session prefills the prefix again)."""
        self.storage = self.new_storage()
        self.reindex_events = 0

    def set_budget(self, budget_tokens: int) -> None:
        """A new token budget while the stream runs: the next compression brings the cache to it
        (docs/interfaces.md, "Changing parameters at runtime"). SettingError for a policy that keeps none."""
        if not self.settings_class.takes("budget_tokens"):
            raise SettingError("budget_tokens", f"is not used by policy {self.name}: it keeps no token budget")
        self.given_settings = dataclasses.replace(self.given_settings, budget_tokens=int(budget_tokens))
        self.settings = dataclasses.replace(self.settings, budget_tokens=int(budget_tokens))

    def config_dict(self) -> dict[str, Any]:
        """Parameters that make two caches comparable (checked when a snapshot is loaded). An
        instant window that is off is left out, so that snapshots made before it existed load."""
        config = self.settings.as_dict()
        if config.get("instant_frames") == 0:
            del config["instant_frames"]
        return config

    # -- forward pass ---------------------------------------------------------------------------
    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, new: NewTokens) -> None:
        """Rotate the new keys k [1,Hkv,Q,D] at this policy's positions and store k/v, without
        attending: what ``attend`` stores, for callers that need no attention output (benchmarks
        at real shapes, where the attention itself is the cost they leave out)."""
        self.store(layer, k, v, new)

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor,
              new: NewTokens) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens (``CacheStorage.append``); returns the cos/sin of their keys."""
        rotation = self.storage.append(layer, k, v, new)
        if layer == 0 and bool((new.units >= 0).any()):
            self.video_stored(new)
        return rotation

    def after_chunk(self, context: ChunkContext) -> ChunkOutcome:
        """Bring the cache back to budget after a chunk was prefilled (``compress``); the outcome
        lists the units that left the cache."""
        held = set(self.storage.held_units())
        outcome = self.compress(context)
        outcome.evicted_units = sorted(held - set(self.storage.held_units()))
        return outcome

    def max_position(self, clock: int | None = None) -> float:
        """The largest position on ``clock`` (None: of every token)."""
        return self.storage.max_position(clock)

    # -- temporary tokens (question and answer) ---------------------------------------------------
    def mark(self) -> Any:
        """A token that ``truncate`` takes to drop everything appended after it."""
        return self.storage.mark()

    def truncate(self, mark: Any) -> None:
        self.storage.truncate(mark)

    # -- accounting and snapshots ---------------------------------------------------------------
    def stats(self) -> CacheStats:
        stats = self.storage.stats()
        stats.policy, stats.budget_tokens, stats.reindex_events = self.name, self.budget_tokens, self.reindex_events
        return stats

    def unit_tokens(self) -> UnitTokens:
        """Tokens held per video unit and storage row (what frames_in_memory counts, session.py)."""
        return self.storage.unit_tokens()

    def layer_stores(self) -> list[list[tuple[int, KVStore]]]:
        """Per layer, the stores holding its KV heads, each with its bank (-1: no banks): what the
        memory timeline reads (``evidence.retention``)."""
        return self.storage.layer_stores()

    def state_dict(self) -> dict[str, Any]:
        return {**self.storage.state(), "reindex_events": self.reindex_events}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Hold what ``state`` holds; the policy's own figures start afresh where it keeps none."""
        storage = self.new_storage()
        storage.load(state)  # a snapshot that does not fit is refused before anything held changes
        self.reset()
        self.storage = storage
        self.reindex_events = int(state.get("reindex_events", 0))
