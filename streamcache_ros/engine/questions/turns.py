"""Who uses the model and the cache next: a re-entrant lock where questions give way to chunks.

With a plain lock a chunk that is due waits for the question in progress, then races every other
question waiting for the lock; with two clients asking back to back it can lose again and again,
and the camera stream backs up. Here a waiting chunk (or any other short "priority" user: status,
reset, save, load) goes before every question still waiting, so ingest waits for at most the one
question in progress (docs/reliability.md, "Threads and executor").
"""
from __future__ import annotations

import threading
from contextlib import contextmanager


class TurnLock:
    """Re-entrant. ``with lock:`` takes a priority turn; ``with lock.question():`` a question's turn,
    which starts only when no priority user is waiting."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._priority_waiting = 0
        self._questions_waiting = 0
        self._owner_is_question = False
        self.questions_done = 0  # question turns ended (read without the lock: an int)

    def _acquire(self, priority: bool) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:  # re-entrant: a question flushing its pending frames, save, ...
                self._depth += 1
                return
            if priority:
                self._priority_waiting += 1
            else:
                self._questions_waiting += 1
            try:
                self._cond.wait_for(lambda: self._owner is None and (priority or self._priority_waiting == 0))
            finally:
                if priority:
                    self._priority_waiting -= 1
                    self._cond.notify_all()  # questions held back by this waiter look again
                else:
                    self._questions_waiting -= 1
            self._owner, self._depth, self._owner_is_question = me, 1, not priority

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("TurnLock released by a thread that does not hold it")
            self._depth -= 1
            if self._depth == 0:
                self.questions_done += self._owner_is_question
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> "TurnLock":
        self._acquire(priority=True)
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    @contextmanager
    def question(self):
        self._acquire(priority=False)
        try:
            yield self
        finally:
            self.release()

    def waiting(self) -> tuple[int, int]:
        """(priority users, questions) waiting now."""
        with self._cond:
            return self._priority_waiting, self._questions_waiting
