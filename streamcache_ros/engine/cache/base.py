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
from typing import Any, ClassVar

import torch

from .evidence import AttentionMass
from .settings import PolicySettings, SettingError
from .store import KVStore
from .storage import CacheStorage
from .types import CacheGeometry, CacheStats, ChunkContext, ChunkOutcome, ChunkShape, GuidanceRequest, NewTokens, UnitTokens


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
