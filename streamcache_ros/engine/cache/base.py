"""The cache-policy interface, and per-layer storage shared by the layer-managed policies.

A policy owns the KV storage, the positions of what it keeps, and the bookkeeping of which stream
unit (a frame; a temporal patch of 2 frames on Qwen2.5-VL) each cached token came from. The model
adapter runs the decoder layers and hands each layer's new (pre-RoPE) q/k/v to ``attend``; the
policy rotates them at its own positions, stores them and attends over its storage. So HERMES can
give every layer its own positions and H2SVC every KV head its own length, behind one interface.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..layout import next_offset
from .attention import cached_attention
from .rope import RotarySpec, apply_rotary, compact_positions_1d, compact_positions_shift, rotate_by_delta

# Unit ids of tokens that are not video: kept forever (prefix), made by compression (summary),
# or temporary (question / answer text, removed after answering).
PREFIX_UNIT = -1
SUMMARY_UNIT = -2
TEXT_UNIT = -3


@dataclass(frozen=True)
class CacheGeometry:
    """Shapes and facts of the language model a policy stores K/V for."""

    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    rotary: RotarySpec
    max_position_embeddings: int
    model_family: str = ""
    attention_backend: str = "sdpa"
    model_id: str = ""  # which model: H2SVC checks that its head map was profiled on it
    config_hash: str = ""

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads


@dataclass
class NewTokens:
    """The tokens one forward pass appends: the same for every layer."""

    rel_positions: torch.Tensor  # [axes, Q] float32, relative to the layer's next offset
    units: torch.Tensor  # [Q] int64: unit id (>= 0) or PREFIX_UNIT / TEXT_UNIT
    chunks: torch.Tensor  # [Q] int64: chunk id, -1 for text

    def __len__(self) -> int:
        return int(self.units.numel())


@dataclass
class ChunkContext:
    """What a policy may use when it compresses after a chunk."""

    chunk_id: int
    guidance: Any = None  # the adapter's GuidanceProvider (HERMES), or None
    history: list = field(default_factory=list)  # past exchanges (question, answer, options)
    unit_frames: dict[int, tuple[int, ...]] = field(default_factory=dict)  # unit -> frame indices


@dataclass
class CacheStats:
    policy: str
    layer_tokens: list[int]
    kv_tokens: int
    kv_bytes: int
    budget_tokens: int
    units: list[int]  # video units with at least one token held anywhere, ascending
    max_position: float
    reindex_events: int = 0
    bank_tokens: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class CachePolicy(abc.ABC):
    """The interface the session and the adapters use. One subclass per method, one file each."""

    name: ClassVar[str] = "base"
    # True: the session prefills a chunk one unit per forward (encoding its pixels once) and calls
    # after_prefill after each, so the policy can evict between units (H2SVC's frame-by-frame arrival)
    prefill_unit_by_unit: bool = False

    def __init__(self, budget_tokens: int = 0, reindex: str = "lazy", reindex_margin: int = 1024):
        if reindex not in ("lazy", "eager"):
            raise ValueError(f"reindex must be 'lazy' or 'eager', got '{reindex}'")
        if budget_tokens < 0:
            raise ValueError(f"budget_tokens must be >= 0, got {budget_tokens}")
        self.budget_tokens = int(budget_tokens)
        self.reindex_mode = reindex
        self.reindex_margin = int(reindex_margin)
        self.geometry: CacheGeometry | None = None
        self.reindex_events = 0

    # -- life cycle ---------------------------------------------------------------------------
    def setup(self, geometry: CacheGeometry) -> None:
        self.geometry = geometry
        self.reset()

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget everything (the session prefills the prefix again)."""

    def config_dict(self) -> dict[str, Any]:
        """Parameters that make two caches comparable (checked when a snapshot is loaded)."""
        return {"budget_tokens": self.budget_tokens, "reindex": self.reindex_mode,
                "reindex_margin": self.reindex_margin}

    # -- forward pass ---------------------------------------------------------------------------
    @abc.abstractmethod
    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, new: NewTokens) -> None:
        """Rotate the new keys k [1,Hkv,Q,D] at this policy's positions and store k/v, without
        attending: what ``attend`` stores, for callers that need no attention output (benchmarks
        at real shapes, where the attention itself is the cost they leave out)."""

    @abc.abstractmethod
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               new: NewTokens, key_filter: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate the new q [1,Hq,Q,D] / k [1,Hkv,Q,D] at this policy's positions, store k/v,
        and return attention over the layer's storage [1,Hq,Q,D].

        ``key_filter``: unit ids a question may look at (None = all); prefix, summary and text
        tokens stay visible.
        """

    def after_prefill(self, new: NewTokens) -> None:
        """Called after each forward of a chunk's video tokens (one per unit when
        ``prefill_unit_by_unit``), before ``after_chunk``. A failure later in the chunk is undone
        by ``truncate`` to the mark taken before the chunk."""

    def after_chunk(self, context: ChunkContext) -> dict[str, Any]:
        """Bring the cache back to budget after a chunk was prefilled; returns facts to log."""
        return {}

    @abc.abstractmethod
    def ensure_room(self, n_tokens: int) -> None:
        """Make sure ``n_tokens`` more tokens get positions inside the model's range."""

    # -- temporary tokens (question and answer) ---------------------------------------------------
    @abc.abstractmethod
    def mark(self) -> Any:
        """A token that ``truncate`` takes to drop everything appended after it."""

    @abc.abstractmethod
    def truncate(self, mark: Any) -> None: ...

    # -- accounting and snapshots ---------------------------------------------------------------
    @abc.abstractmethod
    def stats(self) -> CacheStats: ...

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class LayerStore:
    """One layer's cache: post-RoPE keys and values [1, Hkv, T, D], positions [axes, T],
    unit and chunk ids [T]. Tensors are replaced, never viewed, so bytes held = numel · size."""

    def __init__(self, keys, values, positions, units, chunks):
        self.keys = keys
        self.values = values
        self.positions = positions
        self.units = units
        self.chunks = chunks

    @classmethod
    def empty(cls, geometry: CacheGeometry) -> "LayerStore":
        g = geometry
        kv = torch.empty(1, g.num_kv_heads, 0, g.head_dim, dtype=g.dtype, device=g.device)
        return cls(kv, kv.clone(), torch.empty(g.rotary.axes, 0, device=g.device),
                   torch.empty(0, dtype=torch.long, device=g.device),
                   torch.empty(0, dtype=torch.long, device=g.device))

    def __len__(self) -> int:
        return int(self.keys.shape[2])

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.keys, self.values)

    def next_offset(self) -> float:
        """Where the next token goes: max position + 1 over all axes (docs/hermes.md, §3)."""
        return next_offset(self.positions)

    def append(self, k, v, positions, units, chunks) -> None:
        self.keys = torch.cat((self.keys, k), dim=2)
        self.values = torch.cat((self.values, v), dim=2)
        self.positions = torch.cat((self.positions, positions), dim=1)
        self.units = torch.cat((self.units, units.to(self.units.device)))
        self.chunks = torch.cat((self.chunks, chunks.to(self.chunks.device)))

    def select(self, index: torch.Tensor) -> "LayerStore":
        index = index.to(self.keys.device)
        return LayerStore(self.keys.index_select(2, index), self.values.index_select(2, index),
                          self.positions.index_select(1, index), self.units.index_select(0, index),
                          self.chunks.index_select(0, index))

    def truncate(self, length: int) -> None:
        if length < len(self):
            self.keys = self.keys[:, :, :length].clone()
            self.values = self.values[:, :, :length].clone()
            self.positions = self.positions[:, :length].clone()
            self.units = self.units[:length].clone()
            self.chunks = self.chunks[:length].clone()

    def key_mask(self, allowed_units: torch.Tensor) -> torch.Tensor:
        return (self.units < 0) | torch.isin(self.units, allowed_units.to(self.units.device))

    def state(self) -> dict[str, torch.Tensor]:
        return {"keys": self.keys.cpu(), "values": self.values.cpu(), "positions": self.positions.cpu(),
                "units": self.units.cpu(), "chunks": self.chunks.cpu()}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], geometry: CacheGeometry) -> "LayerStore":
        d = geometry.device
        return cls(state["keys"].to(d, geometry.dtype), state["values"].to(d, geometry.dtype),
                   state["positions"].to(d), state["units"].to(d), state["chunks"].to(d))


class LayerwisePolicy(CachePolicy):
    """Per-layer storage with per-layer positions; ``compress`` decides what each layer keeps."""

    def __init__(self, budget_tokens: int = 0, reindex: str = "lazy", reindex_margin: int = 1024,
                 qwen_reindex: str = "shift"):
        super().__init__(budget_tokens, reindex, reindex_margin)
        if qwen_reindex not in ("shift", "dense_rank"):
            raise ValueError(f"qwen_reindex must be 'shift' or 'dense_rank', got '{qwen_reindex}'")
        self.qwen_reindex = qwen_reindex
        self.layers: list[LayerStore] = []

    def config_dict(self) -> dict[str, Any]:
        return {**super().config_dict(), "qwen_reindex": self.qwen_reindex}

    def reset(self) -> None:
        self.layers = [LayerStore.empty(self.geometry) for _ in range(self.geometry.num_layers)]
        self.reindex_events = 0

    def append(self, layer, k, v, new):
        self._store(layer, k, v, new)

    def attend(self, layer, q, k, v, new, key_filter=None):
        cos, sin = self._store(layer, k, v, new)
        store = self.layers[layer]
        key_mask = None if key_filter is None else store.key_mask(key_filter)
        return cached_attention(apply_rotary(q, cos, sin), store.keys, store.values, key_mask,
                                self.geometry.attention_backend)

    def _store(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               new: NewTokens) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens to the layer at its next offset, keys rotated; returns the cos/sin
        they were rotated with, for the queries of the same tokens."""
        store = self.layers[layer]
        positions = new.rel_positions.to(k.device) + store.next_offset()
        cos, sin = self.geometry.rotary.cos_sin(self.rotary_positions(layer, positions, new), k.dtype)
        store.append(apply_rotary(k, cos, sin), v, positions, new.units, new.chunks)
        return cos, sin

    def rotary_positions(self, layer: int, positions: torch.Tensor, new: NewTokens) -> torch.Tensor:
        """Where ``layer``'s new tokens are rotated: at the positions recorded for them."""
        return positions

    def after_chunk(self, context: ChunkContext) -> dict[str, Any]:
        report = self.compress(context) or {}
        if self.reindex_mode == "eager" or self.max_position() > self.reindex_threshold():
            self.reindex()
            report["reindexed"] = True
        return report

    def compress(self, context: ChunkContext) -> dict[str, Any] | None:
        """Select what each layer keeps. The baseline ``full`` keeps everything."""
        return None

    # -- positions ------------------------------------------------------------------------------
    def reindex_threshold(self) -> float:
        # hermes_spec §10 (lazy): re-index when positions pass max_position_embeddings − margin
        return self.geometry.max_position_embeddings - self.reindex_margin

    def max_position(self) -> float:
        return max((s.next_offset() - 1.0 for s in self.layers), default=-1.0)

    def ensure_room(self, n_tokens: int) -> None:
        if self.max_position() + n_tokens >= self.geometry.max_position_embeddings:
            self.reindex()

    def reindex(self) -> None:
        """Renumber every layer's kept tokens compactly and rotate their keys by the delta."""
        for store in self.layers:
            new = self.compacted_positions(store)
            store.keys = rotate_by_delta(store.keys, self.geometry.rotary, new - store.positions)
            store.positions = new
        self.reindex_events += 1

    def compacted_positions(self, store: LayerStore) -> torch.Tensor:
        prefix_len = int((store.units == PREFIX_UNIT).sum().item())
        if self.geometry.rotary.axes == 1:
            return compact_positions_1d(len(store), store.positions.device)
        if self.qwen_reindex == "shift":
            # a summary token is a group of its own; chunk ids of prefix tokens are -1
            groups = torch.where(store.units == SUMMARY_UNIT, -2 - torch.arange(len(store), device=store.units.device),
                                 store.chunks)
            return compact_positions_shift(store.positions, groups, prefix_len)
        raise NotImplementedError(f"qwen_reindex '{self.qwen_reindex}' is provided by the hermes policy")

    # -- temporary tokens -------------------------------------------------------------------------
    def mark(self) -> list[int]:
        return [len(s) for s in self.layers]

    def truncate(self, mark: list[int]) -> None:
        for store, length in zip(self.layers, mark):
            store.truncate(length)

    # -- accounting and snapshots -----------------------------------------------------------------
    def stats(self) -> CacheStats:
        units = torch.unique(torch.cat([s.units for s in self.layers])) if self.layers else torch.empty(0)
        return CacheStats(
            policy=self.name,
            layer_tokens=[len(s) for s in self.layers],
            kv_tokens=sum(len(s) for s in self.layers),
            kv_bytes=sum(s.nbytes for s in self.layers),
            budget_tokens=self.budget_tokens,
            units=[int(u) for u in units.tolist() if u >= 0],
            max_position=self.max_position(),
            reindex_events=self.reindex_events,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"layers": [s.state() for s in self.layers], "reindex_events": self.reindex_events}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        layers = state["layers"]
        if len(layers) != self.geometry.num_layers:
            raise ValueError(f"snapshot has {len(layers)} layers, the model has {self.geometry.num_layers}")
        self.layers = [LayerStore.from_state(s, self.geometry) for s in layers]
        self.reindex_events = int(state.get("reindex_events", 0))
