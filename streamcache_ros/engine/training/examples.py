"""A stream and its questions as one training example, laid out exactly as the Session asks them.

``lay_out_example`` turns frames, the points where questions are asked and the question texts into
input embeddings, positions, a mask and answer targets, with the functions of ``layout.py`` and the
adapter's own preprocessing and vision tower (gradients flow through both). The Session builds the
same token layout one chunk at a time (test/test_layout_golden.py checks that they agree).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..adapters import ModelAdapter
from ..stream.layout import StreamLayout, lay_out_stream, stream_chunks


@dataclass
class AskedQuestion:
    after_frames: int  # the question is asked once this many frames are in
    text: str
    options: list[str]
    answer: str  # the target: the answer's words (followed by the end-of-turn token)
    # a time window, frame indices both inside (None: the whole stream so far): the question sees
    # only the units holding a frame of the window, as a windowed Session.ask does
    window: tuple[int, int] | None = None


@dataclass
class LaidOutExample:
    embeds: torch.Tensor  # [1, T, hidden]
    layout: StreamLayout
    target_rows: torch.Tensor  # [A] rows whose next-token prediction is supervised
    targets: torch.Tensor  # [A] the tokens they must predict
    question_spans: list[tuple[int, int]]  # per question: (first target index, count) in targets
    chunks: list[range]


def question_tokens(adapter: ModelAdapter, question: AskedQuestion) -> tuple[list[int], list[int]]:
    """(input ids, answer ids): the question prompt then the answer's tokens as decoding would feed
    them back; the answer ids end with the end-of-turn token, which is predicted, never fed."""
    prompt = adapter.question_ids(question.text, question.options)
    answer = adapter.answer_ids(question.answer)
    return prompt + answer[:-1], answer


def lay_out_example(adapter: ModelAdapter, frames: list[np.ndarray], questions: list[AskedQuestion],
                    chunk_frames: int, vision_cache: dict | None = None) -> LaidOutExample:
    """One camera's ``frames`` (RGB uint8) with ``questions`` asked along the way."""
    points = [q.after_frames for q in questions]
    if any(not 1 <= p <= len(frames) for p in points):
        raise ValueError(f"questions after {points} frames; the stream has {len(frames)}")
    chunks = stream_chunks(len(frames), points, chunk_frames)
    prefix_ids = adapter.prefix_ids
    parts = [adapter.embed_text(prefix_ids)[0]]
    chunk_positions, chunk_units, unit_frames = [], [], []
    for chunk in chunks:
        inputs = adapter.preprocess([frames[i] for i in chunk])
        parts.append(adapter.vision_features(inputs.tensors).to(adapter.dtype))
        chunk_positions.append(adapter.chunk_rel_positions(inputs).cpu())
        # unit ids in arrival order, as the Session numbers them
        ids = torch.arange(len(unit_frames), len(unit_frames) + inputs.num_units)
        chunk_units.append(ids.repeat_interleave(inputs.tokens_per_unit))
        unit_frames += [tuple(chunk[i] for i in members) for members in inputs.unit_frames]
    ends = np.cumsum([len(c) for c in chunks])
    asked, answers = [], []
    for q in questions:
        ids, answer = question_tokens(adapter, q)
        # the chunks encoded when the question arrives: all that end at or before its frame count
        chunks_before = int(np.searchsorted(ends, q.after_frames, side="right"))
        window = None
        if q.window is not None:
            window = [u for u, members in enumerate(unit_frames) if any(q.window[0] <= f <= q.window[1] for f in members)]
            if not window:
                raise ValueError(f"the window {q.window} holds no frame of the stream")
        asked.append((chunks_before, len(ids), window))
        answers.append((ids, answer))
        parts.append(adapter.embed_text(ids)[0])
    layout = lay_out_stream(len(prefix_ids), chunk_positions, asked, adapter.position_axes, chunk_units)
    rows, targets, spans = [], [], []
    for seg, (ids, answer) in zip(layout.questions(), answers):
        first = seg.start + len(ids) - len(answer)  # the prompt's last token predicts the answer's first
        spans.append((len(targets), len(answer)))
        rows += range(first, first + len(answer))
        targets += answer
    return LaidOutExample(torch.cat(parts)[None], layout, torch.tensor(rows), torch.tensor(targets), spans, chunks)


def example_logits(adapter: ModelAdapter, example: LaidOutExample) -> torch.Tensor:
    """[A, vocab] logits at the supervised rows."""
    hidden = adapter.forward_laid_out(example.embeds, example.layout.positions, example.layout.mask)
    return adapter.lm_head(hidden[0, example.target_rows.to(hidden.device)]).float()


def example_loss(adapter: ModelAdapter, example: LaidOutExample) -> tuple[torch.Tensor, list[bool]]:
    """Mean cross-entropy over the answer tokens, and per question whether greedy decoding would
    give its answer exactly (every token the argmax)."""
    logits = example_logits(adapter, example)
    targets = example.targets.to(logits.device)
    loss = F.cross_entropy(logits, targets)
    hit = (logits.argmax(dim=-1) == targets).cpu()
    correct = [bool(hit[start:start + count].all()) for start, count in example.question_spans]
    return loss, correct
