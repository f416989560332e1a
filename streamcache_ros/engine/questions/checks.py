"""Checks of what comes in from outside: frames, questions, options, cameras, time windows.

Each raises the engine's own error (FrameError, QuestionError) with a message meant for whoever
sent the thing, before anything touches the cache; so a refused frame or question leaves the memory
exactly as it was (docs/reliability.md).
"""
from __future__ import annotations

import math
import re

import numpy as np

from .decoding import REPLACEMENT_CHARACTER
from ..errors import FrameError, QuestionError
from ..stream.layout import OPTION_LETTERS
from ..memory.ledger import Window

# A question longer than this many characters per allowed token cannot fit: refused before the
# tokenizer sees it (a megabyte string must not cost a tokenizer pass).
CHARS_PER_TOKEN_LIMIT = 16


def checked_frame(frame) -> np.ndarray:
    """An RGB uint8 frame [H, W, 3], contiguous; FrameError for anything else."""
    if not isinstance(frame, np.ndarray):
        raise FrameError(f"frame must be a numpy array, got {type(frame).__name__}")
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise FrameError(f"frame must be RGB [H, W, 3], got shape {tuple(frame.shape)}")
    if frame.dtype != np.uint8:
        raise FrameError(f"frame must be uint8, got {frame.dtype}")
    if frame.shape[0] < 1 or frame.shape[1] < 1:
        raise FrameError(f"frame is empty: shape {tuple(frame.shape)}")
    return np.ascontiguousarray(frame)


def checked_window(since: float | Window | None, until: float | None) -> Window | None:
    """The window with open ends as infinities, or None without one; QuestionError for a window
    that cannot hold a frame. A ``since`` that is a Window already (a place's, docs/places.md) is
    the window, as it is."""
    if isinstance(since, Window):
        return since
    if since is None and until is None:
        return None
    low, high = (-math.inf if since is None else float(since)), (math.inf if until is None else float(until))
    if math.isnan(low) or math.isnan(high):
        raise QuestionError("since/until must be numbers")
    if low > high:
        raise QuestionError(f"the window is empty: since ({low:.3f}) is after until ({high:.3f})")
    return Window(low, high)


def check_text(what: str, text: str) -> None:
    bad = text.find(REPLACEMENT_CHARACTER)
    if bad >= 0:
        raise QuestionError(f"the {what} is not valid UTF-8 (character {bad} is U+FFFD, what bytes that are "
                            "not UTF-8 become on the way): send UTF-8 text")


def check_question(question: str, options: list[str], max_question_tokens: int) -> None:
    """The question's text and options, before any tokenizer sees them."""
    if not isinstance(question, str) or not question.strip():
        raise QuestionError("the question is empty")
    if len(question) > CHARS_PER_TOKEN_LIMIT * max_question_tokens:
        raise QuestionError(f"the question is {len(question)} characters; at most "
                            f"{CHARS_PER_TOKEN_LIMIT * max_question_tokens} (max_question_tokens {max_question_tokens})")
    check_text("question", question)
    if len(options) > len(OPTION_LETTERS):
        raise QuestionError(f"at most {len(OPTION_LETTERS)} options (A-Z), got {len(options)}")
    for i, option in enumerate(options):
        if not option.strip():
            raise QuestionError(f"option {i} ({OPTION_LETTERS[i]}) is empty")
        check_text(f"option {i} ({OPTION_LETTERS[i]})", option)


# The words a yes/no question starts with (an auxiliary or modal verb, or its negation)
YES_NO_STARTS = frozenset(
    "am is are was were do does did has have had can could will would shall should may might must "
    "isn't aren't wasn't weren't don't doesn't didn't hasn't haven't hadn't can't couldn't won't wouldn't "
    "shouldn't".split())


def check_yes_no_question(question: str) -> None:
    """``when`` and the standing questions take a yes/no question about what was seen ("Did you see
    a red circle?", "Is the door open?"): one that starts with a verb such as did, is, was or has.
    A question of another kind ("What color is the square now?", "When did you last see ...?")
    has no yes to find in time: refused, naming what is taken (docs/interfaces.md "When")."""
    words = question.strip().split()
    first = words[0].strip("\"'¿¡([").lower().replace("\u2019", "'") if words else ""
    if first not in YES_NO_STARTS:
        raise QuestionError(f"'{question.strip()[:80]}' is not a yes/no question: `when` takes a yes/no question about "
                            "what was seen, starting with a verb such as Did, Is, Was, Are or Has (for example "
                            "'Did you see a red circle?'), and finds when its answer is yes; ask other questions "
                            "with `ask`")


# The last segments of an image topic that say what kind of image it is, not which camera
IMAGE_SEGMENTS = frozenset({"image_raw", "image", "image_rect", "image_color", "image_rect_color", "image_mono",
                            "compressed", "color", "rgb"})
# Words that make a question about what the cameras show now (docs/interfaces.md "Cameras by name")
NOW_WORDS = re.compile(r"\b(now|currently|at the moment|at present|right now)\b", re.IGNORECASE)
# a question about the stream's beginning (docs/archive.md "Recall"): "first" before an object's
# name ("the first object", "the first thing"), or the start itself; not "first" as a when ("when
# did you first see"), which the `when` search answers
FIRST_WORDS = re.compile(r"\b(the (first|earliest) (object|thing|shape|one)|at the (start|beginning)|"
                         r"in the beginning)\b", re.IGNORECASE)


def short_camera_name(topic: str) -> str:
    """A camera's short name: its topic's last segment that is not an image kind (``front`` for
    ``/front/image_raw`` and ``/robot/front/image_raw/compressed``)."""
    segments = [s for s in topic.strip("/").split("/") if s]
    while len(segments) > 1 and segments[-1] in IMAGE_SEGMENTS:
        segments.pop()
    return segments[-1] if segments else topic


def described_cameras(configured: tuple[str, ...]) -> str:
    """``front (/front/image_raw), rear (/rear/image_raw)``: each camera by short name and topic."""
    return ", ".join(f"{short_camera_name(c)} ({c})" for c in configured)


def resolved_camera(camera: str, configured: tuple[str, ...]) -> str:
    """The camera a question names: a topic as it is, or a short name standing for the one
    configured topic that has it ('' and anything else as they are, for the checks to refuse)."""
    if not camera or camera in configured:
        return camera
    named = [c for c in configured if short_camera_name(c) == camera]
    if len(named) > 1:
        raise QuestionError(f"camera '{camera}' is the short name of several cameras ({', '.join(named)}): "
                            "name one by its topic")
    return named[0] if named else camera


def check_camera_for_now(question: str, camera: str, configured: tuple[str, ...]) -> None:
    """A question about now on a node of several cameras must name one: "now" is a different
    thing on each camera, and an answer over all of them says nothing of which it read."""
    if not camera and len(configured) > 1 and NOW_WORDS.search(question):
        raise QuestionError(f"a question about now must name its camera on a node of {len(configured)} cameras: "
                            f"set camera to one of {described_cameras(configured)}")


def check_camera_name(camera: str, configured: tuple[str, ...]) -> None:
    """A camera a question names must be one of ``configured`` (the node's camera_topics) when any are."""
    check_text("camera name", camera)
    if camera and configured and camera not in configured:
        raise QuestionError(f"unknown camera '{camera}' (camera_topics: {', '.join(configured)}; short names: "
                            f"{', '.join(short_camera_name(c) for c in configured)})")


def check_camera_seen(camera: str, seen: list[str], configured: tuple[str, ...]) -> None:
    """A camera a question names must have sent frames (checked under the cache's lock)."""
    if camera and camera not in seen:
        if configured:
            raise QuestionError(f"no frames from camera '{camera}' yet")
        known = ", ".join(c or "''" for c in seen) or "none yet"
        raise QuestionError(f"unknown camera '{camera}' (cameras seen: {known})")


def check_prompt_length(ids: list[int], max_question_tokens: int) -> None:
    if len(ids) > max_question_tokens:
        raise QuestionError(f"the question is {len(ids)} tokens with its prompt; the limit is {max_question_tokens} "
                            "(max_question_tokens)")


def check_answer_room(prompt_tokens: int, answer_tokens: int, room: int) -> None:
    """A question and its answer take positions after the cache: at most ``room``, the positions
    every chunk leaves free for a question (``SessionConfig.largest_question``). Checked before the
    queued frames are encoded, so a question that could not fit after them is refused with the
    memory unchanged (docs/reliability.md "A refusal changes nothing")."""
    if answer_tokens < 0:
        raise QuestionError(f"max_new_tokens must be >= 0, got {answer_tokens}")
    if prompt_tokens + answer_tokens > room:
        raise QuestionError(f"max_new_tokens {answer_tokens} is too many: the question ({prompt_tokens} tokens) and "
                            f"its answer must fit in the {room} positions the memory keeps for a question "
                            "(max_question_tokens + max_new_tokens, at most half the model's position range): "
                            f"ask for at most {max(room - prompt_tokens, 0)}")
