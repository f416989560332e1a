"""The question kinds (docs/world.md: one function per row of the table), each asked of a
stream after ``n`` frames where its precondition holds."""
from __future__ import annotations


import numpy as np

from .truth import COLOUR_NAMES, QUESTION_TEXT, SEEN_PROBE, SHAPES, STABLE_FRAMES, ObjectView, Question



# -- the question kinds (docs/world.md: one function per row of the table) ---------------------------
def _colour_options(true: str, rng: np.random.Generator) -> tuple[list[str], int]:
    wrong = [c for c in COLOUR_NAMES if c != true]
    picked = [wrong[i] for i in rng.choice(len(wrong), size=3, replace=False)]
    return _shuffled([true, *picked], rng)


def _shuffled(options: list[str], rng: np.random.Generator) -> tuple[list[str], int]:
    """``options[0]`` is the true one; returns them in random order with the true one's index."""
    order = rng.permutation(len(options))
    return [options[i] for i in order], int(np.nonzero(order == 0)[0][0])


def _last_frame(stream, n: int) -> tuple[ObjectView, ...]:
    return stream.truth[n - 1]


def _recent_identities(stream, n: int) -> set[tuple[str, str]]:
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
