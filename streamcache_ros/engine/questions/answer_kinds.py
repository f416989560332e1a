"""What kind of answer a question without options asks for, and what kind a free-text answer is.

    vocabulary = AnswerVocabulary.from_settings(adapter.model_settings)   # None: the model declares none
    expected = question_kind("What color is the square now?")             # "colour"
    vocabulary.answer_kind("yes")                                         # "yes_no"

A model folder may declare the words it answers with, by kind, in its ``streamcache.json``
(``"answers"``), and the words its questions were trained with (``"question_words"``); the bundled
world models do (docs/world-models.md "Answers in words"). For such a model a question without
options is asked only when its kind is one the model answers and its words are ones it knows, and
its answer counts only when it is a word of that kind (docs/interfaces.md "Free-text answers"). A model
that declares nothing (real weights, the tiny test models) is not checked: what a general model's
free text means cannot be told from its words ("I saw one at the start" answers "Did you see a red
circle?"). Plain functions on strings: no model, no ROS.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..adapters.vocabulary import KIND_NAMES, AnswerVocabulary, words_of
from .checks import YES_NO_STARTS
from ..errors import QuestionError

# the way of asking for each kind of answer
KIND_ASKED_BY = {"colour": "'What color ...?'", "shape": "'What shape ...?'", "count": "'How many ...?'",
                 "yes_no": "'Did you see ...?'", "direction": "'Which way ...?'"}

# A question asks for a kind when it holds one of the kind's phrases (as whole words, in any case);
# the first rule that matches decides, so "How many red circles?" is a count, not a colour
QUESTION_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("count", ("how many", "number of")),
    ("colour", ("what color", "what colour", "which color", "which colour", "color of", "colour of",
                "what color's", "what colour's")),
    ("shape", ("what shape", "which shape", "shape of", "what kind of shape")),
    ("direction", ("which way", "which direction", "what direction", "direction of")),
)
# Otherwise a question that starts with an auxiliary or modal verb asks yes or no ("Did you see a
# red circle?", "Is the door open?"; the words `when` takes, checks.py), unless it offers a choice
# ("Is it red or blue?" is not answered yes or no)


# "Did you see a red circle?", "Have you seen the box?": whether something was in view at any moment of
# the window (or of the whole memory) is retrieved, then verified, as `when` finds it
# (questions/desk.py; docs/interfaces.md "Did you see X?")
SEEN_QUESTION = re.compile(r"^\W*(did|have|has)\s+(you|we|the\s+robot)\s+(ever\s+)?"
                           r"(see|seen|spot|spotted|notice|noticed)\b", re.IGNORECASE)
YES_NO_OPTIONS = ("yes", "no")


def asks_if_seen(question: str, options: list[str] | tuple[str, ...] = ()) -> bool:
    """Whether ``question`` asks if something was seen, answered yes or no: its words say so, and it
    has no options or exactly the options yes and no (in any order and case)."""
    wanted = sorted(o.strip().lower() for o in options)
    return bool(SEEN_QUESTION.match(question)) and (not options or wanted == sorted(YES_NO_OPTIONS))


def question_kind(question: str) -> str:
    """The kind of answer ``question`` asks for (a key of KIND_NAMES), or "" when no rule says."""
    words = words_of(question)
    padded = f" {' '.join(words)} "
    for kind, phrases in QUESTION_RULES:
        if any(f" {phrase} " in padded for phrase in phrases):
            return kind
    if words and words[0] in YES_NO_STARTS and " or " not in padded:
        return "yes_no"
    return ""


@dataclass(frozen=True)
class FreeText:
    """One question without options, checked against the model's vocabulary before it is asked."""

    expected: str  # the kind the question asks for ("" when not checked)
    vocabulary: AnswerVocabulary | None

    def judge(self, text: str, cancelled: bool = False) -> dict:
        """The Answer's fields for ``text``: ``expected_kind``, ``answer_kind`` and ``kind_error``,
        the message when the answer is not a word of the expected kind ("" when it is, when the
        answer was cancelled, and when nothing is checked)."""
        if self.vocabulary is None or not self.expected:
            return {}
        said = self.vocabulary.answer_kind(text)
        error = ""
        if said != self.expected and not cancelled:
            error = (f"the model answered '{text.strip()[:40]}', not {KIND_NAMES[self.expected]} "
                     f"({', '.join(self.vocabulary.words[self.expected])}): it cannot answer this question; "
                     "the answer is not given as one (docs/interfaces.md \"Free-text answers\")")
        return {"expected_kind": self.expected, "answer_kind": said, "kind_error": error}


def vocabulary_of(adapter) -> AnswerVocabulary | None:
    """The vocabulary ``adapter``'s model folder declares (checked when the model was loaded)."""
    return AnswerVocabulary.from_settings(getattr(adapter, "model_settings", None) or {})


def check_free_text(question: str, options: list[str], vocabulary: AnswerVocabulary | None,
                    model_id: str = "the model") -> FreeText:
    """Before anything is encoded: a question to a model that declares its answers must use words it
    knows (``check_words``), with options or without; without options it must also ask for a kind it
    answers. QuestionError naming what it answers otherwise. A model that declares nothing is not
    checked, nor is a question with options for its kind (``FreeText.expected`` "")."""
    if options or vocabulary is None:
        check_words(question, vocabulary, model_id)  # with options too: one check of the words for every path
        return FreeText("", None)
    expected = question_kind(question)
    if expected in vocabulary.words:
        check_words(question, vocabulary, model_id)  # a kind it answers, maybe about things it never saw named
        return FreeText(expected, vocabulary)
    asked = (f"asks for {KIND_NAMES[expected]}, which it does not answer" if expected else
             "does not ask for any kind of answer it knows")
    raise refusal(question, asked, vocabulary, model_id)


def check_words(question: str, vocabulary: AnswerVocabulary | None, model_id: str = "the model") -> None:
    """The one check of a question's words, the same for Ask, `when` and the standing questions: to a
    model that declares the words its questions were trained with, a question in others is refused
    before anything is encoded, so no path answers what another refuses (docs/interfaces.md
    "Free-text answers"). Spelling variants the model knows count as known (AnswerVocabulary.spelled)."""
    unknown = vocabulary.unknownwords_of(question) if vocabulary is not None else []
    if unknown:
        raise refusal(question, f"uses words {model_id} was never asked with "
                                f"({', '.join(repr(w) for w in unknown[:5])})", vocabulary, model_id)


def refusal(question: str, asked: str, vocabulary: AnswerVocabulary, model_id: str) -> QuestionError:
    """The refusal of ``question`` (``asked``: what is wrong with it), naming what the model answers."""
    ways = ", ".join(KIND_ASKED_BY[kind] for kind in vocabulary.kinds)
    when = (" A 'When ...?' question is answered by the `when` service, from a yes/no question such as "
            "'Did you see a red circle?'." if words_of(question)[:1] == ["when"] else "")
    return QuestionError(f"'{question.strip()[:80]}' {asked}: {model_id} answers only {vocabulary.describe()}, "
                         f"to questions asked as {ways} (its folder's streamcache.json, docs/world-models.md).{when} "
                         "Nothing was encoded or forgotten")
