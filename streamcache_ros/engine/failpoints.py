"""Failpoints: the named places where the engine really fails, made to fail on purpose in tests.

    STREAMCACHE_TEST_FAULTS="chunk:2=oom,chunk:5=error,compress:3=oom,question:4=error" streamcache_node

The engine calls a point where the failure it stands for would happen; nothing is patched:

- ``encode``: a chunk's vision encoding starts (context: ``chunk``, the chunk's attempt number);
- ``prefill``: before each decoder layer of a chunk's prefill (``chunk``, ``layer``, ``layers``);
- ``compress``: a chunk's compression starts, after a complete prefill (``chunk``);
- ``question``: before each decoder layer while a question is answered (``question``, ``layer``,
  ``layers``);
- ``archive``: inside the archive's write path (``step``): ``insert`` after a chunk's row is written
  and before its transaction commits, ``bound`` after the bound deleted a chunk and before that
  commit, ``checkpoint`` as the log is folded back at close (docs/reliability.md "Crashes").

Every point is off, and costs a dictionary lookup, unless it is armed: by tests (``armed``), or by a
plan in the environment variable ``STREAMCACHE_TEST_FAULTS`` (the node arms it at configure and logs
a warning; nothing else reads the variable). A plan's items are ``<stage>:N=<kind>``: ``encode:N``
raises as the Nth chunk's encoding starts; ``chunk:N`` in the middle of its prefill, at the middle
decoder layer, so half the layers already hold its keys; ``compress:N`` as its compression starts;
``question:N`` at the middle layer of the Nth question that reaches the model. Chunks and questions
are counted from 1, failed ones included; each item fires once. ``oom`` raises
torch.cuda.OutOfMemoryError (what CUDA raises; constructible without a GPU), ``error`` a RuntimeError.
The archive's steps are stages of their own (``archive_insert:N``, ``archive_bound:N``,
``archive_checkpoint:N``, counted per step) and take two more kinds: ``kill`` (SIGKILL, the process
dies there, as in a power cut of the process) and ``full`` (SQLite's "database or disk is full").
"""
from __future__ import annotations

import os
import re
import signal
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

ENV = "STREAMCACHE_TEST_FAULTS"
POINTS = ("encode", "prefill", "compress", "question", "archive")
ARCHIVE_STEPS = ("insert", "bound", "checkpoint")
STAGES = ("encode", "chunk", "compress", "question") + tuple(f"archive_{step}" for step in ARCHIVE_STEPS)
KINDS = ("oom", "error", "kill", "full")
_ITEM = re.compile(rf"^({'|'.join(STAGES)}):([1-9][0-9]*)=({'|'.join(KINDS)})$")

Action = Callable[..., None]
_armed: dict[str, Action] = {}


def hit(point: str, **context) -> None:
    """The engine passes ``point``: an armed action runs (and may raise)."""
    action = _armed.get(point) if _armed else None
    if action is not None:
        action(**context)


def layer_hook(point: str, **context) -> Callable[[int], None] | None:
    """A hook for the adapter's decoder that hits ``point`` before each layer, or None while the
    point is off (the decoder then calls nothing)."""
    action = _armed.get(point)
    if action is None:
        return None
    return lambda layer: action(layer=layer, **context)


@contextmanager
def armed(**actions: Action) -> Iterator[None]:
    """Arm points for the duration of a ``with`` block: ``armed(prefill=lambda chunk, layer, layers: ...)``."""
    unknown = set(actions) - set(POINTS)
    if unknown:
        raise ValueError(f"unknown failpoint(s) {', '.join(sorted(unknown))} (points: {', '.join(POINTS)})")
    before = dict(_armed)
    _armed.update(actions)
    try:
        yield
    finally:
        _armed.clear()
        _armed.update(before)


def make_exception(kind: str, where: str) -> Exception:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # never returns: the process ends here, mid-write
    if kind == "full":
        return sqlite3.OperationalError("database or disk is full")
    if kind == "oom":
        return torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (injected at {where})")
    return RuntimeError(f"injected fault at {where}")


@dataclass(frozen=True)
class FaultPlan:
    faults: dict[tuple[str, int], str]  # (stage, attempt number) -> kind

    @classmethod
    def parse(cls, text: str) -> "FaultPlan":
        faults = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            found = _ITEM.match(item)
            if not found:
                raise ValueError(f"{ENV}: '{item}' is not <{'|'.join(STAGES)}>:<N>=<{'|'.join(KINDS)}>")
            faults[(found.group(1), int(found.group(2)))] = found.group(3)
        return cls(faults)

    @classmethod
    def from_environment(cls) -> "FaultPlan | None":
        text = os.environ.get(ENV, "").strip()
        return cls.parse(text) if text else None

    def __str__(self) -> str:
        return ",".join(f"{stage}:{n}={kind}" for (stage, n), kind in sorted(self.faults.items()))

    def actions(self) -> dict[str, Action]:
        """The plan as one action per failpoint."""
        fired: set[tuple[str, int]] = set()

        def fire(stage: str, number: int, where: str) -> None:
            key = (stage, number)
            if key in self.faults and key not in fired:
                fired.add(key)
                raise make_exception(self.faults[key], where)

        def in_middle(stage: str, number: int, layer: int, layers: int) -> None:
            if layer == layers // 2:
                fire(stage, number, f"{stage} {number}, layer {layer}")

        passes: dict[str, int] = {}

        def archive_step(step: str, **_) -> None:
            passes[step] = passes.get(step, 0) + 1
            fire(f"archive_{step}", passes[step], f"archive {step} {passes[step]}")

        return {"archive": archive_step,
                "encode": lambda chunk, **_: fire("encode", chunk, f"encode {chunk}"),
                "prefill": lambda chunk, layer, layers, **_: in_middle("chunk", chunk, layer, layers),
                "compress": lambda chunk, **_: fire("compress", chunk, f"compress {chunk}"),
                "question": lambda question, layer, layers, **_: in_middle("question", question, layer, layers)}

    @contextmanager
    def armed(self) -> Iterator[None]:
        with armed(**self.actions()):
            yield


def arm_from_environment() -> FaultPlan | None:
    """Arm the plan in ``STREAMCACHE_TEST_FAULTS`` for the rest of the process (None: no plan set).
    Raises ValueError for a plan that does not parse."""
    plan = FaultPlan.from_environment()
    if plan is not None:
        _armed.update(plan.actions())
    return plan
