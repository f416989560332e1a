"""How a chunk runs, and how ingest is doing: encode, prefill, compress, book.

    pipeline = ChunkPipeline(adapter, policy, ledger, config, keep=tier.keep)
    report = pipeline.run(camera, [(rgb, stamp), ...], history)   # under the Session's lock

A chunk's frames go through the adapter's preprocessing and vision encoder, are prefilled through
the policy's attention (no recompute of the cache), the policy takes the guidance it asks for and
compresses (after_chunk), and the ledger books the chunk's units and forgets what was evicted. A
fault while encoding or prefilling drops the chunk (the cache is truncated back to its mark); a
fault while compressing keeps it (every token is in place; the next chunk compresses again). The
counters say how ingest is doing (the memory diagnostic reads them). No locks here: the Session
holds its lock around ``run``. Each chunk booked is handed to ``keep`` (the memory tier, which
archives it) with its retrieval key, as it is booked: nothing is left on the pipeline for later.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from .. import failpoints
from ..adapters import ModelAdapter
from ..recall.archive.keys import chunk_key, unit_keys
from ..recall.archive.record import EncodedChunk
from ..cache import CachePolicy, ChunkContext, ChunkOutcome, NewTokens
from ..cache.positions import PositionRangeError
from ..config import SessionConfig
from ..errors import ChunkError, describe_failure, is_out_of_memory, release_device_memory
from .guidance import GuidanceProvider
from .prefill import prefill_chunk
from ..memory.ledger import UnitLedger
from ..status import ChunkReport, CompressionOutcome, Exchange


class ChunkPipeline:
    def __init__(self, adapter: ModelAdapter, policy: CachePolicy, ledger: UnitLedger, config: SessionConfig,
                 keep: Callable[..., None] | None = None,
                 index_frames: Callable[[list[np.ndarray]], np.ndarray | None] | None = None,
                 thumbnail_frames: Callable[[list[np.ndarray]], list[bytes] | None] | None = None):
        self.adapter, self.policy, self.ledger, self.config = adapter, policy, ledger, config
        self.keep = keep  # called with (encoded chunk, retrieval key, chunk id, its frames) once a chunk is booked
        self.index_frames = index_frames  # the archive index's vector of each frame (None: no index)
        self.thumbnail_frames = thumbnail_frames  # the archive's JPEG of each frame (None: none kept)
        self.guidance = GuidanceProvider(adapter)  # computes what a policy's guidance_request asks for
        self.key_layers: tuple[int, ...] = ()  # layers whose keys make a chunk's retrieval key (archive on)
        self.attempts = 0  # every chunk started, failed or not (failpoint plans count these)
        self.clear()

    def clear(self) -> None:
        self.encoded = self.failed = self.failed_in_a_row = 0
        self.last_error = ""
        self.stopped = ""  # why chunks are not taken in (the position range is full), "" while they are
        self.last: ChunkReport | None = None

    def run(self, camera: str, batch: list[tuple[np.ndarray, float]], history: list[Exchange]) -> ChunkReport:
        """Encode, prefill and compress one chunk of ``camera``'s (frame, stamp) pairs; ``history``:
        the past exchanges a policy's guidance may read. Raises ChunkError (``kept`` says whether
        the frames stayed in memory); a chunk booked (compressed or not) has gone to ``keep``."""
        stamps = [float(stamp) for _, stamp in batch]
        return self._run(camera, stamps, history, lambda source, clock: self._encode(camera, batch, stamps, clock),
                         frames=batch)

    def run_encoded(self, chunk: EncodedChunk, history: list[Exchange]) -> ChunkReport:
        """A chunk the vision encoder saw before (an archived one): prefilled and compressed as
        ``run`` does, with no encoding."""
        return self._run(chunk.camera, list(chunk.stamps), history,
                         lambda source, clock: self._make_room(chunk.rel_positions, clock) or chunk)

    def _run(self, camera: str, stamps: list[float], history: list[Exchange], encode, frames=None) -> ChunkReport:
        self.attempts += 1
        source = f"chunk of {len(stamps)} frame(s) from '{camera or 'default'}'"
        started = time.perf_counter()
        encoded, key, times = self._take_in(encode, source, self.ledger.clock(camera))
        chunk_id = self.ledger.next_chunk
        unit_frames = {self.ledger.next_unit + i: tuple(f) for i, f in enumerate(encoded.unit_frames)}
        compress_error = None
        try:
            failpoints.hit("compress", chunk=self.attempts)
            context = ChunkContext(chunk_id, unit_frames=unit_frames)
            context.guidance = self._guidance(history, context)
            outcome = self.policy.after_chunk(context)
        except Exception as err:  # noqa: BLE001 - raised below, once the chunk is booked
            compress_error, outcome = err, ChunkOutcome()
            release_device_memory(err)
        times.append(time.perf_counter())
        self.ledger.book_chunk(camera, encoded.unit_stamps(), encoded.tokens_per_unit)
        self.encoded += 1
        if self.keep is not None:  # kept even when its compression failed: its frames are in memory
            self.keep(encoded, key, chunk_id, frames)
        # the units that left the cache: the outcome lists them; after a failed compression the
        # cache says what it still holds
        if compress_error is None:
            self.ledger.forget(evicted=outcome.evicted_units)
        else:
            self.ledger.forget(held=self.policy.stats().units)
        encode_ms, prefill_ms, compress_ms = (np.diff([started] + times) * 1e3).tolist()
        self.last = ChunkReport(chunk_id, camera, len(stamps), encoded.num_units,
                                encoded.num_units * encoded.tokens_per_unit,
                                encode_ms, prefill_ms, compress_ms, CompressionOutcome.of(outcome),
                                describe_failure(compress_error) if compress_error else "")
        if compress_error is not None:
            message = (f"{source}: compressing failed ({describe_failure(compress_error)}); its frames are kept, "
                       "over budget until the next chunk is compressed")
            self._failed(message)
            raise ChunkError(message, kept=True, out_of_memory=is_out_of_memory(compress_error)) from compress_error
        self.failed_in_a_row = 0
        self.stopped = ""
        return self.last

    def _encode(self, camera: str, batch: list[tuple[np.ndarray, float]], stamps: list[float],
                clock: int) -> EncodedChunk:
        """The frames through the adapter's preprocessing and vision encoder, room made for them
        before the encoder runs."""
        return self.encode_only(camera, batch, stamps, lambda rel: self._make_room(rel, clock))

    def encode_only(self, camera: str, batch: list[tuple[np.ndarray, float]], stamps: list[float] | None = None,
                    before_encoding=None, side_outputs: bool = True) -> EncodedChunk:
        """The frames through preprocessing, the vision encoder and (``side_outputs``) the index and
        thumbnails, nothing prefilled (the archive's whole chunk made again from frames a question
        took in parts, or a chunk kept as frames encoded for a replay: recall/tier.py)."""
        stamps = [float(stamp) for _, stamp in batch] if stamps is None else stamps
        inputs = self.adapter.preprocess([frame for frame, _ in batch])
        rel = self.adapter.chunk_rel_positions(inputs)
        if before_encoding is not None:  # a chunk for the working memory (not the archive's remake)
            before_encoding(rel)
            failpoints.hit("encode", chunk=self.attempts)
        embeds = self.adapter.encode(inputs)
        frames = [frame for frame, _ in batch]
        side = side_outputs  # a replay needs neither the index's vectors nor thumbnails: the archive has them
        return EncodedChunk(camera, stamps, [tuple(f) for f in inputs.unit_frames], inputs.tokens_per_unit,
                            embeds[0] if embeds.dim() == 3 else embeds, rel,
                            self.index_frames(frames) if side and self.index_frames is not None else None,
                            self.thumbnail_frames(frames) if side and self.thumbnail_frames is not None else None)

    def _take_in(self, encode, source: str, clock: int) -> tuple[EncodedChunk, object, list[float]]:
        """The chunk encoded (``encode(source, clock)``) and prefilled into the cache on its camera's
        position ``clock`` (numbered as if the camera were alone, seeing only its own tokens:
        cache/clocks.py); returns it, its retrieval key (None without key layers) and the times the
        two steps ended. On any fault the cache is
        truncated back and ChunkError raised."""
        policy = self.policy
        mark = policy.mark()
        try:
            encoded = encode(source, clock)  # makes room first (_make_room)
            rel = encoded.rel_positions
            mark = policy.mark()  # making room may re-index; it never changes lengths
            done_encoding = time.perf_counter()
            first = self.ledger.next_unit
            unit_ids = torch.arange(first, first + encoded.num_units)
            chunk = NewTokens(rel, unit_ids.repeat_interleave(encoded.tokens_per_unit),
                              torch.full((rel.shape[1],), self.ledger.next_chunk, dtype=torch.long), clock)
            key = self._prefill(encoded.embeds, chunk, encoded.tokens_per_unit)
            return encoded, key, [done_encoding, time.perf_counter()]
        except PositionRangeError as err:
            policy.truncate(mark)
            raise self._range_full(source, err) from err
        except Exception as err:
            policy.truncate(mark)
            message = f"{source} dropped: {describe_failure(err)}"
            self._failed(message)
            release_device_memory(err)
            raise ChunkError(message, out_of_memory=is_out_of_memory(err)) from err

    def _make_room(self, rel: torch.Tensor, clock: int) -> None:
        """Positions for a chunk of relative positions ``rel`` on ``clock`` (PositionRangeError when
        the range cannot take it); before the encoder runs, so a chunk refused costs no more."""
        self.policy.ensure_room(int(rel.max().item()) + 1 + self._question_room(), clock)

    def _question_room(self) -> int:
        """Positions a chunk must leave free in the model's range. A policy that can free none
        (nothing bounds what it keeps: ``full``) keeps room for the largest question, so questions
        are still answered once the range is full; a bounded one re-indexes for a question instead
        (the factory checked that its budget, a chunk and a question fit, docs/architecture.md)."""
        if self.policy.bounding_setting:
            return 0
        return self.config.largest_question(self.policy.geometry.max_position_embeddings)

    def _range_full(self, source: str, err: PositionRangeError) -> ChunkError:
        """A chunk the position range cannot take: refused, memory unchanged; the status says so
        (an ERROR memory diagnostic) until a chunk is taken in again."""
        policy = self.policy
        advice = (f"policy '{policy.name}' keeps every token, so no more frames fit: use a bounded policy (fifo, "
                  "uniform or hermes with budget_tokens, or h2svc) to keep streaming"
                  if not policy.bounding_setting else f"lower {policy.bounding_setting}")
        held = self.ledger.counts(policy.unit_tokens(), policy.stats().kv_tokens).frames
        message = (f"{source} not taken in: the memory has reached the model's position range "
                   f"(max_position_embeddings {err.limit}); questions are answered from the "
                   f"{held} frame(s) held; {advice}")
        self._failed(message)
        self.stopped = message
        return ChunkError(message, position_range=True)

    def _prefill(self, embeds: torch.Tensor, chunk: NewTokens, tokens_per_unit: int):
        """The chunk's tokens through the decoder over the cache in blocks of at most
        ``prefill_block_tokens``, after_prefill after the chunk, or after each unit for a policy
        that evicts between units (engine/ingest/prefill.py). Returns the chunk's retrieval key at
        ``key_layers`` (None without them)."""
        hook = failpoints.layer_hook("prefill", chunk=self.attempts, layers=self.policy.geometry.num_layers)
        seen: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {layer: [] for layer in self.key_layers}

        def observe(layer, _q, k, new):  # the archive's retrieval key (archive/keys.py)
            if layer in seen:
                seen[layer].append((k.detach(), new.units))
        prefill_chunk(self.adapter, self.policy, embeds, chunk, tokens_per_unit, self.config.prefill_block_tokens, hook,
                      observe if seen else None)
        return chunk_key([unit_keys(torch.cat([k for k, _ in parts], dim=2), torch.cat([u for _, u in parts]))
                                   for parts in seen.values()]) if seen else None

    def _guidance(self, history: list[Exchange], context: ChunkContext):
        """The guidance q/k the policy asks for before compressing ``context``'s chunk (None: it
        asks for none)."""
        if not self.policy.needs_guidance:
            return None
        request = self.policy.guidance_request(list(history), context)
        return self.guidance.compute(request, self.policy) if request is not None else None

    def _failed(self, message: str) -> None:
        self.failed += 1
        self.failed_in_a_row += 1
        self.last_error = message
