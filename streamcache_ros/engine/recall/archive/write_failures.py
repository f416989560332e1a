"""Chunks the archive could not write (a full disk, an I/O error): counted, warned about once per
episode, and named as a hole once writing works again (docs/reliability.md "A full disk").

    failures = WriteFailures()
    failures.failed(chunk, err, free_bytes)    # one WARN per episode, no traceback
    holes = failures.resumed()                 # [(camera, since, until, chunks)] once a write succeeds
"""
from __future__ import annotations

import logging
import math
import sqlite3

from ...errors import ArchiveError
from .record import EncodedChunk

# what a write that the disk refused raises; anything else is a bug and is raised as it is
WRITE_ERRORS = (sqlite3.OperationalError, sqlite3.DatabaseError, OSError, ArchiveError)
log = logging.getLogger("streamcache_ros.archive")


class WriteFailures:
    def __init__(self):
        self.not_archived = 0  # chunks encoded and never written, since the node started
        self.in_episode = False
        self.last_error = ""
        self._spans: dict[str, list[float]] = {}  # camera -> [first, last] stamp not written this episode
        self._chunks: dict[str, int] = {}

    def failed(self, chunk: EncodedChunk, err: BaseException, free_bytes: int) -> None:
        self.not_archived += 1
        span = self._spans.setdefault(chunk.camera, [math.inf, -math.inf])
        span[0], span[1] = min(span[0], min(chunk.stamps)), max(span[1], max(chunk.stamps))
        self._chunks[chunk.camera] = self._chunks.get(chunk.camera, 0) + 1
        self.last_error = f"{type(err).__name__}: {err}"
        if not self.in_episode:  # one line per episode: a full disk must not fill the log as well
            self.in_episode = True
            log.warning("archive: chunks are not being archived (%s; %d MiB free on the archive's disk): they stay "
                        "in the working memory, are counted in chunks_not_archived and named as a hole once writing "
                        "works again", self.last_error, free_bytes >> 20)

    def resumed(self) -> list[tuple[str, float, float, int]]:
        """The episode's holes, one per camera, once a chunk was written again; [] when none."""
        if not self.in_episode:
            return []
        holes = self.pending()
        log.warning("archive: writing again after %d chunk(s) not archived (a hole: %s)", sum(h[3] for h in holes),
                 ", ".join(f"'{c}' {a:.2f}..{b:.2f} s" for c, a, b, _ in holes))
        self.in_episode, self._spans, self._chunks = False, {}, {}
        return holes

    def pending(self) -> list[tuple[str, float, float, int]]:
        """The episode's spans so far (not yet written as holes): replies name them too."""
        return [(camera, span[0], span[1], self._chunks[camera]) for camera, span in self._spans.items()]
