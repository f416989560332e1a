"""Find the moment: ``when`` over an indexed archive, retrieve then verify (docs/archive.md "When
with the index").

1. The index ranks every frame of the window. A chunk is a *candidate* when one of its frames inside
   the window is a sighting (P(yes) at or above the threshold in a run of ``min_run`` frames; a run
   cut by the window's edge counts with its frames outside). A standing question that stood over a
   chunk wholly inside the window has its answer noted: that chunk is decided by it, no replay.
2. Candidates are verified newest first for ``last``, oldest first for ``first``, each replayed alone
   (a short stream, what the models judge best) over the window's part of it, and asked the
   question; the first one the model confirms is the answer, at its newest (oldest) sighting.
3. Whether "nothing confirmed" is an answer depends on the index (recall/index/calibration.py): a
   *trusted* index that narrowed the window (every candidate verified) has searched it; otherwise the
   window's chunks beyond the answer (all of them when none) are walked, each replayed alone and
   searched, ``walk_chunks`` at most. What was not read is said: ``search_complete`` false, and
   ``found_by`` "index_unsure" for a not found, "walk" for a moment the walk found.
4. ``timeline`` is the index's P(yes) for every frame of the window, no replay (complete when the
   index is trusted).

A window with chunks the index does not cover returns None: the desk walks it.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from ..memory.ledger import Window
from ..recall.archive import ArchivedChunk
from ..recall.index import Candidate, FrameScores, candidate_chunks, sightings
from ..recall.tier import MemoryTier
from ..status import WhenAnswer
from .answering import YES_NO

YES = 0.5


@dataclass
class MomentSettings:
    verify_chunks: int = 4  # index candidates replayed at most
    walk_chunks: int = 16  # where the index cannot settle a window: its chunks walked at most


@dataclass
class _Search:
    """What a search has spent and found so far."""

    window: Window
    mode: str
    started: float
    frames: int = 0  # frames of the window ranked
    replayed: int = 0  # one-chunk replays
    asked: int = 0  # questions asked of them

    @property
    def newest_first(self) -> bool:
        return self.mode == "last"

    def answer(self, found: bool, stamp: float = 0.0, camera: str = "", p: float = 0.0, found_by: str = "index",
               candidates: int = 0, complete: bool = True, timeline=((), ())) -> WhenAnswer:
        return WhenAnswer(found, stamp, camera, p, list(timeline[0]), list(timeline[1]), self.asked,
                          (time.perf_counter() - self.started) * 1e3, self.frames, recalled_chunks=self.replayed,
                          found_by=found_by, index_candidates=candidates, search_complete=complete)


def find_moment(tier: MemoryTier, question: str, mode: str, camera: str, window: Window,
                settings: MomentSettings, started: float, standing=None) -> WhenAnswer | None:
    """The ``when`` answer from the index (and ``standing``: ``MemoryTier.standing_answers``, read by
    the caller); None when the window has chunks the index does not cover and no standing question
    decides them."""
    encoder = tier.encoder
    wide = tier.index_scores(question, camera, window, margin_frames=encoder.settings.min_run - 1) \
        if encoder is not None else None
    if wide is None and standing is None:
        return None
    decided = _standing_chunks(standing, window)
    search = _Search(window, mode, started)
    if wide is None:  # a standing question stood over the window, no index: its cut chunks are walked
        search.frames = sum(sum(1 for s in row.stamps if window.holds(s)) for row, _ in standing)
        cut = [row for row, _ in standing if row.chunk_id not in decided]
        found, _, best_p = _in_order(tier, question, camera, [], decided, cut, None, settings, search)
        return found or search.answer(False, p=best_p, found_by="standing")
    inside = wide.within if wide.within is not None else np.ones(len(wide), bool)
    search.frames = int(inside.sum())
    seen = sightings(wide.probability, encoder.settings.threshold, encoder.settings.min_run) & inside
    if mode == "timeline":
        scores = wide.inside(window.since, window.until, window.mask(wide.stamps) if window.placed else None)
        above = np.flatnonzero(seen[inside])
        last = int(above[-1]) if len(above) else -1
        p = float(scores.probability[last]) if last >= 0 else float(scores.probability.max(initial=0.0))
        return search.answer(last >= 0, float(scores.stamps[last]) if last >= 0 else 0.0, "", p,
                             complete=encoder.trusted, timeline=(scores.stamps.tolist(), scores.probability.tolist()))
    candidates = candidate_chunks(wide, encoder.settings.threshold, newest_first=search.newest_first,
                                  min_run=encoder.settings.min_run, keep=inside)
    found, verified, best_p = _in_order(tier, question, camera, candidates, decided, [], wide, settings, search)
    if found is not None and found.found_by == "standing":
        return found
    every_candidate_read = all(c.chunk_id in verified or c.chunk_id in decided for c in candidates)
    if found is not None:
        found = dataclasses.replace(found, index_candidates=len(candidates))
    if encoder.trusted and (found is not None or every_candidate_read):
        by = "standing" if decided and not candidates else "index"
        return found or search.answer(False, p=best_p, found_by=by, candidates=len(candidates))
    # the index cannot settle it: walk the window's chunks beyond the answer (all, with none); a trusted
    # index that proposed more than it verified: its candidates left
    rows, total = _beyond(wide, inside, found, verified | set(decided), search, settings.walk_chunks,
                          only={c.chunk_id for c in candidates} if encoder.trusted else None)
    walked = _walk(tier, question, camera, rows, settings, search, total)
    if walked.found:
        return dataclasses.replace(walked, index_candidates=len(candidates))
    if found is not None:
        return dataclasses.replace(found, search_complete=walked.search_complete)
    return search.answer(False, p=max(best_p, walked.yes_probability), found_by="index_unsure",
                         candidates=len(candidates), complete=walked.search_complete)


def _standing_chunks(standing, window: Window) -> dict[int, tuple[ArchivedChunk, float]]:
    """The chunks a standing question decides: those wholly inside ``window`` (a chunk cut by the
    window was answered over frames outside it too: the index decides it, or a walk), by archive id."""
    if standing is None:
        return {}
    return {row.chunk_id: (row, p) for row, p in standing if all(window.holds(s) for s in row.stamps)}


def _in_order(tier: MemoryTier, question: str, camera: str, candidates: list[Candidate], decided: dict,
              to_walk: list[ArchivedChunk], scores: FrameScores | None, settings: MomentSettings, search: _Search):
    """(the answer found, the candidates' chunk ids verified, the best P(yes) that did not confirm):
    the chunks a standing question decided (no replay), the index's candidates (verified, at most
    ``verify_chunks``) and ``to_walk`` (searched alone), in the search's order."""
    edge = (lambda row: row.last_stamp) if search.newest_first else (lambda row: row.first_stamp)
    order = [(edge(row), "standing", (row, p)) for row, p in decided.values()]
    order += [(c.stamp, "candidate", c) for c in candidates if c.chunk_id not in decided]
    order += [(edge(row), "walk", row) for row in to_walk]
    order.sort(key=lambda item: item[0], reverse=search.newest_first)
    verified, best_p = set(), 0.0
    for _, kind, item in order:
        if kind == "standing":
            row, p = item
            if p >= YES:
                inside = [s for s in row.stamps if search.window.holds(s)]
                stamp = max(inside) if search.newest_first else min(inside)
                return search.answer(True, stamp, row.camera, p, "standing"), verified, best_p
            best_p = max(best_p, p)
        elif kind == "walk":
            walked = _walk(tier, question, camera, [item], settings, search)
            if walked.found:
                return walked, verified, best_p
            best_p = max(best_p, walked.yes_probability)
        elif len(verified) < settings.verify_chunks:
            verified.add(item.chunk_id)
            replay = tier.replay_chunks([item.chunk_id], scores)
            if not tier.encoder.trusted:  # its sightings say nothing of where in the chunk: searched as walked
                walked = _search_replay(replay, question, camera, search)
                if walked is not None and walked.found:
                    return dataclasses.replace(walked, found_by="index"), verified, best_p
                best_p = max(best_p, walked.yes_probability if walked is not None else 0.0)
                continue
            p, found_camera = _confirm(tier, question, camera, replay, search)
            if p is not None and p >= YES:
                return search.answer(True, item.stamp, found_camera, p), verified, best_p
            best_p = max(best_p, p or 0.0)
    return None, verified, best_p


def _confirm(tier: MemoryTier, question: str, camera: str, replay, search: _Search) -> tuple[float | None, str]:
    """(P(yes) of ``question`` over ``replay``'s part of the window, the camera it read); None when
    its chunk left the archive meanwhile."""
    if replay is None:
        return None, ""
    since, until = asked(search.window, replay)
    reply = replay.session.ask(question, list(YES_NO), camera, since=since, until=until, evidence_k=0)
    search.replayed, search.asked = search.replayed + 1, search.asked + 1
    p = float(reply.option_probabilities[0]) if reply.option_probabilities else float(reply.option_index == 0)
    return p, replay.chunks[0].camera


def asked(window: Window, replay) -> tuple:
    """(since, until) a replay is asked over: the window's, or under a place the window itself,
    limited to the replay's frames (``Window.around``), which its session takes as it is."""
    if not window.placed:
        return window.as_asked()
    return window.around([s for row in replay.chunks for s in row.stamps]), None


def confirm_moment(tier: MemoryTier, question: str, camera: str, stamp: float, window: Window) -> float | None:
    """P(yes) of ``question`` over the archived chunk that holds the frame stamped ``stamp`` (of
    ``camera``), replayed alone, over ``window``'s part of it: a walk's moment judged a second time,
    in a short stream of its own; None when no archived chunk holds that frame."""
    replay = tier.replay_rows([ArchivedChunk(-1, camera, stamp, stamp, [stamp], [], 0)])
    p, _ = _confirm(tier, question, camera, replay, _Search(window, "last", 0.0))
    return p


def _beyond(wide: FrameScores, inside: np.ndarray, found: WhenAnswer | None, skip: set[int], search: _Search,
            limit: int, only: set[int] | None = None) -> tuple[list[ArchivedChunk], int]:
    """(the first ``limit`` of the window's chunks a walk still has to read, in the search's order;
    how many there are): those not in ``skip`` (verified, decided), among ``only`` when given, with a
    frame newer (``last``) / older (``first``) than the answer found, every one when none. A chunk's
    frames lie together in the scores: its span is one reduce over its run (a day's 10 800 chunks)."""
    ids, stamps = wide.chunk_ids[inside], wide.stamps[inside]
    if not len(ids):
        return [], 0
    cameras = wide.cameras[inside] if wide.cameras is not None else None
    starts = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
    ends = np.append(starts[1:], len(ids))
    firsts, lasts = np.minimum.reduceat(stamps, starts), np.maximum.reduceat(stamps, starts)
    keep = ~np.isin(ids[starts], list(skip))
    if only is not None:
        keep &= np.isin(ids[starts], list(only))
    if found is not None:
        keep &= (lasts > found.stamp) if search.newest_first else (firsts < found.stamp)
    order = np.flatnonzero(keep)
    order = order[np.argsort(firsts[order], kind="stable")]
    if search.newest_first:
        order = order[::-1]
    rows = [ArchivedChunk(int(ids[starts[i]]), "" if cameras is None else str(cameras[starts[i]]), float(firsts[i]),
                          float(lasts[i]), stamps[starts[i]:ends[i]].tolist(), [], 0) for i in order[:limit]]
    return rows, len(order)


def _walk(tier: MemoryTier, question: str, camera: str, rows: list[ArchivedChunk], settings: MomentSettings,
          search: _Search, total: int | None = None) -> WhenAnswer:
    """``rows`` searched in order, each replayed alone, ``walk_chunks`` at most: the first whose
    search finds the answer (its newest / oldest unit saying yes) is it. Complete when every one of
    the ``total`` rows to read (``len(rows)`` when not given) was read."""
    best = 0.0
    for row in rows[:settings.walk_chunks]:
        found = _search_replay(tier.replay_rows([row]), question, camera, search)
        if found is not None and found.found:
            return found
        best = max(best, found.yes_probability if found is not None else 0.0)
    return search.answer(False, p=best, found_by="walk",
                         complete=(len(rows) if total is None else total) <= settings.walk_chunks)


def _search_replay(replay, question: str, camera: str, search: _Search) -> WhenAnswer | None:
    """``replay`` (one chunk) searched as the working memory is, over the window's part of it: its
    tile, then its units; the answer at the newest (oldest) unit saying yes (``found_by`` walk).
    None when the chunk left the archive meanwhile."""
    if replay is None:
        return None
    found = replay.session.when(question, search.mode, camera, *asked(search.window, replay))
    search.replayed, search.asked = search.replayed + 1, search.asked + found.questions_asked
    if not found.found:
        return search.answer(False, p=found.yes_probability, found_by="walk")
    return search.answer(True, found.stamp, found.camera, found.yes_probability, "walk")
