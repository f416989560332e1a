"""The shape world: seeded camera streams with ground truth, and the questions asked about them.

The rules are those of docs/world.md: one uniform background per stream, filled circles, squares and
upright triangles in six colours, at most two objects in view, every state at least 4 frames, and
between states exactly one event (appear, leave, move, recolour). Questions are asked only where
their precondition holds, with the options the page lists and the true option's index.

    stream = make_stream(seed=7, num_frames=64, question_points=[32, 64])
    rgb = stream.frame(10)                      # [H, W, 3] uint8, as the camera would publish it
    for q in stream.questions(64):              # every kind whose precondition holds after 64 frames
        print(q.kind, q.text, q.options, q.options[q.answer_index])

Where any camera stream will do (the demo bag, the tests, the benchmarks), ``world_frames`` yields the
frames of one fixed seeded stream at the size asked for:

    frames = list(world_frames(8, start=40, height=120, width=160))

No ROS and no torch here: the bag writer, the trainer and the accuracy benchmark all use it.
"""
from __future__ import annotations

import functools
import io
from dataclasses import dataclass, field

import numpy as np

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40), "green": (40, 190, 70), "blue": (50, 100, 235),
    "yellow": (235, 215, 40), "white": (240, 240, 240), "purple": (160, 70, 210),
}
COLOUR_NAMES = tuple(COLOURS)
SHAPES = ("circle", "square", "triangle")
ENCODINGS = ("rgb8", "bgr8", "jpeg")
NAMED_SIZES = ((160, 120), (320, 240), (640, 480), (1280, 720))

# now_shape last: a kind added later leaves the questions drawn for the earlier kinds as they were
OPTION_KINDS = ("now_color", "now_count", "first_color", "first_shape", "seen", "before_color", "moved",
                "now_shape")
# last_seen and first_seen are answered through the when search, not from an option (docs/world.md)
QUESTION_KINDS = OPTION_KINDS + ("last_seen", "first_seen")
LONG_MEMORY_KINDS = ("first_color", "first_shape", "seen", "last_seen", "first_seen")
# the kinds a time window can carry: what the window's own frames hold decides them (docs/world.md
# "Windows"); before_color and moved need events that a window may cut in half
WINDOW_KINDS = ("seen", "now_color", "now_count", "now_shape", "first_color", "first_shape")
QUESTION_TEXT = {
    "now_color": "What color is the {shape} now?",
    "now_count": "How many objects are in view now?",
    "now_shape": "What shape is the {colour} object now?",
    "first_color": "What color was the first object you saw?",
    "first_shape": "What shape was the first object you saw?",
    "seen": "Did you see a {colour} {shape}?",
    "before_color": "What color was the {shape} before it changed color?",
    "moved": "Which way did the {colour} {shape} move?",
    "last_seen": "When did you last see the {colour} {shape}?",
    "first_seen": "When did you first see the {colour} {shape}?",
}
# the yes/no question the when search asks for last_seen and first_seen (docs/world.md)
SEEN_PROBE = "Did you see a {colour} {shape}?"
STABLE_FRAMES = 4  # a state lasts at least this long; the last 4 frames before a question are one state
FRAME_PERIOD_S = 1.0


# -- ground truth ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectView:
    """One object in one frame. ``obj`` names the physical object (it keeps its shape; a recolour
    changes its colour); the box is (x0, y0, side) in pixels, the box square."""

    obj: int
    shape: str
    colour: str
    x0: float
    y0: float
    side: float

    @property
    def identity(self) -> tuple[str, str]:
        return self.shape, self.colour

    @property
    def centre_x(self) -> float:
        return self.x0 + self.side / 2


@dataclass(frozen=True)
class Move:
    obj: int
    identity: tuple[str, str]
    direction: str  # "left" | "right"
    first_frame: int
    last_frame: int


@dataclass(frozen=True)
class Recolour:
    obj: int
    shape: str
    before: str
    after: str
    frame: int  # the first frame in the new colour


@dataclass
class Question:
    kind: str
    text: str
    options: list[str]
    answer_index: int  # the true option; -1 for last_seen (no options)
    after_frames: int  # asked once this many frames of the stream are in
    evidence_frames: list[int] = field(default_factory=list)  # frames that show the answer
    answer_frame: int = -1  # last_seen / first_seen: the last / first frame the identity was in view
    probe: str = ""  # last_seen / first_seen: the yes/no question the when search asks
    # a time window (frame indices, both inside): the question is answered as if the stream were
    # these frames (docs/world.md "Windows"); None: the whole stream so far
    window: tuple[int, int] | None = None
    # how a trainer drew it, where that is not its kind: "hard" (a hard negative), "compare" (a
    # comparison window); "" for the world's own questions
    tag: str = ""

    @property
    def answer(self) -> str:
        return self.options[self.answer_index] if self.answer_index >= 0 else ""

    def to_dict(self) -> dict:
        return {"kind": self.kind, "text": self.text, "options": list(self.options),
                "answer_index": self.answer_index, "answer": self.answer, "after_frames": self.after_frames,
                "evidence_frames": list(self.evidence_frames), "answer_frame": self.answer_frame,
                "probe": self.probe,
                "window": list(self.window) if self.window else None}


@dataclass(frozen=True)
class Look:
    """How a stream looks: its size, background, noise, colour jitter and encoding."""

    width: int
    height: int
    background: tuple[int, int, int]
    noise: int  # per-pixel uniform noise in [-noise, noise], 0..8
    colour_jitter: int  # each channel of an object's colour within +-colour_jitter of nominal, 0..20
    jitter_per_frame: bool  # a new jitter every frame, or one per object
    encoding: str  # rgb8 | bgr8 | jpeg
    jpeg_quality: int = 90

    def __post_init__(self):
        if not (96 <= self.width <= 1280 and 96 <= self.height <= 1280):
            raise ValueError(f"frame size {self.width}x{self.height} outside 96..1280 px")
        if not (3 * self.width >= 4 * self.height and 9 * self.width <= 16 * self.height):
            raise ValueError(f"aspect ratio {self.width / self.height:.3f} outside 4:3..16:9")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got '{self.encoding}'")


def random_look(rng: np.random.Generator) -> Look:
    """A look drawn over the whole range the world allows."""
    if rng.random() < 0.4:
        width, height = NAMED_SIZES[int(rng.integers(len(NAMED_SIZES)))]
    else:
        aspect = float(rng.uniform(4 / 3, 16 / 9))
        height = int(np.exp(rng.uniform(np.log(96), np.log(1280 / aspect))))
        width = min(1280, int(round(height * aspect)))
        # rounding may leave the range by a pixel: bring the height back inside 4:3..16:9
        height = max(96, min(height, (3 * width) // 4, 1280), -(-9 * width // 16))
    return Look(width=width, height=height, background=tuple(int(c) for c in rng.integers(20, 91, size=3)),
                noise=int(rng.integers(0, 9)) if rng.random() < 0.75 else 0,
                colour_jitter=int(rng.integers(0, 21)), jitter_per_frame=bool(rng.random() < 0.5),
                encoding=ENCODINGS[int(rng.integers(3))], jpeg_quality=int(rng.integers(60, 96)))


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


# -- the question kinds (docs/world.md: one function per row of the table) ---------------------------
def _colour_options(true: str, rng: np.random.Generator) -> tuple[list[str], int]:
    wrong = [c for c in COLOUR_NAMES if c != true]
    picked = [wrong[i] for i in rng.choice(len(wrong), size=3, replace=False)]
    return _shuffled([true, *picked], rng)


def _shuffled(options: list[str], rng: np.random.Generator) -> tuple[list[str], int]:
    """``options[0]`` is the true one; returns them in random order with the true one's index."""
    order = rng.permutation(len(options))
    return [options[i] for i in order], int(np.nonzero(order == 0)[0][0])


def _last_frame(stream: WorldStream, n: int) -> tuple[ObjectView, ...]:
    return stream.truth[n - 1]


def _recent_identities(stream: WorldStream, n: int) -> set[tuple[str, str]]:
    return {v.identity for f in stream.truth[n - STABLE_FRAMES:n] for v in f}


def ask_now_color(stream, n, rng):
    last = _last_frame(stream, n)
    shapes = [s for s in SHAPES if sum(v.shape == s for v in last) == 1]
    if not shapes:
        return None
    shape = shapes[int(rng.integers(len(shapes)))]
    view = next(v for v in last if v.shape == shape)
    options, answer = _colour_options(view.colour, rng)
    return Question("now_color", QUESTION_TEXT["now_color"].format(shape=shape), options, answer, n, [n - 1])


def ask_now_count(stream, n, rng):
    count = str(len(_last_frame(stream, n)))
    options, answer = _shuffled([count] + [c for c in "012" if c != count], rng)
    return Question("now_count", QUESTION_TEXT["now_count"], options, answer, n, [n - 1])


def _first_object(stream, n):
    first = stream.truth[0]
    if len(first) != 1 or first[0].identity in _recent_identities(stream, n):
        return None
    return first[0]


def ask_first_color(stream, n, rng):
    view = _first_object(stream, n)
    if view is None:
        return None
    options, answer = _colour_options(view.colour, rng)
    return Question("first_color", QUESTION_TEXT["first_color"], options, answer, n, [0])


def ask_first_shape(stream, n, rng):
    view = _first_object(stream, n)
    if view is None:
        return None
    options, answer = _shuffled([view.shape] + [s for s in SHAPES if s != view.shape], rng)
    return Question("first_shape", QUESTION_TEXT["first_shape"], options, answer, n, [0])


def ask_seen(stream, n, rng):
    recent = _recent_identities(stream, n)
    seen = {v.identity for f in stream.truth[:n] for v in f}
    yes = sorted(seen - recent)
    no = sorted({(s, c) for s in SHAPES for c in COLOUR_NAMES} - seen)
    want_yes = rng.random() < 0.5
    if (want_yes and not yes) or (not want_yes and not no):
        want_yes = not want_yes
    pool = yes if want_yes else no
    if not pool:
        return None
    shape, colour = pool[int(rng.integers(len(pool)))]
    options, answer = _shuffled(["yes", "no"] if want_yes else ["no", "yes"], rng)
    evidence = stream.identity_frames((shape, colour), n) if want_yes else []
    return Question("seen", QUESTION_TEXT["seen"].format(colour=colour, shape=shape), options, answer, n, evidence)


def ask_now_shape(stream, n, rng):
    last = _last_frame(stream, n)
    colours = [c for c in COLOUR_NAMES if sum(v.colour == c for v in last) == 1]
    if not colours:
        return None
    colour = colours[int(rng.integers(len(colours)))]
    view = next(v for v in last if v.colour == colour)
    options, answer = _shuffled([view.shape] + [s for s in SHAPES if s != view.shape], rng)
    return Question("now_shape", QUESTION_TEXT["now_shape"].format(colour=colour), options, answer, n, [n - 1])


def ask_seen_in_window(stream, n, first, last, rng):
    """seen over the window ``first`` .. ``last``: yes when the identity is in view in some frame
    inside it. Half of the 'no' answers name an identity seen outside the window (before ``n``), so
    that the window, not the whole stream, decides."""
    everything = {(s, c) for s in SHAPES for c in COLOUR_NAMES}
    inside = sorted({v.identity for f in stream.truth[first:last + 1] for v in f})
    outside = sorted({v.identity for f in stream.truth[:n] for v in f} - set(inside))
    never = sorted(everything - set(inside) - set(outside))
    want_yes = bool(inside) and rng.random() < 0.5
    if want_yes:
        pool = inside
    else:
        pool = outside if outside and (not never or rng.random() < 0.5) else never
    if not pool:  # every identity is in the window: no 'no' to ask, so a present one is asked
        want_yes, pool = True, inside
    shape, colour = pool[int(rng.integers(len(pool)))]
    options, answer = _shuffled(["yes", "no"] if want_yes else ["no", "yes"], rng)
    evidence = [i for i in range(first, last + 1) if any(v.identity == (shape, colour) for v in stream.truth[i])]
    return Question("seen", QUESTION_TEXT["seen"].format(colour=colour, shape=shape), options, answer, n, evidence)


def ask_seen_hard_negative(stream, n, first, last, rng):
    """seen over the window ``first`` .. ``last``, answered no, about an identity that shares its
    colour or its shape with one in view inside the window: a model that reads colour and shape
    apart, without binding them, says yes here (docs/world-models.md "Hard negatives")."""
    everything = {(s, c) for s in SHAPES for c in COLOUR_NAMES}
    inside = {v.identity for f in stream.truth[first:last + 1] for v in f}
    near = sorted(i for i in everything - inside if any(i[0] == s or i[1] == c for s, c in inside))
    if not near:
        return None
    shape, colour = near[int(rng.integers(len(near)))]
    options, answer = _shuffled(["no", "yes"], rng)
    return Question("seen", QUESTION_TEXT["seen"].format(colour=colour, shape=shape), options, answer, n, [],
                    window=(first, last), tag="hard")


def comparison_questions(stream, n, rng, margin: int = 3) -> list[Question]:
    """``moved`` and ``before_color`` over a short window around one move and one recolour that
    ended before frame ``n``: the two moments the answer compares, and little else, so a model is
    taught the comparison itself (docs/world-models.md "Comparisons"). Answered as any windowed
    question is, from the window's own frames."""
    out = []
    moves = [m for m in stream.moves if m.last_frame < n - 1]
    recolours = [r for r in stream.recolours if 0 < r.frame < n - 1]
    spans = []
    if moves:
        m = moves[int(rng.integers(len(moves)))]
        spans.append(("moved", m.first_frame - 1, m.last_frame))
    if recolours:
        r = recolours[int(rng.integers(len(recolours)))]
        spans.append(("before_color", r.frame - 1, r.frame))
    for kind, start, end in spans:
        first = max(0, start - int(rng.integers(0, margin + 1)))
        last = min(n - 1, end + int(rng.integers(0, margin + 1)))
        view = stream.window_view(first, last)
        q = ASKERS[kind](view, len(view), rng)
        if q is None:
            continue
        q.after_frames, q.window, q.tag = n, (first, last), "compare"
        q.evidence_frames = [first + f for f in q.evidence_frames]
        out.append(q)
    return out


def ask_before_color(stream, n, rng):
    last = _last_frame(stream, n)
    candidates = []
    for shape in SHAPES:
        views = [v for v in last if v.shape == shape]
        if len(views) != 1:
            continue
        # recolours of this object while in view (a recolour happens in view by construction)
        changes = [r for r in stream.recolours if r.obj == views[0].obj and r.frame < n]
        if changes:
            candidates.append((shape, changes[-1]))
    if not candidates:
        return None
    shape, change = candidates[int(rng.integers(len(candidates)))]
    options, answer = _colour_options(change.before, rng)
    return Question("before_color", QUESTION_TEXT["before_color"].format(shape=shape), options, answer, n,
                    [change.frame - 1, change.frame])


def ask_moved(stream, n, rng):
    last = _last_frame(stream, n)
    candidates = []
    for view in last:
        moves = [m for m in stream.moves if m.identity == view.identity and m.last_frame < n]
        if moves:
            candidates.append((view, moves[-1]))
    if not candidates:
        return None
    view, move = candidates[int(rng.integers(len(candidates)))]
    options, answer = _shuffled([move.direction, "right" if move.direction == "left" else "left"], rng)
    text = QUESTION_TEXT["moved"].format(colour=view.colour, shape=view.shape)
    return Question("moved", text, options, answer, n, list(range(move.first_frame - 1, move.last_frame + 1)))


def ask_last_seen(stream, n, rng):
    recent = _recent_identities(stream, n)
    gone = sorted({v.identity for f in stream.truth[:n] for v in f} - recent)
    if not gone:
        return None
    shape, colour = gone[int(rng.integers(len(gone)))]
    frames = stream.identity_frames((shape, colour), n)
    return Question("last_seen", QUESTION_TEXT["last_seen"].format(colour=colour, shape=shape), [], -1, n,
                    frames, answer_frame=frames[-1], probe=SEEN_PROBE.format(colour=colour, shape=shape))


def ask_first_seen(stream, n, rng):
    seen = sorted({v.identity for f in stream.truth[:n] for v in f})
    if not seen:
        return None
    shape, colour = seen[int(rng.integers(len(seen)))]
    frames = stream.identity_frames((shape, colour), n)
    return Question("first_seen", QUESTION_TEXT["first_seen"].format(colour=colour, shape=shape), [], -1, n,
                    frames, answer_frame=frames[0], probe=SEEN_PROBE.format(colour=colour, shape=shape))


ASKERS = {"now_color": ask_now_color, "now_count": ask_now_count, "first_color": ask_first_color,
          "first_shape": ask_first_shape, "seen": ask_seen, "before_color": ask_before_color,
          "moved": ask_moved, "now_shape": ask_now_shape, "last_seen": ask_last_seen,
          "first_seen": ask_first_seen}


# -- one fixed stream for whoever needs frames (demo bag, tests, benchmarks) ------------------------
FIXED_STREAM_SEED = 800_000_777  # in the tests' seed range (docs/world-models.md): no training run draws it
FIXED_STREAM_SEGMENT_FRAMES = 3600  # make_stream's longest stream; longer runs chain seeded streams


def fixed_look(height: int, width: int) -> Look:
    """How the fixed stream looks at a size: a dark flat background, a little sensor noise, each
    object's colour jittered once, rgb8. The size must be one the world allows (docs/world.md)."""
    return Look(width=width, height=height, background=(40, 40, 50), noise=6, colour_jitter=10,
                jitter_per_frame=False, encoding="rgb8")


@functools.lru_cache(maxsize=8)
def _fixed_segment(seed: int, segment: int, height: int, width: int) -> WorldStream:
    """Frames segment * FIXED_STREAM_SEGMENT_FRAMES onward of the fixed stream: a stream of its own
    (seed + segment), always generated at full length so a frame never depends on how many are asked."""
    return make_stream(seed + segment, FIXED_STREAM_SEGMENT_FRAMES, look=fixed_look(height, width),
                       still_end=False)


def world_frame(index: int, height: int = 120, width: int = 160, seed: int = FIXED_STREAM_SEED) -> np.ndarray:
    """Frame ``index`` of the fixed stream at ``height`` x ``width``, RGB uint8 [height, width, 3].
    Deterministic; any index >= 0 (past 3600 frames the stream goes on in the next seed's stream)."""
    if index < 0:
        raise ValueError(f"frame index must be >= 0, got {index}")
    segment, offset = divmod(index, FIXED_STREAM_SEGMENT_FRAMES)
    return _fixed_segment(seed, segment, height, width).frame(offset)


def world_frames(n: int, start: int = 0, height: int = 120, width: int = 160, seed: int = FIXED_STREAM_SEED):
    """Yield frames ``start`` .. ``start + n - 1`` of the fixed stream (``world_frame``)."""
    for index in range(start, start + n):
        yield world_frame(index, height, width, seed)
