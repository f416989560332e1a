"""Ranking archived frames against a question, on plain arrays (docs/archive.md "The index").

    scores = rank_frames(vectors, query, probability)       # P(yes) per frame
    chunks = candidate_chunks(scores, threshold, newest_first=True)

The scores are the index's guess; a ``when`` verifies its candidates with short replays before it
answers (recall/tier.py), newest first for ``last`` and oldest first for ``first``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class FrameScores:
    """One entry per indexed frame, oldest first: its stamp, its chunk's archive id, its P(yes)."""

    stamps: np.ndarray
    chunk_ids: np.ndarray
    probability: np.ndarray
    cameras: np.ndarray | None = None  # each frame's camera
    within: np.ndarray | None = None  # which frames lie inside the window asked (None: all)

    def __len__(self) -> int:
        return len(self.stamps)

    def inside(self, since: float, until: float, keep: np.ndarray | None = None) -> "FrameScores":
        """The frames of since..until, or those ``keep`` marks (a place's: ``Window.mask``)."""
        keep = (self.stamps >= since) & (self.stamps <= until) if keep is None else keep
        return FrameScores(self.stamps[keep], self.chunk_ids[keep], self.probability[keep],
                           None if self.cameras is None else self.cameras[keep])

    def chunk_stamps(self, chunk_id: int) -> list[float]:
        """The stamps of ``chunk_id``'s frames scored here."""
        return self.stamps[self.chunk_ids == chunk_id].tolist()

    def camera_of(self, chunk_id: int) -> str:
        """The camera of ``chunk_id``'s frames scored here ("" when unknown)."""
        if self.cameras is None:
            return ""
        at = np.flatnonzero(self.chunk_ids == chunk_id)
        return str(self.cameras[at[0]]) if len(at) else ""


def rank_frames(vectors: np.ndarray, query: np.ndarray, probability: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """P(the frame shows what the question names) per row of ``vectors`` (unit vectors [N, dim]) for
    the question's unit vector ``query``: a matrix-vector product, milliseconds over a day."""
    if len(vectors) == 0:
        return np.zeros(0)
    return probability(vectors.astype(np.float32, copy=False) @ query.astype(np.float32))


@dataclass
class Candidate:
    chunk_id: int
    stamp: float  # the chunk's newest (``last``) or oldest (``first``) frame above the threshold
    probability: float  # the best of its frames


def sightings(probability: np.ndarray, threshold: float, min_run: int) -> np.ndarray:
    """Which frames are at or above ``threshold`` in a run of at least ``min_run`` consecutive
    frames (oldest first). A thing in view stays a moment: one frame alone above the threshold, among
    thousands a day, is far more often the index's false yes than a sighting (docs/archive.md
    "The index")."""
    above = probability >= threshold
    if min_run <= 1 or not above.any():
        return above
    edges = np.diff(np.concatenate([[0], above.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    kept = np.zeros_like(above)
    for start, end in zip(starts, ends):
        if end - start >= min_run:
            kept[start:end] = True
    return kept


def candidate_chunks(scores: FrameScores, threshold: float, newest_first: bool, min_run: int = 1,
                     keep: np.ndarray | None = None) -> list[Candidate]:
    """The chunks holding a sighting (``sightings``), newest first (``last``) or oldest first
    (``first``), each with the edge frame a ``when`` would answer with. ``keep``: the frames that
    may be a candidate's (those inside the window asked; the scores may reach past it, so that a
    run cut by the window's edge is judged whole)."""
    above = sightings(scores.probability, threshold, min_run)
    if keep is not None:
        above = above & keep
    chunks, stamps, p = scores.chunk_ids[above], scores.stamps[above], scores.probability[above]
    if not len(chunks):
        return []
    starts = _chunk_starts(chunks)
    edges = (np.maximum if newest_first else np.minimum).reduceat(stamps, starts)
    best = np.maximum.reduceat(p, starts)
    found = [Candidate(int(c), float(e), float(b)) for c, e, b in zip(chunks[starts], edges, best)]
    return sorted(found, key=lambda c: c.stamp, reverse=newest_first)


def best_by_chunk(scores: FrameScores) -> dict[int, float]:
    """Each chunk's most likely frame's P(yes); a chunk's frames lie together, oldest first."""
    if not len(scores):
        return {}
    starts = _chunk_starts(scores.chunk_ids)
    best = np.maximum.reduceat(scores.probability, starts)
    return dict(zip(scores.chunk_ids[starts].tolist(), best.tolist()))


def _chunk_starts(chunk_ids: np.ndarray) -> np.ndarray:
    """Where each chunk's run of frames begins (a chunk's frames lie together)."""
    return np.flatnonzero(np.concatenate([[True], chunk_ids[1:] != chunk_ids[:-1]]))


def precision_at(scores: np.ndarray, relevant: np.ndarray, k: int) -> float:
    """The share of the ``k`` best-scored items that are relevant."""
    top = np.argsort(-scores, kind="stable")[:k]
    return float(relevant[top].mean()) if len(top) else 0.0


def recall_at(scores: np.ndarray, relevant: np.ndarray, k: int) -> float:
    """The share of the relevant items among the ``k`` best, out of as many as could be there
    (min(k, relevant)): 1.0 when the top ``k`` is all relevant or holds every relevant item."""
    total = int(relevant.sum())
    if total == 0:
        return 0.0
    top = np.argsort(-scores, kind="stable")[:k]
    return float(relevant[top].sum()) / min(k, total)
