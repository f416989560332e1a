"""The KV storage every policy keeps: one store class whose rows are KV heads.

A store holds post-RoPE keys and values [1, rows, T, D] and, for every slot, its position, its
stream unit, its chunk and its clock (the camera whose positions it is on, clocks.py). Positions and
unit ids are either *shared* by all rows (the layer-managed policies: every KV head of a layer holds
the same tokens; positions [axes, T], units, chunks and clocks [T]) or kept *per row* (H2SVC: each
head evicts on its own; positions [rows, axes, T], units, chunks and clocks [rows, T]). The rows of a store always have one length T: when per-row stores keep
different numbers of tokens the shorter rows are padded with ``PAD_UNIT`` slots, never attended to
and never counted, so the bytes held are rows · T · D per tensor, not a full cache masked out.

Reserved buffers (docs/performance.md#real-widths): the tensors are views of the first T slots of
buffers with room for more. An append writes into the room in place, and only when there is none
are the tokens copied once into a buffer an eighth larger than needed; eviction moves the kept
tokens forward in place, runs of consecutive slots by slice copies and the rest a block at a time;
a question's tokens are dropped by shortening the views. So a chunk, a unit (H2SVC) or an
answer's token is never a copy of the cache, and the memory a chunk takes on top of the cache is
the chunk and a block. The buffers are normal tensors (made outside inference mode), so they may
be written in place in and outside inference mode.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .clocks import NO_CLOCK, clocks_held, on_clock, stored_clock
from .positions import next_offset
from .rope import RotarySpec, rotate_by_delta
from .units import PAD_UNIT, PREFIX_UNIT, TEXT_UNIT

# (old positions [axes, n], unit ids [n], chunk ids [n]) of one row's kept tokens -> new positions
Renumber = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
GROWTH = 8  # a buffer that runs out of room grows to what is needed + 1/GROWTH of it
MOVE_BYTES = 2 << 20  # keys (then values) moved at a time when evicting in place
MIN_RUN = 64  # slots a run's slice copy moves at least, else index_select is as cheap (fewer calls)


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class KVStore:
    """The KV heads ``heads`` of one layer (all of them, or an H2SVC group)."""

    copies = 0  # appends that copied a store's tokens into a larger buffer, every store so far (benchmarks)

    def __init__(self, keys, values, positions, units, chunks, heads: torch.Tensor, shared: bool,
                 clocks: torch.Tensor | None = None):
        self.heads = heads
        self.shared = shared
        self.copied = 0  # appends or reserves that copied this store's tokens into a larger buffer
        clocks = torch.full_like(units, NO_CLOCK) if clocks is None else clocks
        self._adopt(keys, values, positions, units, chunks, clocks)
        self.padded = bool((self.units == PAD_UNIT).any()) if len(self) else False

    @classmethod
    def empty(cls, geometry, heads: list[int] | None = None, shared: bool = True) -> "KVStore":
        g = geometry
        heads = list(range(g.num_kv_heads)) if heads is None else list(heads)
        rows = () if shared else (len(heads),)
        keys = torch.empty(1, len(heads), 0, g.head_dim, dtype=g.dtype, device=g.device)
        ids = torch.empty(*rows, 0, dtype=torch.long, device=g.device)
        return cls(keys, keys, torch.empty(*rows, g.rotary.axes, 0, device=g.device), ids, ids,
                   torch.tensor(heads, dtype=torch.long, device=g.device), shared, ids)

    def _adopt(self, keys, values, positions, units, chunks, clocks, capacity: int = 0) -> None:
        """New buffers holding these tokens (copied), with room for ``capacity`` slots in all."""
        length = int(keys.shape[2])
        capacity = max(capacity, length)
        with torch.inference_mode(False):  # normal tensors: writable in place anywhere

            def buffer(x: torch.Tensor) -> torch.Tensor:
                shape = list(x.shape)
                axis = 2 if x.dim() == 4 else x.dim() - 1
                shape[axis] = capacity
                out = torch.empty(shape, dtype=x.dtype, device=x.device)
                out.narrow(axis, 0, length).copy_(x)
                return out

            self._keys, self._values = buffer(keys), buffer(values)
            self._positions, self._units, self._chunks = buffer(positions), buffer(units), buffer(chunks)
            self._clocks = buffer(clocks)
        self._length = length
        self._offsets: dict[int | None, torch.Tensor] = {}  # next_offsets by clock, while they hold

    # -- the tokens held (views of the buffers) ---------------------------------------------------
    @property
    def keys(self) -> torch.Tensor:
        return self._keys[:, :, :self._length]

    @property
    def values(self) -> torch.Tensor:
        return self._values[:, :, :self._length]

    @property
    def positions(self) -> torch.Tensor:
        return self._positions[..., :self._length]

    @property
    def units(self) -> torch.Tensor:
        return self._units[..., :self._length]

    @property
    def chunks(self) -> torch.Tensor:
        return self._chunks[..., :self._length]

    @property
    def clocks(self) -> torch.Tensor:
        return self._clocks[..., :self._length]

    # -- shape ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._length

    @property
    def capacity(self) -> int:
        return int(self._keys.shape[2])

    @property
    def rows(self) -> int:
        return int(self.heads.numel())

    @property
    def nbytes(self) -> int:
        """Bytes of the tokens held (keys and values)."""
        return tensor_bytes(self.keys, self.values)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the room reserved for tokens to come (keys and values)."""
        return tensor_bytes(self._keys, self._values) - self.nbytes

    def _per_row(self, x: torch.Tensor) -> torch.Tensor:
        """Positions, units or chunks with a leading row axis (a view when shared)."""
        return x[None] if self.shared else x

    def _as_stored(self, x: torch.Tensor) -> torch.Tensor:
        return x[0] if self.shared else x

    def tokens_per_row(self) -> torch.Tensor:
        """[rows] tokens each row holds, padding excluded."""
        if self.shared:
            return torch.full((self.rows,), len(self), dtype=torch.long, device=self.units.device)
        return (self.units != PAD_UNIT).sum(dim=1)

    def next_offset(self, clock: int | None = None) -> float:
        """Where the next token on ``clock`` goes (None: on no clock): max position + 1 over all axes
        of the tokens that clock counts (docs/hermes.md §3, clocks.py)."""
        if self.shared:
            counted = on_clock(self.units, self.clocks, clock)
            return next_offset(self.positions if counted is None else self.positions[:, counted])
        return float(self.next_offsets(clock).max()) if self.rows else 0.0

    def next_offsets(self, clock: int | None = None) -> torch.Tensor:
        """[rows] where each row's next token on ``clock`` goes (all equal when shared).

        Kept from call to call until the tokens change otherwise than by an append on that clock
        (which moves it on, ``append``): H2SVC asks every group of every layer before each unit's
        forward, and the mask and max over the whole store were a fixed cost of each forward
        (docs/performance.md "H2SVC's prefill")."""
        if len(self) == 0:
            return torch.zeros(self.rows, dtype=torch.float32, device=self.positions.device)
        known = self._offsets.get(clock)
        if known is not None:
            return known.clone()
        positions, units = self._per_row(self.positions), self._per_row(self.units)
        ignored = units == PAD_UNIT
        counted = on_clock(units, self._per_row(self.clocks), clock)
        if counted is not None:
            ignored = ignored | ~counted
        held = positions.masked_fill(ignored[:, None, :], -1.0)
        offsets = (held.amax(dim=(1, 2)) + 1.0).expand(self.rows)
        self._offsets[clock] = offsets
        return offsets.clone()

    def unit_columns(self, unit: int) -> torch.Tensor:
        """Slots of ``unit``'s tokens; appended tokens sit in the same slots in every row."""
        return torch.nonzero(self._per_row(self.units)[0] == unit).flatten()

    # -- writing ----------------------------------------------------------------------------------
    def append(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, units: torch.Tensor,
               chunks: torch.Tensor, clock: int | None = None) -> None:
        """k, v [1, rows, Q, D]; positions [axes, Q] (shared) or [rows, axes, Q]; units and chunks
        [Q]: the same tokens for every row, on ``clock`` (None: on no clock). Written into the
        reserved room (grown once if short)."""
        units, chunks = units.to(self._units.device), chunks.to(self._chunks.device)
        if not self.shared:
            units, chunks = units[None].expand(self.rows, -1), chunks[None].expand(self.rows, -1)
        start, end = self._length, self._length + int(k.shape[2])
        self.reserve(end - start)
        self._keys[:, :, start:end] = k
        self._values[:, :, start:end] = v
        self._positions[..., start:end] = positions
        self._units[..., start:end] = units
        self._chunks[..., start:end] = chunks
        self._clocks[..., start:end] = stored_clock(clock)
        self._length = end
        if self._offsets and end > start:
            # every new token counts for a pass on its own clock and on none: those offsets move on
            # to the new tokens' max + 1 where that is further; another clock's are not kept
            reach = self._per_row(self._positions[..., start:end]).amax(dim=(1, 2)) + 1.0
            self._offsets = {c: torch.maximum(offsets, reach.expand(self.rows))
                             for c, offsets in self._offsets.items() if c is None or c == clock}

    def reserve(self, extra: int) -> None:
        """Room for ``extra`` more tokens: when short, the tokens are copied once into a buffer for
        them and ``extra`` more, plus an eighth (H2SVC reserves a chunk's worth after each chunk, so
        that the chunk's units, appended one by one, never copy the store)."""
        need = self._length + int(extra)
        if need > self.capacity:
            KVStore.copies += 1
            self.copied += 1
            self._adopt(self.keys, self.values, self.positions, self.units, self.chunks, self.clocks,
                        need + need // GROWTH)

    def truncate(self, length: int) -> None:
        """Drop the tokens after the first ``length`` (a question's, a failed chunk's): the views
        get shorter, the room stays reserved."""
        if int(length) < self._length:
            self._offsets = {}
        self._length = min(int(length), self._length)

    def select(self, index: torch.Tensor) -> "KVStore":
        """A new store of the slots ``index`` [n], in that order, for every row."""
        index = index.to(self._keys.device)
        store = KVStore(self.keys.index_select(2, index), self.values.index_select(2, index),
                        self.positions.index_select(-1, index), self.units.index_select(-1, index),
                        self.chunks.index_select(-1, index), self.heads, self.shared, self.clocks.index_select(-1, index))
        store.padded = self.padded
        return store

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the slots ``index`` [n] (ascending, each once), in place: every row's kept
        slots move to the front, front to back (_move). Safe in place: slot ``index[i] >= i``, so a
        move never overwrites a slot a later one still has to read."""
        index = index.to(self._keys.device)
        if index.numel() > 1 and not bool((index[1:] > index[:-1]).all()):
            raise ValueError("keep() takes ascending slots, each once")
        self._gather(index[None].expand(self.rows, -1), int(index.numel()))

    def compact(self, keep: torch.Tensor) -> None:
        """Keep the slots where ``keep`` ([T], or [rows, T] per row) is True, in order, in place;
        rows shorter than the longest are padded (only when they kept different numbers of tokens)."""
        if self.shared:
            self.keep(torch.nonzero(keep).flatten())
            return
        counts = keep.sum(dim=1)
        width = int(counts.max()) if self.rows else 0
        # kept slots first, in their order (a stable sort of "dropped" flags)
        order = torch.argsort((~keep).to(torch.int32), dim=1, stable=True)[:, :width]
        self._gather(order, width, counts)
        filled = torch.arange(width, device=keep.device)[None, :] < counts[:, None]
        self.padded = not bool(filled.all())
        if self.padded:
            self._keys[:, :, :width].masked_fill_(~filled[None, :, :, None], 0)
            self._values[:, :, :width].masked_fill_(~filled[None, :, :, None], 0)
            self._positions[..., :width].masked_fill_(~filled[:, None, :], 0)
            self._units[..., :width].masked_fill_(~filled, PAD_UNIT)
            self._chunks[..., :width].masked_fill_(~filled, -1)
            self._clocks[..., :width].masked_fill_(~filled, NO_CLOCK)

    def _gather(self, order: torch.Tensor, width: int, counts: torch.Tensor | None = None) -> None:
        """Slot ``order[r, j]`` of row ``r`` to slot ``j``, for j < width (order[r, j] >= j). With
        ``counts`` (per-row compaction) only the first counts[r] slots of row r are moved: the rest
        are padding, which the caller writes over. Without, every row has the same order."""
        # a block of MOVE_BYTES: the copy it makes is bounded, and a layer takes a few calls, not
        # one per 512 tokens (each call on a busy CPU can wait for a core)
        block = max(1, MOVE_BYTES // (self.rows * self._keys.shape[-1] * self._keys.element_size()))
        if counts is None:  # one order for every row: whole slots at a time, no index per element
            self._move(self._slot_views(), order[0, :width], block)
        else:  # H2SVC: each row its own runs (its heads evict whole units on their own)
            for row, count in enumerate(counts.tolist()):
                self._move(self._slot_views(row), order[row, :count], block * self.rows)
        self._length = width
        self._offsets = {}

    def _slot_views(self, row: int | None = None) -> list[tuple[torch.Tensor, int]]:
        """(buffer, slot axis) of every tensor, of all rows or of one (a per-row store)."""
        if row is None:
            tensors = (self._keys, self._values, self._positions, self._units, self._chunks, self._clocks)
        else:
            tensors = (self._keys[:, row:row + 1], self._values[:, row:row + 1], self._positions[row],
                       self._units[row], self._chunks[row], self._clocks[row])
        return [(t, 2 if t.dim() == 4 else t.dim() - 1) for t in tensors]

    def _move(self, views: list[tuple[torch.Tensor, int]], slots: torch.Tensor, block: int) -> None:
        """Slot ``slots[j]`` to slot ``j`` in ``views`` (slots ascending, slots[j] >= j), front to
        back, so that nothing is read after it has been written over.

        Kept slots mostly come in runs of consecutive slots (FIFO: the prefix and the newest tail;
        uniform and H2SVC: whole units). A run moves by plain slice copies, with no index and no
        temporary, in pieces no longer than the distance it moves, so that a piece's source and
        destination never overlap (an overlapping copy_ is undefined). Slots in runs too short, or
        moving too little, for that go by index_select, a block at a time (docs/performance.md,
        "FIFO's compression without the copy")."""
        n = int(slots.numel())
        if n == 0:
            return
        starts = torch.cat((slots.new_zeros(1), torch.nonzero(slots[1:] != slots[:-1] + 1).flatten() + 1))
        lengths = torch.diff(starts, append=starts.new_tensor([n]))
        shifts = slots[starts] - starts
        sliced = (shifts == 0) | (torch.minimum(lengths, shifts) >= MIN_RUN)
        done = 0  # the slots before this one are in place
        for start, length, shift in torch.stack((starts, lengths, shifts))[:, sliced].t().tolist():
            self._take(views, slots, done, start, block)
            done = start + length
            for piece in range(start, done, shift) if shift else ():
                size = min(shift, done - piece)
                for tensor, axis in views:
                    tensor.narrow(axis, piece, size).copy_(tensor.narrow(axis, piece + shift, size))
        self._take(views, slots, done, n, block)

    @staticmethod
    def _take(views: list[tuple[torch.Tensor, int]], slots: torch.Tensor, begin: int, end: int,
              block: int) -> None:
        """Slots ``begin`` .. ``end`` by index_select, a block at a time: a block reads only slots
        at or after its own first one, which no earlier block has written."""
        for start in range(begin, end, block):
            stop = min(end, start + block)
            take = slots[start:stop]
            if bool((take == torch.arange(start, stop, device=take.device)).all()):
                continue  # already in place (the prefix, a window's start)
            for tensor, axis in views:
                tensor.narrow(axis, start, stop - start).copy_(tensor.index_select(axis, take))

    def reindex(self, rotary: RotarySpec, renumber: Renumber, rows: torch.Tensor | None = None,
                clocks: list[int] | None = None) -> None:
        """Renumber the kept tokens of ``rows`` (all of them by default; a shared store renumbers all
        its rows at once) with ``renumber`` and turn their cached keys by the position delta
        (docs/hermes.md §10.3). Each clock is renumbered on its own, with the prefix, as if its
        camera were alone (clocks.py); ``clocks``: only those (None: every clock). Padding slots
        keep their place."""
        positions, units, chunks = self._per_row(self.positions), self._per_row(self.units), \
            self._per_row(self.chunks)
        token_clocks = self._per_row(self.clocks)
        new = positions.clone()
        tracks = range(positions.shape[0]) if rows is None or self.shared else rows.tolist()
        for row in tracks:
            valid = units[row] != PAD_UNIT
            held = clocks_held(units[row][valid], token_clocks[row][valid])
            chosen = held if clocks is None else [c for c in held if c in clocks]
            if len(held) <= 1:  # one clock (or the prefix alone): the whole row, as ever
                parts = [valid] if chosen or not held else []
            else:
                parts = [valid & on_clock(units[row], token_clocks[row], c) for c in chosen]
            for cols in parts:
                new[row][:, cols] = renumber(positions[row][:, cols], units[row][cols], chunks[row][cols])
        delta = self._as_stored(new - positions)
        keys = self.keys
        rotated = rotate_by_delta(keys, rotary, delta)
        if rotated is not keys:  # (the same tensor where no position moved)
            keys.copy_(rotated)
        self._positions[..., :self._length] = self._as_stored(new)
        self._offsets = {}

    # -- reading ----------------------------------------------------------------------------------
    def visible(self, allowed_units: torch.Tensor, clock: int | None = None) -> torch.Tensor:
        """Slots a question limited to ``allowed_units`` may see: those units, and the system prompt
        and the question's own text always; a summary token only when ``allowed_units`` lists
        SUMMARY_UNIT (a time window hides it, docs/interfaces.md "Time windows and evidence");
        never padding. A question on ``clock`` sees only that clock's tokens (clock_mask)."""
        units = self.units
        seen = (units == PREFIX_UNIT) | (units == TEXT_UNIT) | torch.isin(units, allowed_units.to(units.device))
        counted = on_clock(units, self.clocks, clock)
        return seen if counted is None else seen & counted

    def clock_mask(self, clock: int | None) -> torch.Tensor | None:
        """Slots a pass on ``clock`` may see ([T], or [rows, T] per row): the prefix and that clock's
        tokens; None when that is every slot (one camera, or a pass on no clock)."""
        counted = on_clock(self.units, self.clocks, clock)
        if counted is None or bool((counted | (self.units == PAD_UNIT)).all()):
            return None
        return counted

    def attention_mass(self, q: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
        """The attention weights of the newest query over this store, summed over each row's query
        heads: [rows, T] float32 (docs/interfaces.md "Time windows and evidence").

        q [1, rows·G, Q, D] rotated (only its last row, the newest token, is read: it sees every key,
        so no causal mask applies); ``visible`` [T] or [rows, T] (None: every slot), the mask the
        attention itself used. The logits q·K / sqrt(D) in the model's dtype and the softmax in
        float32, as transformers' eager attention computes the weights it returns: SDPA and flash
        return none, so only this, for the chosen layers, is computed again.
        """
        rows, dim = self.rows, self.keys.shape[-1]
        query = q[0, :, -1].reshape(rows, -1, dim)  # [rows, G, D]: a row's query heads
        logits = torch.matmul(query, self.keys[0].transpose(1, 2)).float() / math.sqrt(dim)  # [rows, G, T]
        if visible is not None:
            mask = (visible if visible.dim() == 2 else visible[None]).to(logits.device)
            logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
        return torch.softmax(logits, dim=-1).sum(dim=1)

    def unit_tokens(self, size: int) -> torch.Tensor:
        """[size] tokens each stream unit 0 .. size-1 holds here, summed over the rows."""
        units = self._per_row(self.units).expand(self.rows, -1)
        held = units[units >= 0]
        counts = torch.zeros(size, dtype=torch.long, device=units.device)
        return counts.index_add_(0, held, torch.ones_like(held))

    # -- snapshots ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The tokens held, copied (never the live buffers)."""
        return {"heads": self.heads.cpu(), **{name: getattr(self, name).to("cpu", copy=True)
                                              for name in ("keys", "values", "positions", "units", "chunks",
                                                           "clocks")}}

    def load(self, state: dict[str, Any], geometry) -> None:
        theirs = [int(h) for h in state["heads"]]
        if theirs != self.heads.tolist():
            raise ValueError(f"the snapshot stores KV heads {theirs} where this cache stores {self.heads.tolist()}")
        d = geometry.device
        units = state["units"].to(d)
        clocks = state["clocks"].to(d) if "clocks" in state else torch.full_like(units, NO_CLOCK)
        self._adopt(state["keys"].to(d, geometry.dtype), state["values"].to(d, geometry.dtype),
                    state["positions"].to(d), units, state["chunks"].to(d), clocks)
        self.padded = bool((self.units == PAD_UNIT).any())
