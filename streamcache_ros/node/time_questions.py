"""The node's questions about time: the `when` service and the standing questions (watch_questions)
that publish a WatchEvent per chunk (docs/interfaces.md "When", "Standing questions").

Both are translation: the search and the windows are the engine's (engine/questions/when.py, Session.when /
Session.watch). A `when` request the engine refuses (an empty memory, an unknown camera or mode, a
window with no frame) is answered with the engine's reason, the memory unchanged. Standing questions
run right after every chunk the session takes in (``Session.on_chunk``): a full chunk on the ingest
thread, a partial one that a question, a save or a rate change encoded on that request's thread, so
their cost is part of what a chunk takes (the latency diagnostic shows it) and every chunk gets its
events, in order; a failure there is logged, never the end of ingest or of the request.
"""
from __future__ import annotations

import threading
import time
import traceback
from typing import Callable

from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy

from ..engine.errors import ConfigError, StreamCacheError
from ..engine.status import ChunkReport
from . import params, translate
from .publishing import publish_quietly

# one event per standing question per chunk: a deep history keeps a slow reliable subscriber whole
EVENT_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=200, reliability=QoSReliabilityPolicy.RELIABLE,
                       durability=QoSDurabilityPolicy.VOLATILE)


def timeline_peaks(stamps, probabilities, count: int = 4, threshold: float = 0.5) -> list[float]:
    """The stamps a timeline's picture shows: the middle frame of each run of P(yes) >= ``threshold``
    (the ``count`` runs of highest P(yes)), in time order; the single most likely frame when no run
    reaches it (docs/show.md)."""
    stamps, probabilities = list(stamps), [float(p) for p in probabilities]
    runs, start = [], None
    for i, p in enumerate(probabilities + [-1.0]):
        if p >= threshold and start is None:
            start = i
        elif p < threshold and start is not None:
            runs.append((max(probabilities[start:i]), stamps[(start + i - 1) // 2]))
            start = None
    if not runs:
        return [stamps[max(range(len(stamps)), key=probabilities.__getitem__)]] if stamps else []
    return sorted(stamp for _, stamp in sorted(runs, key=lambda r: -r[0])[:count])


class TimeQuestions:
    """Serves `when` and asks the standing questions over ``session``. Given ``watch_pub``
    (watch_events), ``camera_key`` (a camera as asked for -> its resolved topic), the node's ``name``
    and ``logger``, ``is_active``, and ``changed()``: called after each `when`, to refresh the
    memory's status."""

    places: dict = {}  # the places_file's named places (node.py sets them)

    def __init__(self, session, watch_pub, camera_key: Callable[[str], str], name: str, logger,
                 is_active: Callable[[], bool], changed: Callable[[], None], shown_pub=None):
        self.session = session
        self.watch_pub = watch_pub
        self.shown_pub = shown_pub  # ~/shown: the frame each `when` found (docs/show.md)
        self.camera_key = camera_key
        self.name = name
        self.log = logger
        self.is_active = is_active
        self.changed = changed
        self._watch_lock = threading.Lock()
        self._watch_questions: list[str] = []
        self._last_answers: dict[tuple[str, str], str] = {}  # (question, camera) -> previous answer
        self.last_watch_ms = 0.0  # the standing questions' time on the last chunk (latency diagnostic)
        session.on_chunk = self.ask_standing

    @property
    def watch_count(self) -> int:
        return len(self._watch_questions)

    def set_watch_questions(self, questions) -> None:
        """The standing questions from now on (configure, and a runtime ``watch_questions`` change);
        a question no longer asked forgets its previous answers."""
        questions = params.check_watch_questions(list(questions), self.session)
        with self._watch_lock:
            self._watch_questions = questions
            self._last_answers = {k: v for k, v in self._last_answers.items() if k[0] in questions}

    def on_when(self, request, response):
        if not self.is_active():
            response.success = False
            response.error_message = f"{self.name} is not active: configure and activate it first"
            return response
        try:
            found = self.session.when(request.question, request.mode or "last",
                                      camera=self.camera_key(request.camera),
                                      since=translate.window_bound(request.since),
                                      until=translate.window_bound(request.until),
                                      where=translate.request_place(request, self.places))
        except StreamCacheError as err:  # refused, or failed with the memory unchanged
            response.success, response.error_message = False, str(err)
            return response
        except Exception as err:  # noqa: BLE001 - a request never takes the node down
            self.log.error(f"when failed: {type(err).__name__}: {err}\n{traceback.format_exc()}")
            response.success, response.error_message = False, f"internal error: {type(err).__name__}: {err}"
            return response
        finally:
            self.changed()
        translate.fill_when(response, found)
        self._show(request, response, found)
        return response

    def _show(self, request, response, found) -> None:
        """The found frame's thumbnail into the response (with_images; for a timeline, its peaks'),
        and onto ~/shown when someone subscribes; neither reads the archive when nobody asked
        (docs/show.md)."""
        wanted = bool(getattr(request, "with_images", False))
        # ~/shown and ~/shown/compressed (the node passes both): each only while subscribed to
        publishers = self.shown_pub if isinstance(self.shown_pub, (tuple, list)) else (self.shown_pub,)
        watched = []
        for publisher in publishers:
            try:
                if publisher is not None and publisher.get_subscription_count() > 0:
                    watched.append(publisher)
            except Exception:  # noqa: BLE001 - destroyed at cleanup or shutdown: nothing to show to
                pass
        showing = bool(watched)
        stamps = [found.stamp] if found.found else []
        if wanted and (request.mode or "last") == "timeline":
            stamps = timeline_peaks(found.timeline_stamps, found.timeline_yes_probability)
        if not stamps or not (wanted or showing):
            return
        try:
            thumbnails = self.session.thumbnails_at(stamps, [found.camera] * len(stamps))
        except Exception as err:  # noqa: BLE001 - the answer stands without its pictures
            self.log.warning(f"the frames `when` found were not read: {type(err).__name__}: {err}")
            return
        if wanted:
            translate.fill_images(response, thumbnails)
        shown = [t for t in thumbnails if t is not None and (not found.found or abs(t.stamp - found.stamp) < 1e-3)]
        if showing and found.found and shown:
            message = translate.compressed_image(shown[0])
            for publisher in watched:
                publish_quietly(publisher, message)

    def ask_standing(self, report: ChunkReport) -> None:
        """The standing questions over the chunk just encoded; one WatchEvent per answer."""
        with self._watch_lock:
            questions = list(self._watch_questions)
        if not questions or self.watch_pub is None:
            self.last_watch_ms = 0.0
            return
        started = time.perf_counter()
        try:
            answers = self.session.watch(questions, report)
        except StreamCacheError as err:
            self.log.warning(f"standing questions on the chunk from {report.camera}: {err}")
            answers = []
        except Exception as err:  # noqa: BLE001 - neither ingest nor the request that encoded the chunk may end here
            self.log.error(f"standing questions on the chunk from {report.camera} failed: {type(err).__name__}: "
                           f"{err}\n{traceback.format_exc()}")
            answers = []
        self.last_watch_ms = (time.perf_counter() - started) * 1e3
        with self._watch_lock:
            for answer in answers:
                key = (answer.question, answer.camera)
                previous = self._last_answers.get(key)
                self._last_answers[key] = answer.answer
                publish_quietly(self.watch_pub, translate.watch_event(answer, previous is not None and
                                                                      previous != answer.answer))


def watch_questions_refusal(value, session=None) -> str:
    """Why a runtime ``watch_questions`` value cannot be taken ('' = it can): with ``session``, each
    question is checked as add_watch_question checks it."""
    try:
        params.check_watch_questions(list(value), session)
    except (ConfigError, TypeError) as err:
        return str(err)
    return ""
