"""How a stream becomes tokens, positions and masks: plain functions the Session and training share.

The Session builds its cache one chunk and one question at a time; training lays a whole stream and
all its questions out at once. Both call these functions, so a model is trained on exactly the
token layout it is later asked in (docs/world-models.md, "One layout"):

- the text prompts (system prefix, question, the multiple-choice layout of the model's folder);
- when frames become a chunk: ``chunk_frames`` per camera, and a partial chunk whenever a question
  flushes the queue (``stream_chunks``, with the queue the Session keeps, chunk_queue.py);
- which frames make a stream unit (Qwen2.5-VL pairs frames; an odd last frame is repeated);
- positions: a chunk or a question starts at the cache's max position + 1 over every axis, chunk
  tokens keep their relative layout (Qwen's M-RoPE with its temporal stride), text advances one
  position per token on every axis;
- the mask: the stream is causal, a question sees the stream as it was when it was asked and
  itself, never another question; the stream never sees a question. A question over a time
  window sees the prefix and only the units of the window (``window_key_mask``).

No model, no policy here: torch tensors and lists only (positions and unit ids as the cache
keeps them: cache/positions.py, cache/units.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..cache.positions import next_offset
from ..cache.units import PREFIX_UNIT
from .chunk_queue import ChunkQueue

# The question layout of HERMES's reference (docs/hermes.md, "Prompts"): no newline after
# <|im_end|>, the query tokenised as it is.
QUESTION_TEMPLATE = "\n{query}<|im_end|><|im_start|>assistant\n"
OPTION_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
OPTIONS_PROMPTS = ("letter", "words")
LETTER_SUFFIX = "Best option: ("


# -- prompts ---------------------------------------------------------------------------------------
def options_query(question: str, options: list[str], style: str = "letter") -> str:
    """The multiple-choice query. ``letter`` (HERMES's reference, for real weights): lettered
    options, the answer is a letter. ``words`` (the bundled shape-world models): the options in one
    line, the answer is the option's own words."""
    if style == "letter":
        lines = [f"Question: {question}", "Options:"]
        lines += [f"({OPTION_LETTERS[i]}) {opt}" for i, opt in enumerate(options)]
        lines.append("Only give the best option.")
        return "\n".join(lines)
    if style == "words":
        return f"Question: {question}\nOptions: {', '.join(options)}\nAnswer with the best option's words."
    raise ValueError(f"options prompt must be one of {', '.join(OPTIONS_PROMPTS)}, got '{style}'")


def question_prompt(question: str, options: list[str], style: str = "letter") -> str:
    """The text appended to the cache for one question (the answer follows it)."""
    query = options_query(question, options, style) if options else question
    suffix = LETTER_SUFFIX if options and style == "letter" else ""
    return QUESTION_TEMPLATE.format(query=query) + suffix


# -- chunks and units ------------------------------------------------------------------------------
def stream_chunks(num_frames: int, question_points: list[int], chunk_frames: int) -> list[range]:
    """The chunks one camera's ``num_frames`` frames become when questions are asked after
    ``question_points`` frames (each question first encodes the frames queued so far)."""
    queue: ChunkQueue[int] = ChunkQueue(chunk_frames)
    points = sorted(set(question_points))
    chunks, p = [], 0
    for index in range(num_frames):
        batch = queue.push("", index)
        if batch:
            chunks.append(range(batch[0], batch[-1] + 1))
        while p < len(points) and points[p] == index + 1:
            chunks += [range(b[0], b[-1] + 1) for _, b in queue.flush()]
            p += 1
    return chunks


def unit_members(num_frames: int, frames_per_unit: int) -> list[tuple[int, ...]]:
    """Which frames of a chunk make each stream unit (a temporal patch on Qwen2.5-VL)."""
    return [tuple(range(s, min(s + frames_per_unit, num_frames))) for s in range(0, num_frames, frames_per_unit)]


def padded_members(members: tuple[int, ...], frames_per_unit: int) -> list[int]:
    """A unit's frames filled to the temporal patch: an odd last frame is repeated (as the image
    path does for a still image)."""
    return list(members) + [members[-1]] * (frames_per_unit - len(members))


# -- positions -------------------------------------------------------------------------------------
def text_positions(count: int, axes: int, start: float = 0.0, device=None) -> torch.Tensor:
    """[axes, count]: text advances one position per token, every M-RoPE axis equal."""
    row = torch.arange(count, dtype=torch.float32, device=device) + start
    return row.expand(axes, count).clone()


def sequential_positions(count: int, device=None) -> torch.Tensor:
    """[1, count]: 1D RoPE, one position per visual token (LLaVA-OneVision)."""
    return torch.arange(count, dtype=torch.float32, device=device)[None, :]


def mrope_chunk_positions(units: int, rows: int, cols: int, t_stride: float, device=None) -> torch.Tensor:
    """[3, units·rows·cols] M-RoPE (t, h, w) of a chunk's visual tokens, relative to the chunk start.
    Unit k sits at t = floor(k · t_stride), t_stride = frames per unit / fps · tokens_per_second
    (transformers' get_rope_index)."""
    t = torch.tensor([math.floor(k * t_stride) for k in range(units)], dtype=torch.float32)
    t = t.view(units, 1, 1).expand(units, rows, cols)
    h = torch.arange(rows, dtype=torch.float32).view(1, rows, 1).expand(units, rows, cols)
    w = torch.arange(cols, dtype=torch.float32).view(1, 1, cols).expand(units, rows, cols)
    return torch.stack([t.reshape(-1), h.reshape(-1), w.reshape(-1)]).to(device)


# -- a whole stream at once (training, and the golden test against the Session) --------------------
def window_key_mask(token_units: torch.Tensor, visible_units) -> torch.Tensor:
    """[K] bool: the keys a question over a time window may attend to, given each key's unit id:
    the prefix and the tokens of the window's units; nothing else (docs/interfaces.md "Time
    windows and evidence"). The Session's cache applies the same rule (``KVStore.visible``)."""
    units = torch.as_tensor(sorted(int(u) for u in visible_units), dtype=torch.long)
    return (token_units == PREFIX_UNIT) | torch.isin(token_units, units.to(token_units.device))


@dataclass
class Segment:
    kind: str  # "prefix" | "chunk" | "question"
    start: int  # first token in the packed sequence
    length: int
    sees: int = 0  # a question: how many stream tokens (prefix and chunks) it sees
    window_units: tuple[int, ...] | None = None  # a windowed question: the only units it sees


@dataclass
class StreamLayout:
    """A stream and its questions packed into one sequence: the stream first (prefix, then every
    chunk in order), then each question. ``mask[i, j]``: token i may attend to token j."""

    positions: torch.Tensor  # [axes, T] float32
    mask: torch.Tensor  # [T, T] bool
    segments: list[Segment] = field(default_factory=list)

    def questions(self) -> list[Segment]:
        return [s for s in self.segments if s.kind == "question"]


def lay_out_stream(prefix_len: int, chunk_positions: list[torch.Tensor], questions: list[tuple],
                   axes: int, chunk_units: list[torch.Tensor] | None = None) -> StreamLayout:
    """Positions and mask for a prefix of ``prefix_len`` tokens, chunks with the given relative
    positions ([axes, n] each), and ``questions`` as (chunks encoded before it, its token count)
    or (chunks before, token count, the units of its time window). Each chunk starts at
    ``next_offset`` of what precedes it; each question at ``next_offset`` of the stream as it was
    asked, a windowed one too (questions leave the cache as it was, so they move nothing).
    ``chunk_units``: each chunk token's unit id, needed by windowed questions."""
    parts = [text_positions(prefix_len, axes)]
    segments = [Segment("prefix", 0, prefix_len)]
    ends = [prefix_len]  # stream length after each chunk
    stream = parts[0]
    for rel in chunk_positions:
        placed = rel.to(torch.float32) + next_offset(stream)
        segments.append(Segment("chunk", ends[-1], placed.shape[1]))
        parts.append(placed)
        stream = torch.cat((stream, placed), dim=1)
        ends.append(ends[-1] + placed.shape[1])
    total = ends[-1]
    question_parts = []
    for chunks_before, length, *window in questions:
        if not 0 <= chunks_before <= len(chunk_positions):
            raise ValueError(f"a question after {chunks_before} chunks; the stream has {len(chunk_positions)}")
        sees = ends[chunks_before]
        question_parts.append(text_positions(length, axes, next_offset(stream[:, :sees])))
        units = tuple(sorted(int(u) for u in window[0])) if window and window[0] is not None else None
        segments.append(Segment("question", total + sum(p.shape[1] for p in question_parts[:-1]), length, sees,
                                units))
    positions = torch.cat(parts + question_parts, dim=1)
    size = positions.shape[1]
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[:total, :total] = torch.ones(total, total, dtype=torch.bool).tril()
    token_units = None
    if any(seg.window_units is not None for seg in segments):
        if chunk_units is None or len(chunk_units) != len(chunk_positions):
            raise ValueError("windowed questions need every chunk token's unit (chunk_units)")
        token_units = torch.cat([torch.full((prefix_len,), PREFIX_UNIT, dtype=torch.long)]
                                + [u.to(torch.long) for u in chunk_units])
    for seg in segments:
        if seg.kind == "question":
            rows = slice(seg.start, seg.start + seg.length)
            if seg.window_units is None:
                mask[rows, :seg.sees] = True
            else:
                mask[rows, :seg.sees] = window_key_mask(token_units[:seg.sees], seg.window_units)
            mask[rows, rows] = torch.ones(seg.length, seg.length, dtype=torch.bool).tril()
    return StreamLayout(positions, mask, segments)
