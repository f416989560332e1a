"""The patrol world: the shape world seen by a robot that patrols named places on a map, so what is
in view depends on where the robot is (docs/world.md "The patrol world"). Every rule of the shape
world still holds in every frame; the patrol adds the robot's pose and where each object lives.
No ROS and no torch here: the bag writer adds the odometry."""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from .stream import HOUR_FRAMES, ChainedStream, WorldStream, _Simulation
from .truth import COLOUR_NAMES, SHAPES, STABLE_FRAMES, Look, Move, Recolour, random_look

MAP_FRAME = "map"
PLACE_NAMES = ("kitchen", "dock", "hall", "lab", "office", "store", "garage", "yard", "lobby", "workshop",
               "pantry", "porch")
PLACE_RADIUS_M = 2.0
PLACE_SPACING_M = 6.0
SPEED_RANGE_MPS = (0.85, 1.2)  # cruise speed of a leg
RAMP_S = 1.0  # speeding up and slowing down: odometry interpolated between samples stays on the path
STOP_JITTER_M = 0.3  # how far from a place's centre the robot stops
DWELL_FRAMES = (8, 20)  # a visit lasts this long, or as long as its objects' states need
RELOCATIONS_PER_HOUR = 4.0
RECOLOUR_CHANCE = 0.1  # per visit with something in view
MOVE_CHANCE = 0.5  # per visit, when one object is alone in view with nothing more to appear


@dataclass(frozen=True)
class MapPlace:
    name: str
    x: float
    y: float
    radius: float = PLACE_RADIUS_M


def patrol_map(seed: int, count: int = 6) -> tuple[MapPlace, ...]:
    """``count`` named places on a 2-D map (metres, frame "map"), centres at least 6 m apart."""
    if not 2 <= count <= len(PLACE_NAMES):
        raise ValueError(f"a patrol map holds 2..{len(PLACE_NAMES)} places, got {count}")
    rng = np.random.default_rng((seed, 11))
    names = [PLACE_NAMES[i] for i in rng.choice(len(PLACE_NAMES), count, replace=False)]
    half = 5.0 * math.sqrt(count)  # room for count places 6 m apart without long searches
    points: list[tuple[float, float]] = []
    while len(points) < count:
        x, y = (round(float(v), 1) for v in rng.uniform(-half, half, size=2))
        if all(math.hypot(x - px, y - py) >= PLACE_SPACING_M for px, py in points):
            points.append((x, y))
    return tuple(MapPlace(name, x, y, PLACE_RADIUS_M) for name, (x, y) in zip(names, points))


def places_yaml(places, frame_id: str = MAP_FRAME) -> str:
    """The node's ``places_file``: the frame and each place's centre and radius."""
    lines = [f"frame_id: {frame_id}", "places:"]
    lines += [f"  {p.name}: {{x: {p.x}, y: {p.y}, radius: {p.radius}}}" for p in places]
    return "\n".join(lines) + "\n"


def _check_places(places) -> tuple[MapPlace, ...]:
    places = tuple(places)
    if len(places) < 2 or len({p.name for p in places}) != len(places):
        raise ValueError("a patrol needs at least 2 places with distinct names")
    for i, a in enumerate(places):
        for b in places[i + 1:]:
            if math.hypot(a.x - b.x, a.y - b.y) < a.radius + b.radius:
                raise ValueError(f"places {a.name} and {b.name} overlap: a pose must lie in one place at most")
    return places


# -- the robot's path ------------------------------------------------------------------------------
def _along(tau: float, span: int, cruise: float) -> tuple[float, float]:
    """Distance covered and speed ``tau`` s into a leg of ``span`` s: a ramp up, cruise, a ramp down."""
    tau = min(max(tau, 0.0), float(span))
    accel = cruise / RAMP_S
    if tau < RAMP_S:
        return 0.5 * accel * tau * tau, accel * tau
    if tau > span - RAMP_S:
        left = span - tau
        return cruise * (span - RAMP_S) - 0.5 * accel * left * left, accel * left
    return cruise * (tau - RAMP_S / 2), cruise


class Patrol:
    """The route, the legs the robot drove (stop at a place, then drive to the next), and where
    every object was, as epochs: (first frame, ((obj, identity, place index), ...))."""

    def __init__(self, places: tuple[MapPlace, ...], route: tuple[int, ...]):
        self.places, self.route = places, route
        self.legs: list[dict] = []  # place, arrive, depart, stop (x, y), yaw (dwelling), span, cruise
        self.epochs: list[tuple[int, tuple]] = []
        self.relocations: list[dict] = []
        self.frame_poses = np.zeros((0, 3))
        self.frame_places = np.zeros(0, dtype=int)

    def pose_at(self, t: float) -> tuple[float, float, float]:
        """(x, y, yaw) ``t`` s after the first frame (before it the robot stands at its first stop)."""
        (x, y), yaw, _ = self._state(t)
        return x, y, yaw

    def speed_at(self, t: float) -> float:
        return self._state(t)[2]

    def _state(self, t: float):
        k = max(0, bisect_right(self._arrivals, t) - 1)
        leg = self.legs[k]
        if t <= leg["depart"]:
            return leg["stop"], leg["yaw"], 0.0
        (x0, y0), (x1, y1) = leg["stop"], leg["target"]
        dist, speed = _along(t - leg["depart"], leg["span"], leg["cruise"])
        heading = math.atan2(y1 - y0, x1 - x0)
        return (x0 + dist * math.cos(heading), y0 + dist * math.sin(heading)), heading, speed

    def finish(self, num_frames: int) -> None:
        self._arrivals = [leg["arrive"] for leg in self.legs]
        self.frame_poses = np.asarray([self.pose_at(float(i)) for i in range(num_frames)])
        centres = np.asarray([(p.x, p.y) for p in self.places])
        radii = np.asarray([p.radius for p in self.places])
        dist = np.linalg.norm(self.frame_poses[:, None, :2] - centres[None], axis=2)
        inside = dist <= radii[None]
        self.frame_places = np.where(inside.any(axis=1), inside.argmax(axis=1), -1)

    def located(self, frame: int) -> tuple:
        return self.epochs[max(0, bisect_right([e[0] for e in self.epochs], frame) - 1)][1]


# -- the simulation --------------------------------------------------------------------------------
class _PatrolSim(_Simulation):
    """The shape world's simulation with objects that live at places: an object keeps its id (and
    its colour jitter) from visit to visit, and no two objects anywhere share an identity, so that
    "where is X" has one answer."""

    def __init__(self, rng, look, absent, frozen):
        super().__init__(rng, look, absent)
        self.frozen = frozen
        self.frames: list[tuple] = []
        self.things: dict[int, list] = {}  # obj -> [identity, place index]
        self._bringing = None
        # frames since the view last changed; none before frame 0, so the first object may be in view
        # from the first frame on, as first_color and first_shape need (docs/world.md)
        self.still = 10 ** 9

    def _free_identities(self, keep_shape=None):
        if self._bringing is not None:
            return [self._bringing]
        taken = {identity for identity, _ in self.things.values()} | self.absent
        return [(s, c) for s in ([keep_shape] if keep_shape else SHAPES) for c in COLOUR_NAMES if (s, c) not in taken]

    def emit(self) -> None:
        self.frames.append(self.snapshot())
        self.still += 1

    def wait(self, hold: int) -> None:
        while self.still < hold or len(self.frames) in self.frozen:
            self.emit()

    def bring(self, obj: int) -> None:
        """The object enters view, in the free half (a smaller side is tried where it does not fit)."""
        self._bringing, self.next_obj = tuple(self.things[obj][0]), obj
        kept = self.fixed_jitter.get(obj)
        shown = any(self.appear() for _ in range(6))
        self._bringing = None
        if kept is not None:
            self.fixed_jitter[obj] = kept
        if shown:
            self.still = 0
            self.emit()

    def take(self, obj: int) -> None:
        del self.objects[obj]
        self.still = 0
        self.emit()

    def recolour_one(self, patrol: Patrol) -> None:
        obj = int(self.rng.choice(sorted(self.objects)))
        view = self.objects[obj]
        choices = [c for _, c in self._free_identities(view.shape)]
        if not choices:
            return
        colour = choices[int(self.rng.integers(len(choices)))]
        self.objects[obj] = type(view)(obj, view.shape, colour, view.x0, view.y0, view.side)
        frame = len(self.frames)
        self.recolours.append(Recolour(obj, view.shape, view.colour, colour, frame))
        self.things[obj][0] = (view.shape, colour)
        self.record(patrol, frame)
        self.still = 0
        self.emit()

    def slide(self) -> None:
        steps = self.plan_move()
        first = len(self.frames)
        if steps is None or any(first + s in self.frozen for s in range(len(steps))):
            self._move = None
            return
        for step in steps:
            self.shift(step, len(self.frames))
            self.emit()
        self.end_move(len(self.frames) - 1)
        self.still = 0

    def record(self, patrol: Patrol, frame: int) -> None:
        now = tuple((obj, tuple(i), p) for obj, (i, p) in sorted(self.things.items()))
        if patrol.epochs and patrol.epochs[-1][0] == frame:
            patrol.epochs[-1] = (frame, now)
        else:
            patrol.epochs.append((frame, now))

    def visit(self, place: int, patrol: Patrol) -> None:
        """Stop at ``place``: its objects appear one at a time, perhaps one moves or one recolours,
        then they leave one at a time; the robot stays at least 8-20 frames."""
        rng, arrive = self.rng, len(self.frames)
        dwell = int(rng.integers(DWELL_FRAMES[0], DWELL_FRAMES[1] + 1))
        here = [obj for obj, (_, p) in sorted(self.things.items()) if p == place]
        here = [here[i] for i in rng.permutation(len(here))]
        for obj in here:
            self.wait(int(rng.integers(STABLE_FRAMES, 8)))
            self.bring(obj)
        if self.objects and rng.random() < RECOLOUR_CHANCE:
            self.wait(int(rng.integers(STABLE_FRAMES, 8)))
            self.recolour_one(patrol)
        while self.objects:
            if len(self.objects) == 1 and rng.random() < MOVE_CHANCE:
                self.wait(int(rng.integers(STABLE_FRAMES, 8)))
                self.slide()
            self.wait(int(rng.integers(STABLE_FRAMES, 8)))
            self.take(int(rng.choice(sorted(self.objects))))
        while len(self.frames) - arrive < dwell:
            self.emit()

    def relocate(self, patrol: Patrol, frame: int, places: int) -> None:
        """An object is carried to another place with room while the robot is on its way."""
        if not self.things:
            return
        obj = int(self.rng.choice(sorted(self.things)))
        counts = [sum(p == k for _, p in self.things.values()) for k in range(places)]
        room = [k for k in range(places) if counts[k] < 2 and k != self.things[obj][1]]
        if not room:
            return
        to = int(room[int(self.rng.integers(len(room)))])
        patrol.relocations.append({"frame": frame, "object": obj, "identity": list(self.things[obj][0]),
                                   "from": patrol.places[self.things[obj][1]].name, "to": patrol.places[to].name})
        self.things[obj][1] = to
        self.record(patrol, frame)


def _route(places: tuple[MapPlace, ...], rng) -> tuple[int, ...]:
    """A cyclic route: from a seeded start, always on to the nearest place not yet on it."""
    route = [int(rng.integers(len(places)))]
    while len(route) < len(places):
        here = places[route[-1]]
        route.append(min((k for k in range(len(places)) if k not in route),
                         key=lambda k: math.hypot(places[k].x - here.x, places[k].y - here.y)))
    return tuple(route)


def _stop(place: MapPlace, rng) -> tuple[float, float]:
    r, a = STOP_JITTER_M * math.sqrt(float(rng.random())), float(rng.uniform(0, 2 * math.pi))
    return place.x + r * math.cos(a), place.y + r * math.sin(a)


def _simulate(seed: int, num_frames: int, frozen: set[int], look: Look, absent, places):
    rng = np.random.default_rng((seed, 0))
    look = look or random_look(rng)
    places = _check_places(places if places is not None else patrol_map(seed))
    patrol = Patrol(places, _route(places, rng))
    sim = _PatrolSim(rng, look, absent, frozen)
    pool = [(s, c) for s in SHAPES for c in COLOUR_NAMES if (s, c) not in set(absent)]
    pool = [pool[i] for i in rng.permutation(len(pool))]
    for k in range(len(places)):
        for _ in range(int(rng.choice(3, p=(0.15, 0.45, 0.4)))):
            if pool:
                sim.things[len(sim.things)] = [pool.pop(), k]
    sim.record(patrol, 0)
    route, step = patrol.route, 0
    last, first = places[route[-1]], places[route[0]]
    stop, yaw = _stop(first, rng), math.atan2(first.y - last.y, first.x - last.x)
    while len(sim.frames) < num_frames:
        place = route[step % len(route)]
        leg = {"place": place, "arrive": len(sim.frames), "stop": stop, "yaw": yaw}
        patrol.legs.append(leg)
        sim.visit(place, patrol)
        leg["depart"] = len(sim.frames) - 1
        step += 1
        target = _stop(places[route[step % len(route)]], rng)
        dist = math.hypot(target[0] - stop[0], target[1] - stop[1])
        span = max(math.ceil(dist / float(rng.uniform(*SPEED_RANGE_MPS)) + RAMP_S), STABLE_FRAMES + 1)
        leg.update(target=target, span=span, cruise=dist / (span - RAMP_S))
        if rng.random() < RELOCATIONS_PER_HOUR * (len(sim.frames) - leg["arrive"] + span) / HOUR_FRAMES:
            sim.relocate(patrol, leg["depart"] + span // 2, len(places))
        for _ in range(span - 1):
            sim.emit()
        stop, yaw = target, math.atan2(target[1] - leg["stop"][1], target[0] - leg["stop"][0])
    patrol.finish(num_frames)
    moves = [m for m in sim.moves if m.last_frame < num_frames]
    recolours = [r for r in sim.recolours if r.frame < num_frames]
    return look, sim.frames[:num_frames], moves, recolours, sim.fixed_jitter, patrol


# -- the streams -----------------------------------------------------------------------------------
class PatrolStream(WorldStream):
    """A shape-world stream seen from a patrolling robot: frames and truth as any world stream,
    and where the robot and every object were (map frame, metres)."""

    def __init__(self, seed, look, frames, moves, recolours, jitter, start_stamp: float = 0.0,
                 patrol: Patrol | None = None, offset: int = 0):
        super().__init__(seed, look, frames, moves, recolours, jitter, start_stamp)
        self.patrol, self.offset = patrol, offset

    @property
    def places(self) -> tuple[MapPlace, ...]:
        return self.patrol.places

    @property
    def route(self) -> tuple[str, ...]:
        return tuple(self.patrol.places[k].name for k in self.patrol.route)

    def pose(self, index: int) -> tuple[float, float, float]:
        x, y, yaw = self.patrol.frame_poses[self.offset + index]
        return float(x), float(y), float(yaw)

    def pose_at(self, t: float) -> tuple[float, float, float]:
        """The pose ``t`` s after this stream's first frame, between frames too (odometry)."""
        return self.patrol.pose_at(self.offset + t)

    def speed_at(self, t: float) -> float:
        return self.patrol.speed_at(self.offset + t)

    def place_at(self, index: int) -> str | None:
        k = int(self.patrol.frame_places[self.offset + index])
        return self.patrol.places[k].name if k >= 0 else None

    def identity_places(self, index: int) -> dict[tuple[str, str], str]:
        return {identity: self.patrol.places[p].name for _, identity, p in self.patrol.located(self.offset + index)}

    def last_seen(self, identity: tuple[str, str], n: int, place: str | None = None) -> int | None:
        """The last frame before ``n`` with ``identity`` in view (taken within ``place``, if given)."""
        identity = tuple(identity)
        for i in range(min(n, len(self)) - 1, -1, -1):
            if any(v.identity == identity for v in self.truth[i]) and (place is None or self.place_at(i) == place):
                return i
        return None

    def ever_in_place(self, identity: tuple[str, str], n: int, place: str) -> bool:
        """Whether ``identity`` was at ``place`` (seen there or not) in some frame before ``n``."""
        first, end = self.offset, self.offset + min(n, len(self))
        epochs = self.patrol.epochs
        for j, (start, where) in enumerate(epochs):
            stop = epochs[j + 1][0] if j + 1 < len(epochs) else math.inf
            if start < end and stop > first and any(
                    i == tuple(identity) and self.patrol.places[p].name == place for _, i, p in where):
                return True
        return False


class ChainedPatrolStream(ChainedStream, PatrolStream):
    """A day of patrol: hour-long patrol streams chained (docs/world.md "Longer than an hour"),
    one simulation under them all, so the route, the poses and the objects run on across hours."""

    def __init__(self, parts: list[PatrolStream], patrol: Patrol, start_stamp: float = 0.0):
        super().__init__(parts, start_stamp)
        self.patrol, self.offset = patrol, 0


def make_patrol_stream(seed: int, num_frames: int, question_points=(), look: Look | None = None,
                       absent: tuple[tuple[str, str], ...] = (), places=None,
                       start_stamp: float = 0.0) -> PatrolStream:
    """A seeded patrol of ``num_frames`` (1..3600) frames, still before each of ``question_points``
    and at the end; ``absent``: identities never shown; ``places``: the map (``patrol_map(seed)``)."""
    if not 1 <= num_frames <= HOUR_FRAMES:
        raise ValueError(f"a stream holds 1..{HOUR_FRAMES} frames, got {num_frames}")
    frozen = _frozen(set(question_points) | {num_frames})
    look, truth, moves, recolours, jitter, patrol = _simulate(seed, num_frames, frozen, look, absent, places)
    return PatrolStream(seed, look, truth, moves, recolours, jitter, start_stamp, patrol)


def make_long_patrol_stream(seed: int, num_frames: int, question_points=(), look: Look | None = None,
                            absent: tuple[tuple[str, str], ...] = (), places=None,
                            start_stamp: float = 0.0) -> PatrolStream:
    """A patrol of any length: up to an hour ``make_patrol_stream``, past it hour-long streams
    (seeds ``seed``, ``seed + 1 000``, ...) cut from one simulation, each still at its end."""
    if num_frames <= HOUR_FRAMES:
        return make_patrol_stream(seed, num_frames, question_points, look, absent, places, start_stamp)
    hours = set(range(HOUR_FRAMES, num_frames, HOUR_FRAMES))
    frozen = _frozen(set(question_points) | hours | {num_frames})
    look, truth, moves, recolours, jitter, patrol = _simulate(seed, num_frames, frozen, look, absent, places)
    parts = []
    for first in range(0, num_frames, HOUR_FRAMES):
        end = min(first + HOUR_FRAMES, num_frames)
        part_moves = [Move(m.obj, m.identity, m.direction, m.first_frame - first, m.last_frame - first)
                      for m in moves if first <= m.first_frame < end]
        part_recolours = [Recolour(r.obj, r.shape, r.before, r.after, r.frame - first)
                          for r in recolours if first <= r.frame < end]
        parts.append(PatrolStream(seed + 1_000 * (first // HOUR_FRAMES), look, truth[first:end], part_moves,
                                  part_recolours, jitter, start_stamp + first, patrol, first))
    return ChainedPatrolStream(parts, patrol, start_stamp)


def _frozen(points) -> set[int]:
    """Frames at which nothing in view may change: the 3 before each point where a question may be asked."""
    return {int(p) - k for p in points for k in range(1, STABLE_FRAMES)}
