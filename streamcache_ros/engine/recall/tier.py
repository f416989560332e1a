"""Questions that reach past the working memory, answered from a short replay of archived chunks.

    recall = Recall(session, archive)
    recall.keep()                                     # after each chunk: it goes to the archive
    replay = recall.for_ask(ids, camera, window)      # None: the working memory answers
    answer = replay.session.ask(...)                  # a short stream of the recalled chunks

The working memory answers a question whose window it holds whole. One whose window reaches older
frames, or one with no window when older frames lie in the archive and ``recall_chunks`` > 0, is
answered over a *replay*: the chunks the archive plans for it (archive/plan.py), prefilled again in
time order into a scratch full cache, as the start of a short stream, then dropped. The models judge
a short window best, and the GPU working memory is left exactly as it was (docs/archive.md "Recall").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .archive import Archive, ArchivedChunk, question_vector
from ..cache import make_policy
from ..memory.ledger import Window


@dataclass
class Replay:
    session: "object"  # a Session over the replayed chunks alone
    chunks: list[ArchivedChunk]
    recalled: int  # of them, the chunks brought back for their relevance to the question


class Recall:
    def __init__(self, session, archive: Archive, key_layers: tuple[int, ...]):
        self.session, self.archive = session, archive
        self.key_layers = tuple(key_layers)
        session.chunks.key_layers = self.key_layers
        self.archive_ids: dict[int, int] = {}  # the ledger's chunk id -> the archive's, for standing answers

    # -- writing ---------------------------------------------------------------------------------
    def keep(self) -> None:
        """The chunk just encoded, into the archive (under the Session's lock)."""
        chunks = self.session.chunks
        if chunks.last_encoded is None or chunks.last is None:
            return
        archive_id = self.archive.add(chunks.last_encoded, chunks.last_key)
        self.archive_ids[chunks.last.chunk_id] = archive_id
        for old in [c for c in self.archive_ids if c < chunks.last.chunk_id - 64]:
            del self.archive_ids[old]  # standing answers come for the newest chunks only
        chunks.last_encoded = None

    def note_watch(self, chunk_id: int, answers: dict[str, float]) -> None:
        if chunk_id in self.archive_ids:
            self.archive.note_watch(self.archive_ids[chunk_id], answers)

    # -- what the working memory holds whole -------------------------------------------------------
    def whole_since(self, camera: str = "") -> float:
        """The oldest stamp from which the working memory holds every token of every frame of
        ``camera`` (all cameras when empty) up to now; +inf when not even the newest is whole."""
        session = self.session
        ledger, held = session.ledger, session.policy.unit_tokens()
        column = {u: i for i, u in enumerate(held.units.tolist())}
        fewest = held.counts.min(dim=0).values.tolist() if held.counts.numel() else []
        units = sorted((u for u, info in ledger.units.items() if not camera or info.camera == camera), reverse=True)
        since, previous = math.inf, None
        for unit in units:
            info = ledger.units[unit]
            whole = unit in column and fewest[column[unit]] >= max(info.tokens, 1)
            if not whole or (previous is not None and unit != previous - 1 and not camera):
                break
            since, previous = min(since, min(info.stamps)), unit
        return since

    # -- planning a question -----------------------------------------------------------------------
    def for_ask(self, ids: list[int], camera: str, window: Window | None, clock: int | None) -> Replay | None:
        """The replay a question needs, or None when the working memory answers it."""
        whole_since = self.whole_since(camera)
        if window is not None:
            if not self._archive_reaches(window, camera, whole_since):
                return None
            rows = self.archive.window(window.since, window.until, camera, self._question(ids, clock))
            return self._replay(rows, recalled=0)
        if self.archive.settings.recall_chunks < 1:
            return None
        if not self._archive_reaches(Window(), camera, whole_since):
            return None
        rows, recalled = self.archive.for_question(self._question(ids, clock), camera, before=whole_since)
        return self._replay(rows, recalled=len(recalled)) if recalled or any(r.pinned for r in rows) else None

    def for_when(self, ids: list[int], camera: str, window: Window, clock: int | None, mode: str):
        """The replays a ``when`` search runs over, in the order it should try them; none when the
        working memory holds the window whole. ``last`` and ``first`` walk every archived chunk of
        the window, newest (oldest) first, one replay of ``max_replay_chunks`` at a time, so the
        search stops at the first replay that says yes and no chunk is left unsearched; ``timeline``
        runs over one replay: all the window's chunks when they fit, else the most relevant with the
        window's ends (archive/plan.py)."""
        if not self._archive_reaches(window, camera, self.whole_since(camera)):
            return
        if mode == "timeline":
            yield self._replay(self.archive.window(window.since, window.until, camera, self._question(ids, clock)), 0)
            return
        rows = self.archive.store.rows(window.since, window.until, camera)
        size = self.archive.settings.max_replay_chunks
        batches = [rows[i:i + size] for i in range(0, len(rows), size)]
        for batch in (reversed(batches) if mode == "last" else batches):
            yield self._replay(batch, 0)

    def _archive_reaches(self, window: Window, camera: str, whole_since: float) -> bool:
        """Whether the archive holds frames of ``window`` older than ``whole_since``, where the
        working memory stops holding every token."""
        return window.since < whole_since and self.archive.holds(window.since, min(window.until, whole_since - 1e-9),
                                                                 camera)

    def holds(self, window: Window | None, camera: str = "") -> bool:
        """Whether the archive holds a frame of ``window`` (of ``camera`` when given)."""
        return self.archive.holds(*(window or Window()).bounds(), camera)

    def oldest_stamp(self, window: Window | None = None, camera: str = "") -> float:
        """The oldest archived frame stamp inside ``window`` (of ``camera`` when given); +inf for
        none (an answer's reach, docs/interfaces.md "How far back an answer reaches")."""
        window = window or Window()
        oldest = math.inf
        for row in self.archive.store.iter_rows(*window.bounds(), camera):  # by first stamp: stop past the oldest
            if row.first_stamp > oldest:
                break
            oldest = min([oldest, *(s for s in row.stamps if window.holds(s))])
        return oldest

    def _question(self, ids: list[int], clock: int | None):
        """The question's vector at the key layers: its prompt run over the working memory (the
        tokens removed again), its queries read before the rotary embedding."""
        session = self.session
        queries: dict[int, torch.Tensor] = {}

        def observe(layer, q, _k, _new):
            if layer in self.key_layers:
                queries[layer] = q.detach()
        policy, adapter = session.policy, session.adapter
        mark = policy.mark()
        try:
            adapter.forward(adapter.embed_text(ids), adapter.text_tokens(len(ids), clock=clock), policy, observe=observe)
        finally:
            policy.truncate(mark)
        return question_vector([queries[layer] for layer in self.key_layers], policy.geometry.num_kv_heads)

    def _replay(self, rows: list[ArchivedChunk], recalled: int) -> Replay | None:
        if not rows:
            return None
        from ..session import Session  # noqa: PLC0415 - a Session builds its Recall

        session = self.session
        scratch = Session(session.adapter, make_policy("full"), session.config)
        for row in self.archive.load(rows):
            scratch.ledger.note_camera(row.camera)
            scratch.chunks.run_encoded(row.chunk, [])
            row.chunk = None  # payloads go as soon as they are prefilled
        return Replay(scratch, rows, recalled)
