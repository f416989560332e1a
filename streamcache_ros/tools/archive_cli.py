"""``streamcache-archive``: look at what a robot remembers, from its archive folder (docs/show.md).

    streamcache-archive ls --since 1700000000 --until 1700000600     # chunks: stamps, camera, standing answers
    streamcache-archive show 1700000123.5 --camera /front/image_raw frame.jpg   # the frame nearest that stamp
    streamcache-archive sheet --since 1700000000 --until 1700003600 morning.png # a contact sheet with P(yes)
    streamcache-archive backup /mnt/usb/archive-monday            # SQLite's online backup, safe while the node runs
    streamcache-archive check                                     # integrity, sizes, holes
    streamcache-archive map --out path.png --identity "red circle" --places places.yaml  # where (docs/places.md)

The folder: ``--archive DIR``, else the default folder of the node ``--node`` (default
/streamcache/streamcache_node, the launch files' node: <ROS home>/streamcache/archive/<its name>).
The database is opened read-only (a WAL reader beside the node's writer, its lock left alone);
only ``backup`` writes, and only at DEST. Stamps are seconds on the camera's clock, as the node's
answers give them. Exit codes: 0 done, 1 nothing to show (no such frame, a damaged file), 2 not an
archive or a bad argument (one line on stderr).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sqlite3
import sys

from .archive_common import EXIT_NOTHING, EXIT_REFUSED, Refused, _camera, _span, _stamp  # noqa: F401
DB_NAME = "archive.sqlite"  # engine/recall/archive/store.py's; kept here so --help needs no engine import
DEFAULT_NODE = "/streamcache/streamcache_node"


# -- opening ---------------------------------------------------------------------------------------
def archive_path(args) -> pathlib.Path:
    """The archive's folder: --archive, or the node's default folder (node/snapshots.py's rule)."""
    if args.archive:
        folder = pathlib.Path(args.archive).expanduser()
        return folder.parent if folder.name == DB_NAME and folder.is_file() else folder
    from ..node.snapshots import DEFAULT_ARCHIVE, archive_folder  # noqa: PLC0415 - no rclpy there

    return pathlib.Path(archive_folder(DEFAULT_ARCHIVE, args.node))


def open_readonly(folder: pathlib.Path) -> sqlite3.Connection:
    """The archive's database, read-only: never created, never written, never locked against the
    node (WAL: a reader sees every committed chunk while the node writes)."""
    path = folder / DB_NAME
    if not path.is_file():
        raise Refused(f"'{folder}' is not a streamcache archive: no {DB_NAME} there")
    try:
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall()) if "meta" in tables else {}
    except sqlite3.DatabaseError as err:
        raise Refused(f"'{path}' is not a streamcache archive: {err}") from None
    if "chunks" not in tables or "format" not in meta:
        db.close()
        raise Refused(f"'{path}' is not a streamcache archive: no chunks table and format in meta")
    return db


def _chunks(db: sqlite3.Connection, since: float, until: float, camera: str) -> list[dict]:
    from ..engine.recall.archive.spans import span_query  # noqa: PLC0415 - --help needs no engine import
    query, args = span_query("id, camera, first_stamp, last_stamp, stamps, watch, bytes, pinned", since, until, camera)
    out = []
    for chunk_id, cam, first, last, stamps, watch, size, pinned in db.execute(query + " ORDER BY first_stamp, id", args):
        frames = [s for s in json.loads(stamps) if since <= s <= until]
        if frames:  # the chunk's span, and the stamps of its frames inside the span asked
            out.append({"id": chunk_id, "camera": cam, "first_stamp": first, "last_stamp": last, "frames": len(frames),
                        "frames_first_stamp": min(frames), "frames_last_stamp": max(frames),
                        "bytes": size, "pinned": bool(pinned), "watch": json.loads(watch)})
    return out


# -- the commands ----------------------------------------------------------------------------------
def cmd_ls(db, args) -> int:
    since, until = _span(args)
    rows = _chunks(db, since, until, args.camera)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        answers = ", ".join(f"{q!r} {p:.2f}" for q, p in sorted(row["watch"].items()))
        # a span that cuts a chunk lists the chunk's frames inside it, the chunk's own span beside
        inside = (row["frames_first_stamp"], row["frames_last_stamp"])
        cut = inside != (row["first_stamp"], row["last_stamp"])
        print(f"{row['id']:>7}  {_camera(row['camera'])}  {_stamp(inside[0])} .. {inside[1]:.2f}  "
              f"{row['frames']} frame(s)" + (f" (of a chunk {row['first_stamp']:.2f} .. "
                                             f"{row['last_stamp']:.2f})" if cut else "")
              + f"  {row['bytes']} B{'  pinned' if row['pinned'] else ''}" + (f"  P(yes): {answers}" if answers else ""))
    print(f"{len(rows)} chunk(s)", file=sys.stderr)
    return 0


def cmd_show(db, args) -> int:
    from ..engine.recall.archive.thumbnails import frame_near, has_thumbnails  # noqa: PLC0415

    if not has_thumbnails(db):
        print("no thumbnails in this archive (written before them)", file=sys.stderr)
        return EXIT_NOTHING
    found = frame_near(db, args.stamp, args.camera)
    if found is None:
        print(f"no archived frame{' of ' + args.camera if args.camera else ''} has a thumbnail "
              "(archive_thumbnail_px 0, or none held)", file=sys.stderr)
        return EXIT_NOTHING
    _write_image(found.jpeg, pathlib.Path(args.out))
    print(f"wrote {args.out}: {_camera(found.camera)}, stamp {_stamp(found.stamp)} ({found.stamp - args.stamp:+.2f} s from "
          f"the one asked)")
    return 0


def _write_image(jpeg: bytes, out: pathlib.Path) -> None:
    """The stored JPEG as it is, or converted for another extension (.png)."""
    if out.suffix.lower() in (".jpg", ".jpeg", ""):
        out.write_bytes(jpeg)
        return
    import io  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415

    Image.open(io.BytesIO(jpeg)).save(out)


def cmd_sheet(db, args) -> int:
    from ..engine.recall.archive.thumbnails import frames_between  # noqa: PLC0415
    from .archive_pictures import contact_sheet  # noqa: PLC0415

    from .archive_map import chosen_place, frames_in_place, keep_in_place  # noqa: PLC0415

    since, until = _span(args)
    place = chosen_place(args)
    thumbs = frames_between(db, since, until, args.camera)
    if place is not None:  # the frames the robot took inside the place (docs/places.md)
        thumbs = keep_in_place(thumbs, frames_in_place(db, place, since, until, args.camera))
    if not thumbs:
        print("no thumbnails in that span (archive_thumbnail_px 0, or nothing held there)", file=sys.stderr)
        return EXIT_NOTHING
    if len(thumbs) > args.max_frames:  # evenly over the span, its first and last kept
        picks = sorted({round(i * (len(thumbs) - 1) / (args.max_frames - 1)) for i in range(args.max_frames)})
        thumbs = [thumbs[i] for i in picks]
    chunks = _chunks(db, since, until, args.camera)
    where = f" inside {place.describe()}" if place is not None else ""
    image = contact_sheet(thumbs, chunks, args.columns, title=f"{args.folder}{where}")
    image.save(args.out)
    print(f"wrote {args.out}: {len(thumbs)} frame(s){where} {_stamp(thumbs[0].stamp)} .. {thumbs[-1].stamp:.2f}, "
          f"{len({q for c in chunks for q in c['watch']})} standing question(s), {image.width}x{image.height}")
    if place is not None:  # which frames the place kept, for a person or a script to check
        print("stamps: " + " ".join(f"{t.stamp:.3f}" for t in thumbs))
    return 0


def cmd_backup(db, args) -> int:
    dest = pathlib.Path(args.dest).expanduser()
    if dest.is_dir() or not dest.suffix:  # a folder: what the node, or this command, opens as an archive
        dest = dest / DB_NAME
    if dest.exists() and not args.force:
        raise Refused(f"'{dest}' exists: give --force to write over it")
    from ..engine.errors import ArchiveError  # noqa: PLC0415 - --help needs no engine import
    from ..engine.recall.archive.store import backup_database  # noqa: PLC0415
    try:
        dest = backup_database(args.folder / DB_NAME, dest)
    except ArchiveError as err:
        raise Refused(str(err)) from None
    chunks = sqlite3.connect(f"{dest.absolute().as_uri()}?mode=ro", uri=True)
    try:
        (count,) = chunks.execute("SELECT COUNT(*) FROM chunks").fetchone()
    finally:
        chunks.close()
    print(f"wrote {dest}: {count} chunk(s), {dest.stat().st_size} bytes")
    return 0


def cmd_check(db, args) -> int:
    verdict = [row[0] for row in db.execute("PRAGMA integrity_check")]
    count, payload, oldest, newest = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(bytes), 0), MIN(first_stamp), MAX(last_stamp) FROM chunks").fetchone()
    columns = {row[1] for row in db.execute("PRAGMA table_info(chunks)")}
    thumbs = (db.execute("SELECT COALESCE(SUM(LENGTH(thumbnails)), 0) FROM chunks").fetchone()[0]
              if "thumbnails" in columns else 0)
    cameras = dict(db.execute("SELECT camera, COUNT(*) FROM chunks GROUP BY camera").fetchall())
    files = {p.name: p.stat().st_size for p in sorted(args.folder.glob(DB_NAME + "*")) if p.is_file()}
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    holes = []
    if "holes" in tables:
        cursor = db.execute("SELECT * FROM holes ORDER BY since")
        names = [d[0] for d in cursor.description]
        holes = [dict(zip(names, row)) for row in cursor]
    report = {"folder": str(args.folder), "integrity": verdict, "chunks": count, "payload_bytes": payload,
              "thumbnail_bytes": thumbs, "cameras": cameras, "oldest_stamp": oldest, "newest_stamp": newest,
              "files": files, "meta": dict(db.execute("SELECT key, value FROM meta").fetchall()),
              "holes": holes if "holes" in tables else None}
    ok = verdict == ["ok"]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if ok else EXIT_NOTHING
    print(f"archive {args.folder}")
    print(f"  integrity: {'ok' if ok else '; '.join(verdict[:5])}")
    print(f"  chunks: {count} ({', '.join(f'{_camera(c)}: {n}' for c, n in cameras.items()) or 'none'})")
    if count:
        print(f"  span: {_stamp(oldest)} .. {_stamp(newest)}")
    print(f"  bytes: {payload} in the bound, of them {thumbs} thumbnails")
    print("  files: " + ", ".join(f"{name} {size}" for name, size in files.items()))
    print("  model: " + ", ".join(f"{k} {v}" for k, v in sorted(report["meta"].items())))
    if "holes" not in tables:
        print("  holes: not recorded by this archive")
    else:
        print(f"  holes: {len(holes)}")
        for hole in holes:
            print(f"    {hole.get('camera', '')}  {_stamp(float(hole['since']))} .. {float(hole['until']):.2f}  "
                  f"{hole.get('reason', '')}" + (f", {hole['chunks']} chunk(s)" if hole.get("chunks") else ""))
    return 0 if ok else EXIT_NOTHING


# -- the command line ------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamcache-archive", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)

    def where(q, default=argparse.SUPPRESS):
        q.add_argument("--archive", default=None if default is not argparse.SUPPRESS else default,
                       help="the archive's folder (default: the --node's default folder)")
        q.add_argument("--node", default=DEFAULT_NODE if default is not argparse.SUPPRESS else default,
                       help=f"whose default folder: a node's full name (default {DEFAULT_NODE})")
    where(p, default=None)  # before the command, or after it (``check --archive DIR``)
    sub = p.add_subparsers(dest="command", required=True)
    command = sub.add_parser

    def add_parser(name, **kw):
        q = command(name, **kw)
        where(q)
        return q
    sub.add_parser = add_parser

    def span(q):
        q.add_argument("--since", type=float, help="seconds, camera clock (default: open)")
        q.add_argument("--until", type=float, help="seconds, camera clock (default: open)")
        q.add_argument("--camera", default="", help="one camera (default: every camera)")

    q = sub.add_parser("ls", help="chunks with stamps, camera and the standing questions' P(yes)")
    span(q)
    q.add_argument("--json", action="store_true")
    q = sub.add_parser("show", help="write the archived frame nearest a stamp")
    q.add_argument("stamp", type=float)
    q.add_argument("out", help="OUT.jpg (the stored JPEG) or OUT.png")
    q.add_argument("--camera", default="")
    q = sub.add_parser("sheet", help="a contact sheet of a span, the standing questions' P(yes) under it")
    span(q)
    q.add_argument("out", help="OUT.png")
    q.add_argument("--columns", type=int, default=8)
    q.add_argument("--max-frames", type=int, default=64, help="at most this many frames, evenly over the span")
    from .archive_map import add_map_parser, add_place_options  # noqa: PLC0415
    add_place_options(q)
    add_map_parser(sub, span)
    q = sub.add_parser("backup", help="SQLite's online backup to DEST: a folder (archive.sqlite in it), or a "
                                      "file ending .sqlite")
    q.add_argument("dest")
    q.add_argument("--force", action="store_true", help="write over DEST")
    q = sub.add_parser("check", help="integrity, chunks, bytes, file sizes, holes")
    q.add_argument("--json", action="store_true")
    return p


def cmd_map(db, args) -> int:
    from .archive_map import cmd_map as draw  # noqa: PLC0415 - matplotlib only when a map is drawn
    return draw(db, args)


COMMANDS = {"ls": cmd_ls, "show": cmd_show, "sheet": cmd_sheet, "backup": cmd_backup, "check": cmd_check,
            "map": cmd_map}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if getattr(args, "columns", 1) < 1 or getattr(args, "max_frames", 2) < 2:
            raise Refused("--columns must be >= 1 and --max-frames >= 2")
        args.folder = archive_path(args)
        db = open_readonly(args.folder)
        try:
            return COMMANDS[args.command](db, args)
        finally:
            db.close()
    except Refused as err:
        print(f"streamcache-archive: {err}", file=sys.stderr)
        return EXIT_REFUSED
    except sqlite3.DatabaseError as err:  # damaged past what opening could see
        print(f"streamcache-archive: the archive cannot be read: {err}", file=sys.stderr)
        return EXIT_NOTHING
    except OSError as err:
        print(f"streamcache-archive: {err}", file=sys.stderr)
        return EXIT_REFUSED


if __name__ == "__main__":
    # through the package's module, not __main__'s copy: archive_map raises the package's Refused
    from streamcache_ros.tools.archive_cli import main as package_main
    sys.exit(package_main())
