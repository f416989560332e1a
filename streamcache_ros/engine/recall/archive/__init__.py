"""The archive tier: every chunk, on the host and on disk, bounded by bytes, kept across restarts.

    archive = Archive.open(ArchiveSettings(path="/var/lib/robot/archive"), identity, cameras)
    archive.add(encoded_chunk, key)            # as each chunk is encoded
    rows = archive.window(since, until)        # what a question over a window brings back
    archive.load(rows)                         # with their payloads, to prefill again

It knows nothing of ROS, of the model or of any cache policy: the Session hands it chunks and asks
it for windows and for the chunks most relevant to a question (docs/archive.md).
"""
from __future__ import annotations

from .archive import DEFAULT_MAX_BYTES, Archive, ArchiveSettings
from .chunk_store import ChunkStore
from .keys import chunk_key, question_vector, relevance, unit_keys
from .record import ArchivedChunk, EncodedChunk
from .store import DB_NAME, LOCK_NAME, ArchiveStore
from .thumbnails import DEFAULT_THUMBNAIL_PX, Thumbnail

__all__ = ["Archive", "ArchiveSettings", "ArchiveStore", "ArchivedChunk", "ChunkStore", "DB_NAME", "DEFAULT_MAX_BYTES",
           "DEFAULT_THUMBNAIL_PX", "EncodedChunk", "LOCK_NAME", "Thumbnail", "chunk_key", "question_vector", "relevance",
           "unit_keys"]
