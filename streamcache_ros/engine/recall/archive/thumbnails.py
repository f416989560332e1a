"""Thumbnails of archived frames: a small JPEG of every frame, kept in its chunk's row, so a person
can see what the robot saw (docs/show.md).

    jpeg = encode(rgb, 160)                    # RGB uint8 [H, W, 3] -> JPEG bytes, longest side 160
    rgb = decode(jpeg)                         # -> RGB uint8 [h, w, 3]
    blob, sizes = pack([jpeg, ...])            # a chunk's JPEGs, as its row keeps them
    found = frame_near(db, stamp, camera)      # (stamp, camera, jpeg) of the archived frame nearest

The readers here take a sqlite3 connection, so the node's store (store.py) and the read-only CLI
(tools/archive_cli.py, which must not take the node's lock) read the same way.
"""
from __future__ import annotations

import io
import json
import sqlite3
from dataclasses import dataclass

import numpy as np

from .spans import span_query

# measured by bench/thumbnail_bytes.py (docs/show.md "Bytes"): every frame at 160 px costs at most a
# few per cent of a 7B model's embeddings an hour, and shows the shapes a person looks for
DEFAULT_THUMBNAIL_PX = 160
QUALITY = 75
FRAME_QUALITY = 95  # archive_content frames: what the vision encoder reads again on a replay


@dataclass
class Thumbnail:
    stamp: float
    camera: str
    jpeg: bytes

    def rgb(self) -> np.ndarray:
        return decode(self.jpeg)


def encode(frame: np.ndarray, longest_px: int, quality: int = QUALITY) -> bytes:
    """``frame`` (RGB uint8 [H, W, 3], or grey [H, W]) as a JPEG whose longest side is at most
    ``longest_px`` (never enlarged)."""
    from PIL import Image  # noqa: PLC0415 - only a node that keeps thumbnails pays for the import

    image = Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8))
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    height, width = frame.shape[:2]
    scale = min(1.0, longest_px / max(height, width))
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    if size != (width, height):
        # a box filter over a large frame: reduce() first is several times faster than a resample alone
        factor = int(1 / scale) // 2
        if factor >= 2:
            image = image.reduce(factor)
        image = image.resize(size, Image.BILINEAR)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality, optimize=True)
    return out.getvalue()


def encode_at(frame: np.ndarray, height: int, width: int, quality: int = FRAME_QUALITY) -> bytes:
    """``frame`` resized to exactly ``height`` x ``width`` (as the model's processor resizes it:
    bicubic) as a JPEG: what the archive keeps of a frame with archive_content frames."""
    from PIL import Image  # noqa: PLC0415

    image = Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8)).convert("RGB")
    if image.size != (width, height):
        image = image.resize((width, height), Image.BICUBIC)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def encode_all(frames, longest_px: int) -> list[bytes] | None:
    """Every frame of a chunk as a thumbnail; None when thumbnails are off (``longest_px`` 0)."""
    if int(longest_px) <= 0:
        return None
    return [encode(frame, int(longest_px)) for frame in frames]


def decode(data: bytes) -> np.ndarray:
    """A JPEG (or any image PIL reads) as RGB uint8 [H, W, 3]."""
    from PIL import Image  # noqa: PLC0415

    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def pack(jpegs: list[bytes] | None) -> tuple[bytes | None, str | None]:
    """(the JPEGs concatenated, JSON list of each one's byte count; 0 for a frame without one), as a
    chunk's row keeps them; (None, None) for none."""
    if not jpegs:
        return None, None
    return b"".join(jpegs), json.dumps([len(j) for j in jpegs])


def unpack(blob: bytes | None, sizes: str | None) -> list[bytes]:
    """The inverse of ``pack``: one entry per frame, b"" where a frame has none."""
    if blob is None or not sizes:
        return []
    out, at = [], 0
    for size in json.loads(sizes):
        out.append(bytes(blob[at:at + size]))
        at += size
    return out


# -- reading from an archive's database ------------------------------------------------------------
def has_thumbnails(db: sqlite3.Connection) -> bool:
    """Whether this archive's chunks table has the thumbnail columns (files from before do not)."""
    return "thumbnails" in {row[1] for row in db.execute("PRAGMA table_info(chunks)")}


def frame_near(db: sqlite3.Connection, stamp: float, camera: str = "", tolerance: float = float("inf")
               ) -> Thumbnail | None:
    """The archived frame (of ``camera`` when given) whose stamp is nearest ``stamp`` and that has a
    thumbnail, within ``tolerance`` seconds; None when there is none. Reads two chunks' stamps by the
    first-stamp index and one frame's bytes, never a chunk's whole blob."""
    if not has_thumbnails(db):
        return None
    where, args = "thumbnail_sizes IS NOT NULL", []
    if camera:
        where += " AND camera = ?"
        args.append(camera)
    # chunks begun at or before the stamp (newest first) and after it (oldest first): with several
    # cameras interleaved the nearest frame is among the first few of each side
    rows = db.execute(f"SELECT id, camera, stamps, thumbnail_sizes FROM chunks WHERE {where} AND first_stamp <= ? "
                      "ORDER BY first_stamp DESC LIMIT 8", args + [float(stamp)]).fetchall()
    rows += db.execute(f"SELECT id, camera, stamps, thumbnail_sizes FROM chunks WHERE {where} AND first_stamp > ? "
                       "ORDER BY first_stamp LIMIT 8", args + [float(stamp)]).fetchall()
    best = None
    for chunk_id, cam, stamps_text, sizes_text in rows:
        sizes = json.loads(sizes_text)
        offset = 0
        for frame_stamp, size in zip(json.loads(stamps_text), sizes):
            distance = abs(float(frame_stamp) - stamp)
            if size and distance <= tolerance and (best is None or distance < best[0]):
                best = (distance, chunk_id, cam, float(frame_stamp), offset, size)
            offset += size
    if best is None:
        return None
    _, chunk_id, cam, frame_stamp, offset, size = best
    row = db.execute("SELECT substr(thumbnails, ?, ?) FROM chunks WHERE id = ?", (offset + 1, size, chunk_id)).fetchone()
    if row is None or row[0] is None:  # dropped by the bound between the two reads
        return None
    return Thumbnail(frame_stamp, cam, bytes(row[0]))


def frames_between(db: sqlite3.Connection, since: float, until: float, camera: str = "") -> list[Thumbnail]:
    """Every archived frame with a thumbnail stamped inside since..until (of ``camera``), oldest first."""
    if not has_thumbnails(db):
        return []
    query, args = span_query("camera, stamps, thumbnails, thumbnail_sizes", since, until, camera)
    query += " AND thumbnail_sizes IS NOT NULL"
    out = []
    for cam, stamps_text, blob, sizes_text in db.execute(query + " ORDER BY first_stamp, id", args):
        for frame_stamp, jpeg in zip(json.loads(stamps_text), unpack(blob, sizes_text)):
            if jpeg and since <= frame_stamp <= until:
                out.append(Thumbnail(float(frame_stamp), cam, jpeg))
    out.sort(key=lambda t: (t.stamp, t.camera))
    return out
