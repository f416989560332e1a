"""``streamcache-archive map`` and the place a sheet is limited to (docs/places.md "A picture of
where", docs/show.md): the robot's path drawn from the poses the archive keeps with its frames,
coloured by the index's P(yes) for a question, with the named places as labelled circles.

Read from the CLI's read-only connection: the index's vectors are read from their rows as the
store's own cache reads them, so nothing here writes or locks the archive."""
from __future__ import annotations

import json
import math
import pathlib
import sys

import numpy as np

from .archive_common import EXIT_NOTHING, Refused, _camera, _span, _stamp

NO_POSE = "the archive holds no pose: was pose_topic set?"
PATH_COLOUR = "#1f77b4"  # matplotlib's first colour: the tests look for it


# -- the options -----------------------------------------------------------------------------------
def add_place_options(q, with_place: bool = True) -> None:
    q.add_argument("--places", help="a places file (YAML, as the node's places_file)")
    if with_place:
        q.add_argument("--place", help="only the frames taken inside this named place (needs --places)")
        q.add_argument("--place-at", nargs=3, type=float, metavar=("X", "Y", "R"),
                       help="only the frames taken within R metres of (X, Y), in the pose frame")


def add_map_parser(sub, span) -> None:
    q = sub.add_parser("map", help="the robot's path as a PNG, coloured by P(yes) for a question")
    span(q)
    q.add_argument("--out", required=True, help="OUT.png")
    asked = q.add_mutually_exclusive_group()
    asked.add_argument("--question", help='colour the path by the index\'s P(yes): "Did you see a red circle?"')
    asked.add_argument("--identity", help='as --question "Did you see a <identity>?": "red circle"')
    q.add_argument("--retrieval-model", default="",
                   help="the index's dual encoder (default: the one the archive's meta names)")
    q.add_argument("--size", nargs=2, type=int, default=(800, 800), metavar=("W", "H"), help="pixels (800 800)")
    add_place_options(q, with_place=False)


def named_places(args) -> dict:
    if not getattr(args, "places", None):
        return {}
    from ..engine.places import load_places  # noqa: PLC0415 - --help needs no engine import

    try:
        return load_places(pathlib.Path(args.places).expanduser())
    except ValueError as err:
        raise Refused(str(err)) from None


def chosen_place(args):
    """The place --place / --place-at names, None for none."""
    from ..engine.places import Place  # noqa: PLC0415

    if getattr(args, "place_at", None):
        if args.place:
            raise Refused("give --place or --place-at, not both")
        x, y, radius = args.place_at
        if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(radius) and radius > 0):
            raise Refused(f"--place-at needs finite X, Y and a radius R > 0, got {x} {y} {radius}")
        return Place(x, y, radius)
    if not getattr(args, "place", None):
        return None
    if not args.places:
        raise Refused(f"--place {args.place} needs --places FILE (the node's places_file)")
    named = named_places(args)
    if args.place not in named:
        raise Refused(f"unknown place '{args.place}' (named places: {', '.join(sorted(named)) or 'none'})")
    return named[args.place]


def frames_in_place(db, place, since: float, until: float, camera: str):
    """The archived frames taken inside ``place``; a place never entered is refused naming the
    nearest pass, as a question limited to it is (docs/places.md)."""
    from ..engine.recall.archive import poses  # noqa: PLC0415

    inside = poses.frames_in_place(db, place, since, until, camera)
    if len(inside):
        return inside
    nearest = poses.nearest_pass(db, place, since, until, camera)
    if nearest is None:
        raise Refused(NO_POSE)
    distance, stamp = nearest
    raise Refused(f"the robot was never {place.describe()} in that span: the nearest it came was {distance:.2f} m "
                  f"from there, at {stamp:.3f}")


def keep_in_place(thumbs, inside) -> list:
    """The thumbnails of the frames ``inside`` (PosedFrames) names."""
    wanted = {(str(c), round(float(s), 3)) for c, s in zip(inside.cameras, inside.stamps)}
    return [t for t in thumbs if (t.camera, round(float(t.stamp), 3)) in wanted]


# -- the index -------------------------------------------------------------------------------------
def _encoder(db, args):
    """The dual encoder that made the archive's vectors: --retrieval-model, else the meta's
    index_model (a bundled one by its name), else the node's 'auto' for the archive's model."""
    from ..engine.adapters.models import RETRIEVAL_DIR, is_world_model, resolve_retrieval_path  # noqa: PLC0415
    from ..engine.errors import ConfigError  # noqa: PLC0415
    from ..engine.recall.index import RetrievalEncoder  # noqa: PLC0415
    from ..engine.recall.index.calibration import CALIBRATION_FILE  # noqa: PLC0415

    meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    stored, model_id = meta.get("index_model", ""), meta.get("model_id", "")
    if not stored:
        raise Refused("the archive has no index (its node ran with retrieval_model_path off): a question "
                      "cannot be drawn")
    wanted = args.retrieval_model or stored.split("@")[0]
    path = resolve_retrieval_path(wanted, model_id)
    if not args.retrieval_model and not (pathlib.Path(path) / "config.json").is_file():
        path = resolve_retrieval_path("auto", model_id)
    if not path:
        raise Refused(f"the archive was indexed by '{stored}', not found here: give --retrieval-model DIR")
    try:
        encoder = RetrievalEncoder.load(path)
    except ConfigError as err:
        raise Refused(str(err)) from None
    same = encoder.identity == stored if "@" in stored else encoder.model_id == stored
    if not same:  # another encoder's vectors: their cosines mean nothing (sqlite_file.switch_index)
        raise Refused(f"the archive was indexed by '{stored}', '{path}' is '{encoder.identity}': their vectors "
                      "cannot be compared")
    # the node's own scale and bias: the bundled encoder ships its calibration (engine/recall/tier.py attach)
    encoder.calibrate(RETRIEVAL_DIR / CALIBRATION_FILE, shape_world=is_world_model(model_id))
    return encoder


def yes_along(db, args, path, since: float, until: float):
    """P(yes) of each frame of ``path`` (NaN where its chunk is unindexed), and the encoder."""
    from ..engine.recall.archive.spans import span_query  # noqa: PLC0415

    question = args.question or f"Did you see a {args.identity}?"
    encoder = _encoder(db, args)
    query, params = span_query("camera, stamps, frame_vectors, vectors_shape", since, until, args.camera)
    stamps, cameras, vectors = [], [], []
    for camera, stamps_json, blob, shape in db.execute(query + " AND frame_vectors IS NOT NULL", params):
        held = np.frombuffer(blob, dtype=np.float16).reshape(tuple(json.loads(shape)))
        frames = json.loads(stamps_json)
        if len(frames) == len(held):  # a row that does not fit its stamps is unindexed (index_cache.py)
            stamps += frames
            cameras += [camera] * len(frames)
            vectors.append(held)
    if not vectors:
        raise Refused("no frame in that span is indexed (archived before the index, or with it off): "
                      "a question cannot be drawn")
    cosine = np.concatenate(vectors).astype(np.float32) @ encoder.embed_text(question).astype(np.float32)
    p = dict(zip(zip(cameras, np.round(stamps, 3)), encoder.probability(cosine)))
    probability = np.array([p.get((str(c), round(float(s), 3)), np.nan) for c, s in zip(path.cameras, path.stamps)])
    return question, probability, encoder


# -- the picture -----------------------------------------------------------------------------------
def draw_map(path, size, probability=None, threshold: float = 0.5, sighted=None, newest: int | None = None,
             places=(), title: str = ""):
    """A matplotlib Figure of ``path`` (PosedFrames): the line through its poses, coloured by
    ``probability`` where given; ``sighted`` frames marked, the ``newest`` one ringed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.collections import LineCollection  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415
    from matplotlib.patches import Circle  # noqa: PLC0415

    width, height = size
    figure = Figure(figsize=(width / 100, height / 100), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    xy = path.xy
    if probability is None:
        axes.plot(xy[:, 0], xy[:, 1], "-", color=PATH_COLOUR, linewidth=1.5, zorder=2)
    else:
        segments = np.stack([xy[:-1], xy[1:]], axis=1)
        p = np.nan_to_num(probability, nan=-1.0)
        lines = LineCollection(segments, cmap="RdYlGn", linewidths=2.5, zorder=2)
        lines.set_array(np.clip(p[1:], 0.0, 1.0))
        lines.set_clim(0.0, 1.0)
        axes.add_collection(lines)
        figure.colorbar(lines, ax=axes, fraction=0.046, pad=0.04, label=f"P(yes); sighting >= {threshold:.2f}")
        # a stop is many frames at one spot, a segment of no length: its frames as dots, the likeliest on top
        order = np.argsort(p, kind="stable")
        order = order[p[order] >= 0]
        axes.scatter(xy[order, 0], xy[order, 1], c=p[order], cmap="RdYlGn", vmin=0.0, vmax=1.0, s=14, zorder=3)
        unindexed = p < 0
        if unindexed.any():  # grey: the index cannot say there
            axes.plot(xy[unindexed, 0], xy[unindexed, 1], ".", color="0.6", markersize=3, zorder=2)
    axes.plot(*xy[0], "o", color="black", markersize=6, zorder=4, label=f"start {path.stamps[0]:.2f}")
    axes.plot(*xy[-1], "s", color="black", markersize=6, zorder=4, label=f"end {path.stamps[-1]:.2f}")
    if sighted is not None and sighted.any():
        axes.plot(xy[sighted, 0], xy[sighted, 1], "*", color="#7b2cbf", markersize=9, zorder=5,
                  label=f"sightings ({int(sighted.sum())} frames)")
    if newest is not None:
        axes.plot(*xy[newest], "o", markerfacecolor="none", markeredgecolor="#7b2cbf", markersize=18,
                  markeredgewidth=2.5, zorder=6, label=f"newest sighting {path.stamps[newest]:.2f}")
    for place in places:
        axes.add_patch(Circle((place.x, place.y), place.radius, fill=False, edgecolor="0.35", linestyle="--", zorder=1))
        axes.annotate(place.name, (place.x, place.y + place.radius), ha="center", va="bottom", fontsize=9, zorder=3)
    axes.set_aspect("equal", adjustable="datalim")
    axes.autoscale_view()
    frame = path.frame_id or "pose frame unnamed"
    axes.set_xlabel(f"x (m, {frame})")
    axes.set_ylabel(f"y (m, {frame})")
    axes.set_title(title, fontsize=9)
    axes.grid(True, color="0.9", zorder=0)
    axes.legend(loc="best", fontsize=8)
    return figure


def cmd_map(db, args) -> int:
    from ..engine.recall.archive import poses  # noqa: PLC0415
    from ..engine.recall.index.ranking import sightings  # noqa: PLC0415

    since, until = _span(args)
    if min(args.size) < 100:
        raise Refused(f"--size must be at least 100 100 pixels, got {args.size[0]} {args.size[1]}")
    places = list(named_places(args).values())
    path = poses.posed_frames(db, since, until, args.camera)
    if not len(path):
        held = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        print(f"streamcache-archive: {NO_POSE}" if held else "streamcache-archive: nothing archived in that span",
              file=sys.stderr)
        return EXIT_NOTHING
    title = f"{args.folder}  {_camera(args.camera)}  {path.stamps[0]:.2f} .. {path.stamps[-1]:.2f}"
    said = f"wrote {args.out}: {len(path)} posed frame(s) {_stamp(path.stamps[0])} .. {path.stamps[-1]:.2f}"
    if args.question or args.identity:
        question, probability, encoder = yes_along(db, args, path, since, until)
        threshold = encoder.settings.threshold
        above = np.nan_to_num(probability, nan=0.0) >= threshold
        # the newest sighting as a `when` finds it: a run of min_run frames, not one frame alone
        runs = sightings(np.nan_to_num(probability, nan=0.0), threshold, encoder.settings.min_run)
        newest = int(np.flatnonzero(runs)[-1]) if runs.any() else None
        figure = draw_map(path, args.size, probability, threshold, above, newest, places,
                          f"{question}\n{title}")
        said += (f"; {question!r}: {int(above.sum())} frame(s) at or above P(yes) {threshold:.2f}, "
                 + (f"newest sighting at {path.stamps[newest]:.3f} ({path.xy[newest, 0]:.2f}, "
                    f"{path.xy[newest, 1]:.2f})" if newest is not None else "no sighting"))
        unindexed = int(np.isnan(probability).sum())
        if unindexed:
            said += f"; {unindexed} frame(s) not indexed (grey)"
    else:
        figure = draw_map(path, args.size, places=places, title=title)
    figure.savefig(args.out, dpi=100, format="png")
    print(said + f", frame '{path.frame_id}'")
    return 0
