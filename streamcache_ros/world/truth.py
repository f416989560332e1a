"""The shape world's vocabulary and ground truth (docs/world.md): colours, shapes, sizes, the
question kinds and their texts, what is in view in a frame, the events, a question, a look."""
from __future__ import annotations

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
