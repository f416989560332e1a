"""The one SQL question every reader of the archive asks: the chunks with a frame inside a span.

    query, args = span_query("id, stamps", since, until, camera)
    rows = db.execute(query + " ORDER BY first_stamp, id", args)

A chunk is a candidate when its first and last stamps bracket part of since..until; the caller
still checks each frame's stamp (a chunk may straddle the span with no frame inside it). Shared by
the store, the thumbnails' readers and `streamcache-archive`, which open the file on their own.
"""
from __future__ import annotations


def sql_stamp(stamp: float) -> float:
    return max(min(stamp, 1e300), -1e300)  # SQLite has no infinities


def span_query(columns: str, since: float, until: float, camera: str = "") -> tuple[str, list]:
    """(SELECT ``columns`` FROM chunks over since..until [of ``camera``], its arguments)."""
    query = f"SELECT {columns} FROM chunks WHERE last_stamp >= ? AND first_stamp <= ?"
    args: list = [sql_stamp(since), sql_stamp(until)]
    if camera:
        query += " AND camera = ?"
        args.append(camera)
    return query, args
