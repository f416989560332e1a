"""Which archived chunks a question brings back: rules on plain rows (docs/archive.md "Recall").

- A windowed question: the chunks of its window, oldest first. Past ``max_chunks`` (what one short
  replay holds), the window's first and last chunks stay ("first" and "now" are read there) and the
  most relevant of the rest fill it.
- A question with no window: the first chunk of each camera (pinned: "first" questions need the
  stream's beginning), the ``recall_chunks`` most relevant of the older chunks, and the newest
  ``recent_chunks`` of each camera ("now" is read there), in time order. (A question about the
  beginning reads the first chunks alone, ``Archive.first_chunks``; one about now, the working memory.)
"""
from __future__ import annotations

import numpy as np

from .record import ArchivedChunk


def window_plan(rows: list[ArchivedChunk], scores: np.ndarray | None, max_chunks: int) -> list[ArchivedChunk]:
    """``rows`` (oldest first) cut to ``max_chunks``, keeping the ends and the best ``scores``."""
    if len(rows) <= max_chunks:
        return rows
    keep = {0, len(rows) - 1}
    order = np.argsort(-scores) if scores is not None else np.arange(len(rows))[::-1]
    for index in order:
        if len(keep) >= max_chunks:
            break
        keep.add(int(index))
    return [rows[i] for i in sorted(keep)]


def question_plan(rows: list[ArchivedChunk], scores: np.ndarray, recall_chunks: int,
                  recent_chunks: int) -> tuple[list[ArchivedChunk], list[ArchivedChunk]]:
    """(every chunk replayed in time order, the ones recalled for relevance) from ``rows``
    (oldest first) and their ``scores``."""
    chosen: dict[int, ArchivedChunk] = {}
    cameras = list(dict.fromkeys(row.camera for row in rows))
    recent_ids = set()
    for camera in cameras:
        own = [row for row in rows if row.camera == camera]
        for row in own[:1] + own[-recent_chunks:] if recent_chunks else own[:1]:
            chosen[row.chunk_id] = row
        recent_ids |= {row.chunk_id for row in own[-recent_chunks:]} if recent_chunks else set()
    recalled = []
    for index in np.argsort(-scores, kind="stable"):
        if len(recalled) >= recall_chunks:
            break
        row = rows[int(index)]
        if row.chunk_id not in recent_ids and row.chunk_id not in chosen:
            recalled.append(row)
            chosen[row.chunk_id] = row
    ordered = sorted(chosen.values(), key=lambda r: (r.first_stamp, r.chunk_id))
    return ordered, recalled
