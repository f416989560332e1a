"""What the archive asks of the place its chunks are kept: the protocol between ``Archive`` and a
backend. ``ArchiveStore`` (store.py, SQLite in WAL mode) meets it; another backend (an embedded
key-value store, a fleet's shared database) would meet the same methods and nothing else."""
from __future__ import annotations

import math
from typing import Iterator, Protocol

import numpy as np

from .record import ArchivedChunk, EncodedChunk


class ChunkStore(Protocol):
    warnings: list[str]  # what opening found and mended, each a line to log

    def append(self, chunk: EncodedChunk, key: np.ndarray | None = None) -> int:
        """Keep ``chunk`` (durably, with its retrieval key); returns its id. Past the bound the
        oldest chunks go."""

    def replace(self, chunk_ids: list[int], chunk: EncodedChunk, key: np.ndarray | None = None) -> int:
        """``chunk`` kept in place of the chunks ``chunk_ids`` (its parts), in one transaction; its
        standing answers the parts' best, pinned when one of them was."""

    def note_watch(self, chunk_id: int, answers: dict[str, float]) -> None:
        """The standing questions' P(yes) over chunk ``chunk_id``."""

    def iter_rows(self, since: float = -math.inf, until: float = math.inf, camera: str = "",
                  with_keys: bool = False) -> Iterator[ArchivedChunk]:
        """The chunks with a frame stamped inside since..until (of ``camera``), by first stamp,
        without payloads."""

    def rows(self, since: float = -math.inf, until: float = math.inf, camera: str = "",
             with_keys: bool = False) -> list[ArchivedChunk]: ...

    def holds(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> bool: ...

    def ranking_rows(self, camera: str = "", with_keys: bool = True) -> list[ArchivedChunk]:
        """Every chunk (of ``camera``), light: what ranking reads."""

    def complete(self, rows: list[ArchivedChunk]) -> list[ArchivedChunk]:
        """``rows`` with every field read (stamps, standing answers), payloads aside."""

    def current(self, rows: list[ArchivedChunk]) -> tuple[list[ArchivedChunk], list[ArchivedChunk]]:
        """(``rows`` as held now: a part made whole read as the whole chunk, the rows dropped since)."""

    def load(self, rows: list[ArchivedChunk]) -> list[ArchivedChunk]:
        """``rows`` with their payloads (the encoded chunks to prefill again)."""

    def use_index(self, index_model: str) -> None:
        """Frame vectors come from ``index_model`` from now on; another model's are dropped."""

    def frame_index(self, since: float = -math.inf, until: float = math.inf, camera: str = ""
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """(stamps, chunk ids, vectors, unindexed chunk ids) of the frames stamped inside since..until."""

    def watch_covers(self, question: str, since: float = -math.inf, until: float = math.inf,
                     camera: str = "") -> bool:
        """Whether every chunk inside since..until has a standing answer to ``question``."""

    def frame_cosines(self, query: np.ndarray, since: float = -math.inf, until: float = math.inf, camera: str = "",
                      margin: int = 0):
        """(stamps, chunk ids, cameras, cosines, inside the window) of the indexed frames inside
        since..until and ``margin`` either side; None unless every chunk inside is indexed."""

    def index_covers(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> bool:
        """Whether frames lie inside since..until (of ``camera``) and every one is indexed."""

    def chunk_table(self, camera: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, cameras, first stamps, last stamps, pinned) of every chunk (of ``camera``), oldest first."""

    def oldest_stamp(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> float:
        """The oldest archived frame stamp inside since..until (of ``camera``); +inf for none."""

    def newest_stamp(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> float:
        """The newest archived frame stamp inside since..until (of ``camera``); -inf for none."""

    def frames_between(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> int:
        """How many archived frames are stamped inside since..until (of ``camera``)."""

    def thumbnails_at(self, stamps: list[float], cameras: list[str] | None = None) -> list:
        """The thumbnail (thumbnails.Thumbnail) of each frame stamped ``stamps[i]``, None where none."""

    def thumbnails_between(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> list:
        """Every thumbnail stamped inside since..until (of ``camera``), oldest first."""

    def stats(self) -> dict: ...

    def clear(self) -> int: ...

    def note_hole(self, camera: str, since: float, until: float, reason: str, chunks: int = 0) -> None: ...

    def holes(self, since: float = -math.inf, until: float = math.inf, camera: str = "") -> list[tuple]: ...

    def newest_stamps(self) -> dict[str, float]: ...

    def close(self) -> None: ...
