"""The words a model answers with, by kind, as its folder declares them (``streamcache.json``'s
``"answers"`` and ``"question_words"``): read when the model loads, so a folder that declares them
wrongly is refused then; questions/answer_kinds.py checks questions and answers against them
(docs/interfaces.md "Free-text answers"). Plain functions on strings."""
from __future__ import annotations

import re
from dataclasses import dataclass

# The kinds of answer, in the order a message names them, each with what a person calls it
KIND_NAMES = {"colour": "a colour", "shape": "a shape", "count": "a number", "yes_no": "yes or no",
              "direction": "a direction"}
# British and American spellings of one word: a person writes either, a model's questions were trained
# with one, so a question is read in the spelling its model knows (docs/interfaces.md "Free-text answers")
SPELLINGS = (("colour", "color"), ("colours", "colors"), ("coloured", "colored"), ("grey", "gray"),
             ("greys", "grays"))


def words_of(text: str) -> list[str]:
    """Lower-case words: letters, digits and apostrophes, every other character a space."""
    return re.sub(r"[^\w']+", " ", text.lower().replace("\u2019", "'")).split()


def normalised_answer(text: str) -> str:
    return " ".join(words_of(text)).strip("'")


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
            normalised = tuple(normalised_answer(w) for w in listed)
            for word in normalised:
                if owner.setdefault(word, kind) != kind:
                    raise ValueError(f"{source}: answers lists '{word}' under both {owner[word]} and {kind}")
            words[kind] = normalised
        known = settings.get("question_words", [])
        if not isinstance(known, list) or not all(isinstance(w, str) and w.strip() for w in known):
            raise ValueError(f"{source}: question_words must be a list of words")
        return cls({kind: words[kind] for kind in KIND_NAMES if kind in words},
                   frozenset(w for word in known for w in words_of(word)))

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.words)

    def answer_kind(self, text: str) -> str:
        """The kind whose word the whole answer is (case, spaces and end punctuation aside); "" for
        anything else, another word or a sentence."""
        said = normalised_answer(self.spelled(text))
        return next((kind for kind, words in self.words.items() if said in words), "")

    def unknownwords_of(self, question: str) -> list[str]:
        """The words of ``question`` the model's questions never used (none when not declared)."""
        if not self.question_words:
            return []
        return list(dict.fromkeys(w for w in words_of(self.spelled(question)) if w not in self.question_words))

    def spelled(self, text: str) -> str:
        """``text`` with each word the model knows in its other spelling (SPELLINGS) written in that
        one, the first letter's case kept ("What colour ...?" -> "What color ...?"); the rest as it is."""
        known = self.question_words.union(*self.words.values())
        swap = {}
        for one, other in SPELLINGS:
            if one in known and other not in known:
                swap[other] = one
            elif other in known and one not in known:
                swap[one] = other
        if not swap or not isinstance(text, str):
            return text

        def respelled(found: re.Match) -> str:
            word = found.group(0)
            into = swap[word.lower()]
            return into[:1].upper() + into[1:] if word[:1].isupper() else into

        return re.sub(r"\b(" + "|".join(swap) + r")\b", respelled, text, flags=re.IGNORECASE)

    def describe(self) -> str:
        """What the model answers, for a message: "a colour (red, green), a number (0, 1) or yes or no"."""
        parts = [KIND_NAMES[kind] + ("" if kind == "yes_no" else f" ({', '.join(words)})")
                 for kind, words in self.words.items()]
        return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} or {parts[-1]}"
