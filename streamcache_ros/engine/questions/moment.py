"""Find the moment: ``when`` over an indexed archive, retrieve then verify (docs/archive.md "When
with the index").

1. A standing question that stood over the whole window answers from the P(yes) already noted for
   every chunk: the newest (``last``) or oldest (``first``) chunk that said yes, no replay.
2. Otherwise the index ranks every frame of the window. Its candidates (chunks with a frame at or
   above the threshold) are verified newest first for ``last``, oldest first for ``first``: each is
   replayed alone (a short stream, what the models judge best) and asked the question; the first
   one the model confirms is the answer, at its newest (oldest) frame above the threshold.
3. ``timeline`` is the index's P(yes) per frame over the whole window, no replay.

A window with no candidate answers not found: the walk a ``when`` did before the index took the
first false yes it met (docs/archive.md). Only a window with chunks the index does not cover is
walked (``None`` here; the Session then walks).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..memory.ledger import Window
from ..recall.index import candidate_chunks, sightings
from ..recall.tier import MemoryTier
from ..status import WhenAnswer
from .answering import YES_NO

YES = 0.5


@dataclass
class MomentSettings:
    verify_chunks: int = 4  # candidates replayed at most before the answer is "not found"


def find_moment(tier: MemoryTier, question: str, mode: str, camera: str, window: Window,
                settings: MomentSettings, started: float, standing=None) -> WhenAnswer | None:
    """The ``when`` answer from the index, or from ``standing`` (``MemoryTier.standing_answers``,
    read by the caller); None when the window has chunks the index does not cover."""
    scores = tier.index_scores(question, camera, window)
    if standing is not None:
        return _from_standing(standing, scores, mode, window, started)
    if scores is None:
        return None
    threshold = tier.encoder.settings.threshold
    if mode == "timeline":
        above = np.flatnonzero(sightings(scores.probability, threshold, tier.encoder.settings.min_run))
        last = int(above[-1]) if len(above) else -1
        return _answer(last >= 0, float(scores.stamps[last]) if last >= 0 else 0.0, camera,
                       float(scores.probability[last]) if last >= 0 else float(scores.probability.max()),
                       scores.stamps.tolist(), scores.probability.tolist(), 0, started, len(scores), 0, "index")
    candidates = candidate_chunks(scores, threshold, newest_first=mode == "last",
                                  min_run=tier.encoder.settings.min_run)
    asked = replayed = 0
    for candidate in candidates[:settings.verify_chunks]:
        replay = tier.replay_chunks([candidate.chunk_id], scores)
        if replay is None:
            continue
        since, until = window.bounds()
        reply = replay.session.ask(question, list(YES_NO), camera, since=None if since == -np.inf else since,
                                   until=None if until == np.inf else until, evidence_k=0)
        asked, replayed = asked + 1, replayed + 1
        p_yes = float(reply.option_probabilities[0]) if reply.option_probabilities else float(reply.option_index == 0)
        if p_yes >= YES:
            found_camera = replay.chunks[0].camera
            return _answer(True, candidate.stamp, found_camera, p_yes, [], [], asked, started, len(scores), replayed,
                           "index", candidates=len(candidates))
    return _answer(False, 0.0, "", 0.0, [], [], asked, started, len(scores), replayed, "index",
                   candidates=len(candidates))


def _from_standing(standing, scores, mode: str, window: Window, started: float) -> WhenAnswer:
    """The newest / oldest chunk whose standing P(yes) said yes, at its newest / oldest frame the
    index ranks above the threshold when it is indexed, else at the chunk's edge."""
    yes = [(row, p) for row, p in standing if p >= YES]
    frames = sum(sum(1 for s in row.stamps if window.holds(s)) for row, _ in standing)
    if not yes:
        return _answer(False, 0.0, "", max(p for _, p in standing), [], [], 0, started, frames, 0, "standing")
    row, p = yes[-1] if mode == "last" else yes[0]
    inside = [s for s in row.stamps if window.holds(s)]
    stamp = max(inside) if mode == "last" else min(inside)
    if scores is not None:
        mine = (scores.chunk_ids == row.chunk_id)
        ranked = scores.stamps[mine & (scores.probability >= 0.5)]
        if len(ranked):
            stamp = float(ranked.max() if mode == "last" else ranked.min())
    return _answer(True, stamp, row.camera, p, [], [], 0, started, frames, 0, "standing")


def _answer(found: bool, stamp: float, camera: str, p: float, timeline_stamps, timeline_p, asked: int,
            started: float, frames: int, replayed: int, found_by: str, candidates: int = 0) -> WhenAnswer:
    return WhenAnswer(found, stamp, camera, p, timeline_stamps, timeline_p, asked, (time.perf_counter() - started) * 1e3,
                      frames, recalled_chunks=replayed, found_by=found_by, index_candidates=candidates)
