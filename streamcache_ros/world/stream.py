"""A seeded stream of the shape world: its frames, its truth, the questions its truth allows, and
the simulation that makes it (docs/world.md)."""
from __future__ import annotations

import io

import numpy as np

from .questions import ASKERS, ask_seen_in_window
from .truth import (COLOUR_NAMES, COLOURS, FRAME_PERIOD_S, QUESTION_KINDS, SHAPES, STABLE_FRAMES, WINDOW_KINDS, Look, Move,
                    ObjectView, Question, Recolour, random_look)



# -- the stream ------------------------------------------------------------------------------------
class WorldStream:
    """A finished stream: per-frame truth, its events, how it looks; frames are rendered on demand."""

    def __init__(self, seed: int, look: Look, frames: list[tuple[ObjectView, ...]], moves: list[Move],
                 recolours: list[Recolour], jitter: dict[int, np.ndarray], start_stamp: float = 0.0):
        self.seed = seed
        self.look = look
        self.truth = frames
        self.moves = moves
        self.recolours = recolours
        self._jitter = jitter  # object -> its fixed colour offset (when not per frame)
        self.start_stamp = start_stamp

    def __len__(self) -> int:
        return len(self.truth)

    def stamp(self, index: int) -> float:
        return self.start_stamp + index * FRAME_PERIOD_S

    # -- pixels ------------------------------------------------------------------------------------
    def frame(self, index: int) -> np.ndarray:
        """RGB uint8 [H, W, 3] as the node sees it after decoding (JPEG artefacts included)."""
        rgb = self.raw_frame(index)
        if self.look.encoding == "jpeg":
            from PIL import Image  # noqa: PLC0415

            rgb = np.asarray(Image.open(io.BytesIO(self.jpeg(index, rgb))).convert("RGB"))
        return rgb

    def raw_frame(self, index: int) -> np.ndarray:
        look = self.look
        rng = np.random.default_rng((self.seed, index, 1))
        image = np.empty((look.height, look.width, 3), dtype=np.int16)
        image[:] = look.background
        for view in self.truth[index]:
            offset = (rng.integers(-look.colour_jitter, look.colour_jitter + 1, size=3) if look.jitter_per_frame
                      else self._jitter[view.obj])
            colour = np.clip(np.asarray(COLOURS[view.colour]) + offset, 0, 255)
            draw_shape(image, view, colour)
        if look.noise:
            image += rng.integers(-look.noise, look.noise + 1, size=image.shape, dtype=np.int16)
        return np.clip(image, 0, 255).astype(np.uint8)

    def jpeg(self, index: int, rgb: np.ndarray | None = None) -> bytes:
        from PIL import Image  # noqa: PLC0415

        out = io.BytesIO()
        Image.fromarray(self.raw_frame(index) if rgb is None else rgb).save(out, format="JPEG",
                                                                             quality=self.look.jpeg_quality)
        return out.getvalue()

    # -- questions ---------------------------------------------------------------------------------
    def question_points(self) -> list[int]:
        """Every n (frames so far) after which a question may be asked: the last 4 frames are one
        unchanged state, nothing moving."""
        return [n for n in range(STABLE_FRAMES, len(self) + 1) if self.is_still(n)]

    def is_still(self, n: int) -> bool:
        last = self.truth[n - STABLE_FRAMES:n]
        return len(last) == STABLE_FRAMES and all(f == last[0] for f in last)

    def questions(self, n: int, rng: np.random.Generator | None = None, kinds=QUESTION_KINDS,
                  per_kind: int = 1) -> list[Question]:
        """Up to ``per_kind`` different questions of each kind in ``kinds`` whose precondition holds
        after ``n`` frames (seen: 'yes' or 'no' with even odds each time)."""
        if not self.is_still(n):
            raise ValueError(f"no question after {n} frames: the last {STABLE_FRAMES} frames are not one state")
        rng = rng or np.random.default_rng((self.seed, n, 2))
        out = []
        for kind in kinds:
            texts: set[str] = set()
            for _ in range(3 * per_kind):
                if len(texts) == per_kind:
                    break
                q = ASKERS[kind](self, n, rng)
                if q is not None and q.text not in texts:
                    texts.add(q.text)
                    out.append(q)
        return out

    def identity_frames(self, identity: tuple[str, str], n: int) -> list[int]:
        return [i for i in range(n) if any(v.identity == identity for v in self.truth[i])]

    # -- windows -----------------------------------------------------------------------------------
    def window_view(self, first: int, last: int) -> WorldStream:
        """Frames ``first`` .. ``last`` as a stream of their own, the events wholly inside re-indexed:
        what a question over that window is answered from (docs/world.md "Windows")."""
        if not 0 <= first <= last < len(self):
            raise ValueError(f"window {first}..{last} outside the stream's {len(self)} frames")
        moves = [Move(m.obj, m.identity, m.direction, m.first_frame - first, m.last_frame - first)
                 for m in self.moves if first <= m.first_frame and m.last_frame <= last]
        recolours = [Recolour(r.obj, r.shape, r.before, r.after, r.frame - first)
                     for r in self.recolours if first < r.frame <= last]
        return WorldStream(self.seed, self.look, self.truth[first:last + 1], moves, recolours, self._jitter,
                           self.stamp(first))

    def window_questions(self, n: int, first: int, last: int, rng: np.random.Generator,
                         kinds=WINDOW_KINDS) -> list[Question]:
        """Questions asked after ``n`` frames over the window of frames ``first`` .. ``last``: one of
        each kind in ``kinds`` whose precondition holds over the window's own frames."""
        if not last < n <= len(self):
            raise ValueError(f"a window ending at frame {last} asked after {n} frames")
        view = self.window_view(first, last)
        out = []
        for kind in kinds:
            if kind not in WINDOW_KINDS:
                raise ValueError(f"'{kind}' cannot be asked over a window (window kinds: {', '.join(WINDOW_KINDS)})")
            q = ask_seen_in_window(self, n, first, last, rng) if kind == "seen" else ASKERS[kind](view, len(view), rng)
            if q is None:
                continue
            q.after_frames, q.window = n, (first, last)
            q.evidence_frames = [first + f for f in q.evidence_frames] if kind != "seen" else q.evidence_frames
            out.append(q)
        return out


def draw_shape(image: np.ndarray, view: ObjectView, colour: np.ndarray) -> None:
    """Fill the shape's pixels (pixel centres inside the shape) within its box."""
    height, width = image.shape[:2]
    x0, y0, side = view.x0, view.y0, view.side
    c0, c1 = max(int(np.floor(x0)), 0), min(int(np.ceil(x0 + side)), width)
    r0, r1 = max(int(np.floor(y0)), 0), min(int(np.ceil(y0 + side)), height)
    xs = np.arange(c0, c1) + 0.5
    ys = (np.arange(r0, r1) + 0.5)[:, None]
    if view.shape == "circle":
        r = side / 2
        inside = (xs - (x0 + r)) ** 2 + (ys - (y0 + r)) ** 2 <= r * r
    elif view.shape == "square":
        inside = ((xs >= x0) & (xs <= x0 + side)) & ((ys >= y0) & (ys <= y0 + side))
    else:  # upright isosceles triangle, apex at the top centre, base along the bottom of the box
        depth = (ys - y0) / side
        inside = (depth >= 0) & (depth <= 1) & (np.abs(xs - (x0 + side / 2)) <= depth * side / 2)
    image[r0:r1, c0:c1][inside] = colour


# -- simulation ------------------------------------------------------------------------------------
def make_stream(seed: int, num_frames: int, question_points=(), look: Look | None = None,
                still_end: bool = True, start_stamp: float = 0.0, one_object_first: float = 0.7,
                absent: tuple[tuple[str, str], ...] = ()) -> WorldStream:
    """A seeded stream of ``num_frames`` frames. Nothing changes in the 4 frames before each of
    ``question_points`` (and before the end, when ``still_end``), so questions may be asked there.
    ``absent``: identities (shape, colour) never shown, so that a bench can ask about things a long
    stream never saw (every rule of the world holds: they are simply never drawn)."""
    if not 1 <= num_frames <= 3600:
        raise ValueError(f"a stream holds 1..3600 frames, got {num_frames}")
    rng = np.random.default_rng((seed, 0))
    look = look or random_look(rng)
    points = set(int(p) for p in question_points) | ({num_frames} if still_end else set())
    # a frame index at which something may change: not within the 3 frames before a question point
    frozen = {p - k for p in points for k in range(1, STABLE_FRAMES)}
    sim = _Simulation(rng, look, absent)
    sim.start(one_object_first)
    frames: list[tuple[ObjectView, ...]] = [sim.snapshot()]
    hold = int(rng.integers(STABLE_FRAMES, 13))  # frames the current state still lasts
    while len(frames) < num_frames:
        index = len(frames)
        if hold > 1 or index in frozen:
            hold -= 1
            frames.append(sim.snapshot())
            continue
        event = sim.pick_event()
        if event == "move":
            steps = sim.plan_move()
            if steps is None or any(index + s in frozen for s in range(len(steps))):
                frames.append(sim.snapshot())
                continue
            for step in steps:
                if len(frames) >= num_frames:
                    break
                sim.shift(step, len(frames))
                frames.append(sim.snapshot())
            sim.end_move(len(frames) - 1)
        elif sim.apply(event, index):
            frames.append(sim.snapshot())
        else:
            frames.append(sim.snapshot())
            continue
        hold = int(rng.integers(STABLE_FRAMES, 13))
    return WorldStream(seed, look, frames, sim.moves, sim.recolours, sim.fixed_jitter, start_stamp)


HOUR_FRAMES = 3600  # the world's longest stream (docs/world.md); a day chains 24 of them


def kept_out(seed: int, count: int = 3) -> tuple[tuple[str, str], ...]:
    """``count`` identities a benchmark's stream of ``seed`` never shows (``make_stream``'s
    ``absent``), drawn from the seed: a long stream shows every identity, and then has no "no" to
    ask about; these keep one (docs/world.md "Identities kept out")."""
    everything = [(s, c) for s in SHAPES for c in COLOUR_NAMES]
    rng = np.random.default_rng((seed, 7))
    return tuple(everything[i] for i in rng.choice(len(everything), count, replace=False))


class ChainedStream(WorldStream):
    """Streams one after another as one: the truth, events and stamps run on, each frame is rendered
    by the stream it came from. A day at 1 fps is 24 hour-long streams of one look, as a robot that
    moves from room to room sees them (docs/world.md "Longer than an hour")."""

    def __init__(self, parts: list[WorldStream], start_stamp: float = 0.0):
        firsts = np.cumsum([0] + [len(p) for p in parts[:-1]]).tolist()
        moves = [Move(m.obj, m.identity, m.direction, m.first_frame + f, m.last_frame + f)
                 for part, f in zip(parts, firsts) for m in part.moves]
        recolours = [Recolour(r.obj, r.shape, r.before, r.after, r.frame + f)
                     for part, f in zip(parts, firsts) for r in part.recolours]
        truth = [views for part in parts for views in part.truth]
        super().__init__(parts[0].seed, parts[0].look, truth, moves, recolours, {}, start_stamp)
        self.parts, self.firsts = parts, firsts

    def _part(self, index: int) -> tuple[WorldStream, int]:
        k = int(np.searchsorted(self.firsts, index, side="right")) - 1
        return self.parts[k], index - self.firsts[k]

    def raw_frame(self, index: int) -> np.ndarray:
        part, offset = self._part(index)
        return part.raw_frame(offset)


def make_long_stream(seed: int, num_frames: int, question_points=(), look: Look | None = None,
                     absent: tuple[tuple[str, str], ...] = ()) -> WorldStream:
    """A stream of any length: ``make_stream`` up to an hour, past it hour-long streams chained
    (seeds ``seed``, ``seed + 1 000``, ...; one look; each still at its end, so a question may be
    asked at every whole hour and at ``question_points`` inside an hour). ``absent``: identities
    never shown (``make_stream``)."""
    if num_frames <= HOUR_FRAMES:
        return make_stream(seed, num_frames, question_points, look, absent=absent)
    look = look or random_look(np.random.default_rng((seed, 0)))
    parts = []
    for first in range(0, num_frames, HOUR_FRAMES):
        length = min(HOUR_FRAMES, num_frames - first)
        inside = [p - first for p in question_points if first < p <= first + length]
        parts.append(make_stream(seed + 1_000 * (first // HOUR_FRAMES), length, inside, look, absent=absent))
    return ChainedStream(parts)


class _Simulation:
    def __init__(self, rng: np.random.Generator, look: Look, absent=()):
        self.rng = rng
        self.look = look
        self.absent = set(absent)  # identities never drawn
        self.short = min(look.width, look.height)
        self.objects: dict[int, ObjectView] = {}
        self.next_obj = 0
        self.moves: list[Move] = []
        self.recolours: list[Recolour] = []
        self.fixed_jitter: dict[int, np.ndarray] = {}
        self._move: dict | None = None

    def snapshot(self) -> tuple[ObjectView, ...]:
        return tuple(sorted(self.objects.values(), key=lambda v: v.obj))

    def start(self, one_object_first: float) -> None:
        r = self.rng.random()
        count = 1 if r < one_object_first else (0 if r < one_object_first + (1 - one_object_first) / 2 else 2)
        for _ in range(count):
            self.appear()

    def pick_event(self) -> str:
        n = len(self.objects)
        weights = {"appear": 1.0 if n < 2 else 0.0, "leave": 0.8 if n else 0.0,
                   "move": 1.0 if n == 1 else 0.0, "recolour": 0.8 if n else 0.0}
        names = list(weights)
        p = np.asarray([weights[k] for k in names])
        return names[int(self.rng.choice(len(names), p=p / p.sum()))]

    def apply(self, event: str, frame: int) -> bool:
        if event == "appear":
            return self.appear()
        if event == "leave":
            del self.objects[int(self.rng.choice(list(self.objects)))]
            return True
        return self.recolour(frame)

    def _free_identities(self, keep_shape: str | None = None) -> list[tuple[str, str]]:
        taken = {v.identity for v in self.objects.values()} | self.absent
        shapes = [keep_shape] if keep_shape else SHAPES
        return [(s, c) for s in shapes for c in COLOUR_NAMES if (s, c) not in taken]

    def appear(self) -> bool:
        look, rng = self.look, self.rng
        side = float(rng.uniform(0.30, 0.45)) * self.short
        others = list(self.objects.values())
        if others:
            other = others[0]
            # the half the other object does not occupy (by its centre), wholly inside that half
            left_half = other.centre_x >= look.width / 2
            lo, hi = (0.0, look.width / 2 - side) if left_half else (look.width / 2, look.width - side)
            lo = max(lo, 0.0) if left_half else max(lo, other.x0 + other.side + 1)
            hi = min(hi, other.x0 - side - 1) if left_half else hi
        else:
            lo, hi = 0.0, look.width - side
        if hi < lo:
            return False
        x0 = float(rng.uniform(lo, hi))
        y0 = float(rng.uniform(0, look.height - side))
        free = self._free_identities()
        shape, colour = free[int(rng.integers(len(free)))]
        obj = self.next_obj
        self.next_obj += 1
        self.objects[obj] = ObjectView(obj, shape, colour, x0, y0, side)
        j = self.look.colour_jitter
        self.fixed_jitter[obj] = rng.integers(-j, j + 1, size=3)
        return True

    def recolour(self, frame: int) -> bool:
        obj = int(self.rng.choice(list(self.objects)))
        view = self.objects[obj]
        choices = [c for s, c in self._free_identities(view.shape) if c != view.colour]
        colour = choices[int(self.rng.integers(len(choices)))]
        self.objects[obj] = ObjectView(obj, view.shape, colour, view.x0, view.y0, view.side)
        self.recolours.append(Recolour(obj, view.shape, view.colour, colour, frame))
        return True

    def plan_move(self) -> list[float] | None:
        """4-8 horizontal steps of 8-15% of the width, all one way, ending wholly inside the frame."""
        (view,) = self.objects.values()
        width = self.look.width
        room = {"left": view.x0, "right": width - view.x0 - view.side}
        for _ in range(8):
            direction = "left" if self.rng.random() < 0.5 else "right"
            count = int(self.rng.integers(4, 9))
            step = float(self.rng.uniform(0.08, 0.15)) * width
            if count * step > room[direction]:
                count = int(room[direction] // step)
            if count >= 4:
                self._move = {"obj": view.obj, "identity": view.identity, "direction": direction, "first": None}
                return [(-step if direction == "left" else step)] * count
        return None

    def shift(self, dx: float, frame: int) -> None:
        obj = self._move["obj"]
        view = self.objects[obj]
        if self._move["first"] is None:
            self._move["first"] = frame
        self.objects[obj] = ObjectView(obj, view.shape, view.colour, view.x0 + dx, view.y0, view.side)

    def end_move(self, last_frame: int) -> None:
        m = self._move
        if m is not None and m["first"] is not None:
            self.moves.append(Move(m["obj"], m["identity"], m["direction"], m["first"], last_frame))
        self._move = None
