"""The archive's frame vectors in RAM: a day's index read once, then kept in step with the store, so
ranking a window costs a mask and a matrix-vector product, not a read of every row
(docs/archive.md "The index"). 0.46 MB an hour with the bundled 64-d vectors."""
from __future__ import annotations

import threading

import numpy as np


class IndexCache:
    def __init__(self):
        # chunk id -> (camera, first stamp, stamps [frames] float64, vectors [frames, dim] float16 or None)
        self.entries: dict[int, tuple[str, float, np.ndarray, np.ndarray | None]] = {}
        self.pinned: set[int] = set()
        self.last: dict[int, float] = {}  # chunk id -> its newest stamp
        self._joined: tuple | None = None
        self._lock = threading.Lock()  # ingest adds while a question, off the turn lock, reads

    def add(self, chunk_id: int, camera: str, stamps, vectors: np.ndarray | None, pinned: bool = False) -> None:
        stamps = np.asarray(stamps, dtype=np.float64)
        if vectors is not None and len(vectors) != len(stamps):
            vectors = None  # a row that does not fit its stamps is searched as an unindexed one
        with self._lock:
            self.entries[int(chunk_id)] = (camera, float(stamps.min()), stamps, vectors)
            self.last[int(chunk_id)] = float(stamps.max())
            if pinned:
                self.pinned.add(int(chunk_id))
            self._joined = None

    def drop(self, chunk_id: int) -> None:
        with self._lock:
            if self.entries.pop(int(chunk_id), None) is not None:
                self._joined = None
            self.pinned.discard(int(chunk_id))
            self.last.pop(int(chunk_id), None)

    def window(self, since: float, until: float, camera: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """As ``ArchiveStore.frame_index``: (stamps, chunk ids, vectors, unindexed chunk ids)."""
        (stamps, ids, _, vectors, _), keep, unindexed = self._inside(since, until, camera)
        return stamps[keep], ids[keep], vectors[keep], [c for c, inside in unindexed if len(inside)]

    def cosines(self, query: np.ndarray, since: float, until: float, camera: str, margin: int = 0):
        """(stamps, chunk ids, cameras, cosines with ``query``, which lie inside since..until, unindexed
        chunk ids) of every indexed frame inside since..until (of ``camera``) and of the ``margin``
        frames either side of it (in the camera's order), or None when a chunk inside is unindexed
        or none is there. Ranks the day's vectors in place rather than copying the window's first:
        a day's 86 400 vectors are 22 MB (docs/archive.md "The index")."""
        (stamps, ids, cameras, vectors, _), keep, unindexed = self._inside(since, until, camera)
        if any(len(inside) for _, inside in unindexed) or not keep.any():
            return None
        if margin:
            mine = np.flatnonzero(cameras == camera) if camera else np.arange(len(stamps))
            held = np.flatnonzero(keep[mine])
            wide = np.zeros_like(keep)
            wide[mine[max(held[0] - margin, 0):held[-1] + margin + 1]] = True
            keep, inside = wide, keep[wide]
        else:
            inside = np.ones(int(keep.sum()), bool)
        query = query.astype(np.float32)
        cosine = (vectors @ query)[keep] if keep.sum() * 4 > len(keep) else vectors[keep] @ query
        return stamps[keep], ids[keep], cameras[keep], cosine, inside

    def covers(self, since: float, until: float, camera: str) -> bool:
        """Whether frames lie inside since..until (of ``camera``) and every one is indexed."""
        _, keep, unindexed = self._inside(since, until, camera)
        return bool(keep.any()) and not any(len(inside) for _, inside in unindexed)

    def count(self, since: float, until: float, camera: str) -> int:
        """How many frames, indexed or not, are stamped inside since..until (of ``camera``)."""
        _, keep, unindexed = self._inside(since, until, camera)
        return int(keep.sum()) + sum(len(inside) for _, inside in unindexed)

    def oldest(self, since: float, until: float, camera: str) -> float:
        """The oldest frame stamp inside since..until (of ``camera``), indexed or not; +inf for none."""
        (stamps, *_), keep, unindexed = self._inside(since, until, camera)
        firsts = [float(inside.min()) for inside in [stamps[keep]] + [i for _, i in unindexed] if len(inside)]
        return min(firsts, default=np.inf)

    def newest(self, since: float, until: float, camera: str) -> float:
        """The newest frame stamp inside since..until (of ``camera``), indexed or not; -inf for none."""
        (stamps, *_), keep, unindexed = self._inside(since, until, camera)
        lasts = [float(inside.max()) for inside in [stamps[keep]] + [i for _, i in unindexed] if len(inside)]
        return max(lasts, default=-np.inf)

    def _inside(self, since: float, until: float, camera: str):
        """(the joined arrays, which indexed frames lie inside since..until (of ``camera``), each
        unindexed chunk of ``camera`` with its stamps inside)."""
        with self._lock:
            joined = self._join()
        stamps, _, cameras, _, unindexed = joined
        keep = (stamps >= since) & (stamps <= until)
        if camera:
            keep &= cameras == camera
        return joined, keep, [(c, s[(s >= since) & (s <= until)]) for c, (cam, _, s, _) in unindexed
                              if not camera or cam == camera]

    def table(self, camera: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, cameras, first stamps, last stamps, pinned) of every chunk (of ``camera``), oldest
        first, as arrays: what planning a question reads, without a row object per chunk."""
        with self._lock:
            self._join()
            ids, cameras, firsts, lasts, pinned = self._table
        keep = cameras == camera if camera else np.ones(len(ids), bool)
        return ids[keep], cameras[keep], firsts[keep], lasts[keep], pinned[keep]

    def _join(self):
        if self._joined is None:
            order = sorted(self.entries.items(), key=lambda item: (item[1][1], item[0]))
            indexed = [(c, e) for c, e in order if e[3] is not None]
            unindexed = [(c, e) for c, e in order if e[3] is None]
            if indexed:
                stamps = np.concatenate([e[2] for _, e in indexed])
                ids = np.concatenate([np.full(len(e[2]), c, dtype=np.int64) for c, e in indexed])
                cameras = np.concatenate([np.full(len(e[2]), e[0], dtype=object) for _, e in indexed])
                vectors = np.concatenate([e[3] for _, e in indexed]).astype(np.float32)  # ranked as float32
            else:
                stamps, ids, cameras, vectors = np.zeros(0), np.zeros(0, np.int64), np.zeros(0, object), np.zeros((0, 0), np.float32)
            self._joined = (stamps, ids, cameras, vectors, unindexed)
            self._table = (np.array([c for c, _ in order], dtype=np.int64),
                           np.array([e[0] for _, e in order], dtype=object),
                           np.array([e[1] for _, e in order], dtype=np.float64),
                           np.array([self.last[c] for c, _ in order], dtype=np.float64),
                           np.array([c in self.pinned for c, _ in order], dtype=bool))
        return self._joined
