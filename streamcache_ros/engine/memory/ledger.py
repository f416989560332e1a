"""What is in memory: the ledger of stream units, on plain data, testable without a model.

A stream unit is what the cache stores a frame's tokens under (one frame; a temporal patch of two
frames on Qwen2.5-VL). The cache knows units only by id; the ledger knows what each one is: its
camera, the stamps of its frames, the chunk it came in, and how many tokens it had. From that it
answers every question about time and cameras:

- which units a question may see (a camera, a time window: ``visible``), and the position clock
  of each camera (``clock``: its index among the cameras seen; docs/architecture.md "Positions");
- what a set of units holds now (``counts``: frames, stamps, tokens attended over);
- which frames an answer drew on (``rank_evidence``), and the memory timeline (``timeline``);
- forgetting what the cache evicted, and its own part of a snapshot.

It never touches tensors of the cache: the Session hands it the cache's per-unit token counts.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

import torch

from ..errors import QuestionError
from ..status import EvidenceFrame, FrameRetention, MemoryCounts


@dataclass
class UnitInfo:
    stamps: tuple[float, ...]
    camera: str
    chunk: int
    tokens: int = 0  # the unit's tokens when it arrived, per layer (H2SVC: per KV head); 0: a snapshot from before this was kept


STAMP_TOLERANCE = 1e-4  # a frame's stamp as the archive's JSON gives it back


@dataclass(frozen=True)
class Window:
    """A question's time window, both ends inside; open ends are infinities. ``frames``: under a
    place, the stamps of the frames taken inside it (sorted), the only ones the window holds
    (docs/places.md "Questions limited to a place")."""

    since: float = -math.inf
    until: float = math.inf
    frames: np.ndarray | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def describe(stamp: float) -> str:
        return "the start" if stamp == -math.inf else "now" if stamp == math.inf else f"{stamp:.3f}"

    def holds(self, stamp: float) -> bool:
        if not self.since <= stamp <= self.until:
            return False
        if self.frames is None:
            return True
        i = int(np.searchsorted(self.frames, stamp - STAMP_TOLERANCE))
        return i < len(self.frames) and self.frames[i] <= stamp + STAMP_TOLERANCE

    def holds_any(self, stamps) -> bool:
        """Whether a frame of ``stamps`` (a unit's, a chunk's) lies in the window."""
        return any(self.holds(s) for s in stamps)

    def mask(self, stamps: np.ndarray) -> np.ndarray:
        """``holds`` of every stamp of ``stamps``, at once."""
        stamps = np.asarray(stamps, float)
        inside = (stamps >= self.since) & (stamps <= self.until)
        if self.frames is not None and len(stamps):
            if not len(self.frames):
                return np.zeros(len(stamps), bool)
            i = np.minimum(np.searchsorted(self.frames, stamps - STAMP_TOLERANCE), len(self.frames) - 1)
            inside &= np.abs(self.frames[i] - stamps) <= STAMP_TOLERANCE
        return inside

    def around(self, stamps) -> "Window":
        """This window as a replay of the frames ``stamps`` reads it: their span, with the frames
        the window holds among them (all of them without a place)."""
        held = [float(s) for s in stamps if self.holds(float(s))]
        if not held:
            return Window(self.since, self.until, self.frames)
        return Window(max(self.since, min(held)), min(self.until, max(held)),
                      None if self.frames is None else np.asarray(sorted(held)))

    @property
    def placed(self) -> bool:
        return self.frames is not None

    def bounds(self) -> tuple[float, float]:
        return self.since, self.until

    def as_asked(self) -> tuple[float | None, float | None]:
        """``since``, ``until`` as a question takes them: None for an open end."""
        return (None if self.since == -math.inf else self.since, None if self.until == math.inf else self.until)


@dataclass(frozen=True)
class Selection:
    """The units a question sees, and the key filter that shows the cache only those (None: every
    key). A camera keeps its own summary tokens visible; a window hides them, because they fold
    frames of any time together (docs/interfaces.md "Time windows and evidence"). ``clock``: the
    position clock the question is on (its camera's), None for a question about every camera."""

    units: list[int]
    key_filter: list[int] | None
    window: Window | None = None
    clock: int | None = None


class UnitLedger:
    """Units in the cache by id, the cameras seen, and the ids the next chunk gets."""

    def __init__(self, summary_unit: int):
        self.summary_unit = summary_unit  # the cache's id of a compression's summary tokens
        self.clear()

    def clear(self) -> None:
        self.units: dict[int, UnitInfo] = {}
        self.cameras: list[str] = []
        self.next_unit = 0
        self.next_chunk = 0
        # the oldest stamp ever taken in, per camera (evicted or not): whether an answer's reach
        # stops short of what was seen (docs/interfaces.md "How far back an answer reaches")
        self.first_seen: dict[str, float] = {}

    # -- arrivals and departures ------------------------------------------------------------------
    def note_camera(self, camera: str) -> None:
        if camera not in self.cameras:
            self.cameras.append(camera)

    def clock(self, camera: str) -> int:
        """The position clock of ``camera`` (noted if new): its index among the cameras seen. The
        cache stores it beside each token (cache/clocks.py); a snapshot keeps both together."""
        self.note_camera(camera)
        return self.cameras.index(camera)

    def book_chunk(self, camera: str, unit_stamps: list[tuple[float, ...]], tokens_per_unit: int) -> int:
        """Record a chunk the cache took in, its units numbered from ``next_unit`` on; returns its id."""
        chunk = self.next_chunk
        for offset, stamps in enumerate(unit_stamps):
            self.units[self.next_unit + offset] = UnitInfo(tuple(stamps), camera, chunk, tokens_per_unit)
            self.first_seen[camera] = min([self.first_seen.get(camera, math.inf), *stamps])
        self.next_unit += len(unit_stamps)
        self.next_chunk += 1
        return chunk

    def forget(self, evicted=None, held=None) -> None:
        """Drop the units the cache evicted (``evicted``), or every unit not among ``held``."""
        gone = list(evicted) if evicted is not None else [u for u in self.units if u not in set(held)]
        for unit in gone:
            self.units.pop(unit, None)

    # -- selection ----------------------------------------------------------------------------------
    def units_of(self, camera: str) -> list[int]:
        """The units of one camera ("" is a camera name too: frames added without one)."""
        return [u for u, info in self.units.items() if info.camera == camera]

    def window_units(self, units: list[int], window: Window, camera: str = "") -> list[int]:
        """The ``units`` with a frame stamped inside ``window``; QuestionError when there is none."""
        inside = [u for u in units if window.holds_any(self.units[u].stamps)]
        if not inside:
            stamps = self.stamps(units)
            source = f" from camera '{camera}'" if camera else ""
            raise QuestionError(f"no frames{source} in memory between {Window.describe(window.since)} and "
                                f"{Window.describe(window.until)} (the memory holds frames stamped "
                                f"{min(stamps, default=0.0):.3f} to {max(stamps, default=0.0):.3f}): widen since/until")
        return inside

    def visible(self, camera: str = "", window: Window | None = None) -> Selection:
        """What a question about ``camera`` (empty: every camera) over ``window`` sees; QuestionError
        when that is nothing."""
        if not self.units:
            raise QuestionError("no frames in memory yet: wait for the camera stream, then ask again")
        units, key_filter, clock = list(self.units), None, None
        if camera:
            units = self.units_of(camera)
            if not units:
                raise QuestionError(f"no frames from camera '{camera}' in memory")
            key_filter = units + [self.summary_unit]
            clock = self.cameras.index(camera)
        if window is not None:
            units = self.window_units(units, window, camera)
            key_filter = list(units)
        return Selection(units, key_filter, window, clock)

    def stamps(self, units: list[int], window: Window | None = None) -> list[float]:
        """Stamps of the frames of ``units`` (inside ``window`` when given)."""
        window = window or Window()
        return [s for u in units for s in self.units[u].stamps if window.holds(s)]

    def oldest_seen(self, camera: str = "") -> float:
        """The oldest stamp ever taken in from ``camera`` (every camera when empty); +inf for none."""
        return min((s for c, s in self.first_seen.items() if not camera or c == camera), default=math.inf)

    # -- counts -------------------------------------------------------------------------------------
    def counted(self, held, units) -> list[int]:
        """The ``units`` whose frames count as in memory (MemoryCounts): some layer (H2SVC: some KV
        head) still holds at least half of the unit's tokens, by the cache's per-unit ``held``."""
        column = {u: i for i, u in enumerate(held.units.tolist())}
        most = held.counts.max(dim=0).values.tolist() if held.counts.numel() else []
        return [u for u in units if u in column and 2 * most[column[u]] >= (self.units[u].tokens or most[column[u]])]

    def counts(self, held, kv_tokens: int, units=None, window: Window | None = None) -> MemoryCounts:
        """What ``units`` (default: all) hold now, as MemoryCounts defines it, from the cache's
        per-unit tokens ``held`` (a ``UnitTokens``) and its total ``kv_tokens``: a unit's frames
        count when some layer (H2SVC: some KV head) still holds at least half of the unit's tokens,
        so a HERMES frame reduced to a token or two in a few layers is not "in memory". With a time
        ``window``, only its frames count, and the summary tokens, which the window hides, are not
        among the tokens attended over."""
        units = set(self.units if units is None else units)
        column = {u: i for i, u in enumerate(held.units.tolist())}
        counted = self.counted(held, units)
        stamps = self.stamps(counted, window)
        outside = [column[u] for u in column if u not in units]  # frames a question limited to ``units`` skips
        skipped = int(held.counts[:, outside].sum()) if outside else 0
        if window is not None:
            skipped += held.summary
        kv = kv_tokens - round(skipped / held.rows_per_layer)
        return MemoryCounts(len(stamps), min(stamps, default=0.0), max(stamps, default=0.0), kv)

    def camera_counts(self, held, kv_tokens: int) -> dict[str, MemoryCounts]:
        return {camera: self.counts(held, kv_tokens, self.units_of(camera)) for camera in self.cameras}

    # -- evidence and the timeline ------------------------------------------------------------------
    def rank_evidence(self, unit_mass: list[float], summary_mass: float, units: list[int] | None = None,
                      window: Window | None = None, k: int = 3) -> tuple[list[EvidenceFrame], float]:
        """The ``k`` frames of ``units`` (default: all in memory) with the most attention mass
        (``unit_mass[u]``: the mass on unit u's tokens), and the summary tokens' share. A unit's mass
        is shared equally by its frames (inside the window, when one is given); ties go to the newer."""
        units = list(self.units) if units is None else units
        frames = []
        for unit in units:
            stamps = self.stamps([unit], window)
            frames += [(stamp, self.units[unit].camera, unit_mass[unit] / len(stamps)) for stamp in stamps]
        frame_mass = sum(mass for *_, mass in frames)
        share = summary_mass / (frame_mass + summary_mass) if frame_mass + summary_mass > 0 else 0.0
        ranked = sorted((f for f in frames if f[2] > 0), key=lambda f: (-f[2], -f[0]))[:k]
        return [EvidenceFrame(stamp, camera, mass / frame_mass) for stamp, camera, mass in ranked], share

    def timeline(self, layer_tokens: torch.Tensor, layer_rows: torch.Tensor, bank_tokens: dict[int, torch.Tensor],
                 bank_rows: dict[int, int], camera: str = "") -> list[FrameRetention]:
        """Every frame in memory (of ``camera`` when given), oldest first, with the share of its
        tokens each layer (and each bank) still holds, from the cache's retention counts
        (docs/interfaces.md "The memory timeline")."""
        frames = []
        for unit in sorted(self.units, key=lambda u: (min(self.units[u].stamps), u)):
            info = self.units[unit]
            if camera and info.camera != camera:
                continue
            per_row = info.tokens or int((layer_tokens[:, unit] / layer_rows.clamp(min=1)).max().ceil())
            if per_row == 0:
                continue
            layer_kept = (layer_tokens[:, unit] / (per_row * layer_rows.clamp(min=1))).tolist()
            bank_kept = [float(bank_tokens[b][unit]) / (per_row * bank_rows[b]) for b in sorted(bank_tokens)]
            frames += [FrameRetention(stamp, info.camera, unit, layer_kept, bank_kept) for stamp in info.stamps]
        return frames

    # -- snapshots ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"units": {u: asdict(info) for u, info in self.units.items()}, "cameras": list(self.cameras),
                "next_unit": self.next_unit, "next_chunk": self.next_chunk, "first_seen": dict(self.first_seen)}

    @staticmethod
    def read_state(state: dict) -> dict:
        """The ledger's part of a snapshot, checked and typed (raises on anything unreadable)."""
        units = {int(u): UnitInfo(tuple(float(t) for t in i["stamps"]), str(i["camera"]), int(i["chunk"]),
                                  int(i.get("tokens", 0))) for u, i in state["units"].items()}
        first_seen = {str(c): float(s) for c, s in state.get("first_seen", {}).items()}
        for info in units.values():  # a snapshot from before first_seen was kept: what it holds
            first_seen[info.camera] = min([first_seen.get(info.camera, math.inf), *info.stamps])
        return {"units": units, "cameras": [str(c) for c in state["cameras"]],
                "next_unit": int(state["next_unit"]), "next_chunk": int(state["next_chunk"]), "first_seen": first_seen}

    def load_state(self, checked: dict) -> None:
        """Take a state ``read_state`` accepted."""
        self.units, self.cameras = checked["units"], checked["cameras"]
        self.next_unit, self.next_chunk = checked["next_unit"], checked["next_chunk"]
        self.first_seen = checked["first_seen"]
