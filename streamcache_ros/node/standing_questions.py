"""The standing questions as a list several clients hold: add_watch_question and
remove_watch_question edit it one question at a time, on the node, in one step (docs/interfaces.md
"Standing questions").

The list itself is parameter ``watch_questions``: every edit goes through ``set_parameters``, so
``ros2 param get`` shows the list the node asks, and the runtime checks and the post-set callback
(tuning.py) are the same as for ``ros2 param set``. What the parameter cannot say is who holds a
question: a question added n times stands until it is removed n times, so a client that removes its
own never takes out one that another client (or the params file) stands as well. Setting the
parameter as a whole (``ros2 param set``) names the list: a question it keeps keeps its holders, one
it drops goes whoever held it, and a new one has one holder.

Edits are serialised with one another and with the parameter services: the node serves both
services in its default callback group, the one rclpy's parameter and lifecycle services use.
"""
from __future__ import annotations

import threading
from typing import Callable

from rcl_interfaces.msg import SetParametersResult

from ..engine.errors import StreamCacheError


def standing_question_refusal(session, question: str) -> str:
    """Why ``question`` cannot stand ('' = it can): the checks `when` makes (Session.check_yes_no_question)."""
    try:
        session.check_yes_no_question(question)
    except StreamCacheError as err:
        return f"not a standing question: {err}"
    return ""


class StandingQuestions:
    """The holders of each standing question, over ``time_questions`` (which asks them). Given
    ``current()`` (parameter watch_questions now), ``set_list(questions)`` (sets the parameter: its
    SetParametersResult), ``refusal(question)`` (why it cannot stand, '' = it can) and ``logger``."""

    def __init__(self, time_questions, current: Callable[[], list[str]],
                 set_list: Callable[[list[str]], SetParametersResult], refusal: Callable[[str], str], logger):
        self.time_questions = time_questions
        self.current = current
        self.set_list = set_list
        self.refusal = refusal
        self.log = logger
        self._lock = threading.RLock()  # the post-set callback of our own edit runs on the editing thread
        self._holders: dict[str, int] = {}

    def set_watch_questions(self, questions) -> None:
        """The list from now on (configure, and every accepted change of the parameter, ours included):
        a question that was already standing keeps its holders, a new one has one."""
        with self._lock:
            self.time_questions.set_watch_questions(questions)
            self._holders = {q: self._holders.get(q, 1) for q in questions}

    def holders(self, question: str) -> int:
        with self._lock:
            return self._holders.get(question, 0)

    def add(self, question: str) -> str:
        """One more holder of ``question`` ('' when it stands, else why not)."""
        question = question.strip()
        with self._lock:
            why = self.refusal(question)
            if why:
                return why
            listed = list(self.current())
            standing = _entry(listed, question)
            if standing is not None:
                self._holders[standing] = self._holders.get(standing, 1) + 1
                return ""
            result = self.set_list(listed + [question])
            return "" if result.successful else result.reason

    def remove(self, question: str) -> str:
        """One holder fewer of ``question``; at none it stands no more ('' when done, else why not)."""
        question = question.strip()
        with self._lock:
            listed = list(self.current())
            standing = _entry(listed, question)
            if standing is None:
                return f"'{question[:80]}' is not a standing question (standing: {listed or 'none'})"
            left = self._holders.get(standing, 1) - 1
            if left > 0:
                self._holders[standing] = left
                return ""
            result = self.set_list([q for q in listed if q != standing])
            return "" if result.successful else result.reason

    def on_add(self, request, response):
        return self._serve(self.add, request.question, "added", response)

    def on_remove(self, request, response):
        return self._serve(self.remove, request.question, "removed", response)

    def _serve(self, edit: Callable[[str], str], question: str, done: str, response):
        with self._lock:  # the reply shows the list this edit left
            why = edit(question)
            listed = list(self.current())
            standing = _entry(listed, question.strip())
            response.success, response.error_message = not why, why
            response.watch_questions = listed
            response.holders = self.holders(standing) if standing is not None else 0
        if why:
            self.log.warning(f"standing question '{question.strip()[:80]}' not {done}: {why}")
        else:
            self.log.info(f"standing question {done}: '{question.strip()}' ({response.holders} holder(s)); "
                          f"standing now: {listed or 'none'}")
        return response


def _entry(listed: list[str], question: str) -> str | None:
    """The entry of ``listed`` that is ``question`` (spaces around either aside), or None."""
    return next((q for q in listed if q.strip() == question), None)
