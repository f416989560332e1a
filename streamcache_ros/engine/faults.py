"""TEST ONLY: make chosen chunks or questions fail, to prove the node survives faults.

    STREAMCACHE_TEST_FAULTS="chunk:2=oom,chunk:5=error,compress:3=oom,question:4=error" streamcache_node

``chunk:N``: the Nth chunk (counted from 1, failed ones included) raises in the middle of its
prefill, at the middle decoder layer, so half the layers already hold its keys; ``compress:N``: the
Nth chunk raises when its compression starts (after a complete prefill); ``question:N``: the Nth
question that reaches the model raises in its prefill. ``oom`` raises torch.cuda.OutOfMemoryError
(what CUDA raises; constructible without a GPU), ``error`` a RuntimeError. The node reads the
variable at configure and logs a warning that faults are being injected; nothing else reads it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

ENV = "STREAMCACHE_TEST_FAULTS"
STAGES = ("chunk", "compress", "question")
KINDS = ("oom", "error")
_ITEM = re.compile(r"^(chunk|compress|question):([1-9][0-9]*)=(oom|error)$")


def make_exception(kind: str, where: str) -> Exception:
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

    def install(self, session) -> None:
        """Hook the plan into ``session`` (an engine Session)."""
        middle = len(session.adapter.text_model.layers) // 2
        fired: set[tuple[str, int]] = set()

        def hook(stage: str, attempt_of):
            def layer_hook(layer: int) -> None:
                key = (stage, attempt_of())
                if layer == middle and key in self.faults and key not in fired:
                    fired.add(key)
                    raise make_exception(self.faults[key], f"{stage} {key[1]}, layer {layer}")
            return layer_hook

        session.chunk_layer_hook = hook("chunk", lambda: session.chunk_attempts)
        session.question_layer_hook = hook("question", lambda: session.question_attempts)
        compress = session.policy.after_chunk

        def after_chunk(context):
            key = ("compress", session.chunk_attempts)
            if key in self.faults and key not in fired:
                fired.add(key)
                raise make_exception(self.faults[key], f"compress {key[1]}")
            return compress(context)

        session.policy.after_chunk = after_chunk
