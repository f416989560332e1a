"""The node's questions: the Ask service and the ask_action action (docs/interfaces.md "Ask").

A question the engine refuses is answered with the engine's reason, the memory unchanged, and with
what the memory holds of the camera asked about; nothing a client sends can end the process.
"""
from __future__ import annotations

import threading
import traceback
from typing import Callable

from streamcache_ros_interfaces.action import Ask as AskAction

from ..engine.errors import AnswerError, ChunkError, StreamCacheError
from ..engine.status import EngineInfo
from . import translate
from .status import StatusReports


class Questions:
    """Answers Ask requests from ``session``. Given its ``info``, the ``status`` reports (refreshed
    after each question; a refusal says what the memory held), ``camera_key`` (a camera as asked
    for -> its resolved topic), the node's ``stopping`` event (a question in progress stops at its
    next token), its ``name``, ``logger`` and ``clock``, and ``is_active``."""

    places: dict = {}  # the places_file's named places (node.py sets them)

    def __init__(self, session, info: EngineInfo, status: StatusReports, camera_key: Callable[[str], str],
                 stopping: threading.Event, name: str, logger, clock, is_active: Callable[[], bool]):
        self.session = session
        self.info = info
        self.status = status
        self.camera_key = camera_key
        self.stopping = stopping
        self.name = name
        self.log = logger
        self.clock = clock
        self.is_active = is_active

    def answer(self, request, result, on_text=None, should_stop=None):
        """Answer an Ask request into ``result`` (an Ask response or action result). Never raises.
        Returns (result, cancelled)."""
        result.method, result.model_id = self.info.policy, self.info.model_id
        result.option_index = -1
        camera = self.camera_key(request.camera)

        def refuse(message: str):  # with what the memory holds (of the camera asked about)
            status = self.status.latest()
            held = status.camera_memory.get(camera) if camera else status.memory
            return translate.refuse(result, message, held)

        if not self.is_active():
            return refuse(f"{self.name} is not active: configure and activate it first"), False
        stop = (lambda: self.stopping.is_set() or should_stop()) if should_stop else self.stopping.is_set
        try:
            answer = self.session.ask(request.question, list(request.options), camera=camera,
                                      max_new_tokens=int(request.max_new_tokens), on_text=on_text, should_stop=stop,
                                      since=translate.window_bound(request.since),
                                      until=translate.window_bound(request.until),
                                      evidence_k=int(request.evidence_k) or None,
                                      where=translate.request_place(request, self.places))
        except StreamCacheError as err:  # QuestionError, ChunkError (flushing), AnswerError: memory unchanged
            if isinstance(err, (AnswerError, ChunkError)):  # a fault, not the client's doing
                self.log.error(f"question failed: {err}")
            self.status.refresh()
            return refuse(str(err)), False
        except Exception as err:  # noqa: BLE001 - a request never takes the node down
            self.log.error(f"question failed: {type(err).__name__}: {err}\n{traceback.format_exc()}")
            self.status.refresh()
            return refuse(f"internal error: {type(err).__name__}: {err}"), False
        self.status.refresh()
        now_s = self.clock.now().nanoseconds * 1e-9
        translate.fill_answer(result, answer, now_s)
        if getattr(request, "with_images", False) and answer.evidence:  # false: nothing read (docs/show.md)
            try:
                translate.fill_images(result, self.session.thumbnails_at([e.stamp for e in answer.evidence],
                                                                         [e.camera for e in answer.evidence]))
            except Exception as err:  # noqa: BLE001 - the answer stands without its pictures
                self.log.warning(f"evidence images not read: {type(err).__name__}: {err}")
        return result, answer.cancelled

    def on_ask(self, request, response):
        response, _ = self.answer(request, response)
        return response

    def execute_ask(self, goal_handle):
        result = AskAction.Result()

        def on_text(partial: str, new_text: str) -> None:
            goal_handle.publish_feedback(AskAction.Feedback(partial_answer=partial, new_text=new_text))

        result, cancelled = self.answer(goal_handle.request, result, on_text, lambda: goal_handle.is_cancel_requested)
        if cancelled and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        elif result.success:
            goal_handle.succeed()
        else:
            goal_handle.abort()
        return result
