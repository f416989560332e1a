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

from .checks import YES_NO_STARTS
from ..errors import QuestionError

# The kinds, in the order a message names them, each with what a person calls it and the way of
# asking that says so (the rules below)
KIND_NAMES = {"colour": "a colour", "shape": "a shape", "count": "a number", "yes_no": "yes or no",
              "direction": "a direction"}
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


def _words(text: str) -> list[str]:
    """Lower-case words: letters, digits and apostrophes, every other character a space."""
    return re.sub(r"[^\w']+", " ", text.lower().replace("\u2019", "'")).split()


def question_kind(question: str) -> str:
    """The kind of answer ``question`` asks for (a key of KIND_NAMES), or "" when no rule says."""
    words = _words(question)
    padded = f" {' '.join(words)} "
    for kind, phrases in QUESTION_RULES:
        if any(f" {phrase} " in padded for phrase in phrases):
            return kind
    if words and words[0] in YES_NO_STARTS and " or " not in padded:
        return "yes_no"
    return ""


def _normalised_answer(text: str) -> str:
    return " ".join(_words(text)).strip("'")


@dataclass(frozen=True)
class AnswerVocabulary:
    """The words a model answers with, by kind (``streamcache.json``'s ``"answers"``)."""

    words: dict[str, tuple[str, ...]]
    # every word the model's questions were trained with (``"question_words"``); empty: not declared
    question_words: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: dict, source: str = "streamcache.json") -> AnswerVocabulary | None:
        """The vocabulary ``settings`` declares (None: none); ValueError naming ``source`` when the
        block is not a map from known kinds to lists of words, or a word has two kinds."""
        block = settings.get("answers")
        if block is None:
            return None
        if not isinstance(block, dict) or not block:
            raise ValueError(f"{source}: answers must map answer kinds ({', '.join(KIND_NAMES)}) to lists of words")
        words: dict[str, tuple[str, ...]] = {}
        owner: dict[str, str] = {}
        for kind, listed in block.items():
            if kind not in KIND_NAMES:
                raise ValueError(f"{source}: answers has an unknown kind '{kind}' (kinds: {', '.join(KIND_NAMES)})")
            if not isinstance(listed, list) or not listed or not all(isinstance(w, str) and w.strip() for w in listed):
                raise ValueError(f"{source}: answers.{kind} must be a non-empty list of words")
            normalised = tuple(_normalised_answer(w) for w in listed)
            for word in normalised:
                if owner.setdefault(word, kind) != kind:
                    raise ValueError(f"{source}: answers lists '{word}' under both {owner[word]} and {kind}")
            words[kind] = normalised
        known = settings.get("question_words", [])
        if not isinstance(known, list) or not all(isinstance(w, str) and w.strip() for w in known):
            raise ValueError(f"{source}: question_words must be a list of words")
        return cls({kind: words[kind] for kind in KIND_NAMES if kind in words},
                   frozenset(w for word in known for w in _words(word)))

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.words)

    def answer_kind(self, text: str) -> str:
        """The kind whose word the whole answer is (case, spaces and end punctuation aside); "" for
        anything else, another word or a sentence."""
        said = _normalised_answer(text)
        return next((kind for kind, words in self.words.items() if said in words), "")

    def unknown_words(self, question: str) -> list[str]:
        """The words of ``question`` the model's questions never used (none when not declared)."""
        if not self.question_words:
            return []
        return list(dict.fromkeys(w for w in _words(question) if w not in self.question_words))

    def describe(self) -> str:
        """What the model answers, for a message: "a colour (red, green), a number (0, 1) or yes or no"."""
        parts = [KIND_NAMES[kind] + ("" if kind == "yes_no" else f" ({', '.join(words)})")
                 for kind, words in self.words.items()]
        return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} or {parts[-1]}"


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
    """Before anything is encoded: a question without options to a model that declares its answers
    must ask for a kind it answers; QuestionError naming what it answers otherwise. A question with
    options, or to a model that declares nothing, is not checked (``FreeText.expected`` "")."""
    if options or vocabulary is None:
        return FreeText("", None)
    expected = question_kind(question)
    unknown = vocabulary.unknown_words(question)
    if expected in vocabulary.words and not unknown:
        return FreeText(expected, vocabulary)
    if expected in vocabulary.words:  # a kind it answers, about things it never saw named
        asked = f"uses words {model_id} was never asked with ({', '.join(repr(w) for w in unknown[:5])})"
    elif expected:
        asked = f"asks for {KIND_NAMES[expected]}, which it does not answer"
    else:
        asked = "does not ask for any kind of answer it knows"
    ways = ", ".join(KIND_ASKED_BY[kind] for kind in vocabulary.kinds)
    when = (" A 'When ...?' question is answered by the `when` service, from a yes/no question such as "
            "'Did you see a red circle?'." if _words(question)[:1] == ["when"] else "")
    raise QuestionError(f"'{question.strip()[:80]}' {asked}: {model_id} answers only {vocabulary.describe()}, "
                        f"to questions asked as {ways} (its folder's streamcache.json, docs/world-models.md).{when} "
                        "Nothing was encoded or forgotten")
