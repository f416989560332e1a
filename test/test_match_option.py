"""Which option an answer names (match_option): exact text, a letter, or whole words; never part of a word."""
from __future__ import annotations

import pytest

from streamcache_ros.engine.adapters import match_option

YES_NO = ["yes", "no"]
COLOURS = ["red", "blue", "green", "white"]


@pytest.mark.parametrize("answer, options, expected", [
    ("no", YES_NO, 1),
    ("No.", YES_NO, 1),
    ("  yes  ", YES_NO, 0),
    ("not sure", YES_NO, -1),  # "no" is not in "not"
    ("I don't know", YES_NO, -1),  # nor in "know"
    ("nothing", YES_NO, -1),
    ("the answer is no", YES_NO, 1),
    ("yes and no", YES_NO, -1),  # both named: no single answer
    ("reddish", COLOURS, -1),
    ("it is red", COLOURS, 0),
    ("Red", COLOURS, 0),
    ("B", COLOURS, 1),
    ("(C) green", COLOURS, 2),
    ("D) white", COLOURS, 3),
    ("E", COLOURS, -1),  # a letter past the options
    ("left", ["left", "right"], 0),
    ("2", ["0", "1", "2"], 2),
    ("12", ["0", "1", "2"], -1),
    ("dark red", ["red", "dark red"], 1),  # the longer option it names, not also the shorter inside it
    ("red", ["red", "dark red"], 0),
    ("anything", [], -1),
])
def test_match_option(answer, options, expected):
    assert match_option(answer, options) == expected
