"""The scratch memories replays are prefilled into (recall/tier.py; docs/archive.md "Recall").

A scratch memory is a Session over a full cache. Its system prompt is the same tokens every time, so
its KV is prefilled once, copied out, and each later scratch memory starts from a copy of it: on the
bundled models that prefill costs about as much as an ask, a fifth of a question about the
beginning. The copy is a few tokens a layer; it is made again if the system prompt changes.
"""
from __future__ import annotations

import threading
from typing import Any, Callable


class ScratchMemories:
    """``make(prefix_state)`` builds a scratch memory (prefix_state None: it prefills its system
    prompt itself); ``prefix_ids()`` says which system prompt the copy is of."""

    def __init__(self, make: Callable[[dict | None], Any], prefix_ids: Callable[[], list[int]]):
        self._make, self._prefix_ids = make, prefix_ids
        self._lock = threading.Lock()  # replays run off the turn lock, two at a time at most
        self._prefix: tuple[tuple[int, ...], dict] | None = None  # (the prompt's ids, its KV state)

    def __call__(self):
        ids = tuple(self._prefix_ids())
        with self._lock:
            kept = self._prefix
        if kept is not None and kept[0] == ids:
            return self._make(kept[1])
        scratch = self._make(None)
        state = scratch.policy.state_dict()  # copied out: the scratch's own buffers stay its own
        with self._lock:
            self._prefix = (ids, state)
        return scratch
