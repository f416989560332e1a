"""The rules of answer_kinds.py on plain strings: which kind of answer a question asks for, which
kind a free-text answer is, and what a model folder may declare (docs/interfaces.md "Free-text answers")."""
import json

import pytest

from streamcache_ros import world
from streamcache_ros.engine import QuestionError
from streamcache_ros.engine.adapters import read_model_settings
from streamcache_ros.engine.questions.answer_kinds import AnswerVocabulary, check_free_text, check_words, question_kind
from streamcache_ros.engine.errors import ModelLoadError
from streamcache_ros.engine.adapters.models import resolve_model_path

WORLD_KIND = {"now_color": "colour", "now_count": "count", "now_shape": "shape", "first_color": "colour",
              "first_shape": "shape", "seen": "yes_no", "before_color": "colour", "moved": "direction"}


def world_question_words() -> list[str]:
    """Every word of every world question (docs/world.md "Questions"), each colour and shape filled in."""
    return sorted({w for text in world.QUESTION_TEXT.values() for c in world.COLOUR_NAMES for s in world.SHAPES
                   for w in text.format(colour=c, shape=s).lower().rstrip("?").split()})


def world_vocabulary() -> AnswerVocabulary:
    return AnswerVocabulary.from_settings({"answers": {
        "colour": list(world.COLOUR_NAMES), "shape": list(world.SHAPES), "count": ["0", "1", "2"],
        "yes_no": ["yes", "no"], "direction": ["left", "right"]}, "question_words": world_question_words()})


@pytest.mark.parametrize("kind", world.OPTION_KINDS)
def test_every_world_question_asks_for_the_kind_of_its_options(kind):
    assert question_kind(world.QUESTION_TEXT[kind]) == WORLD_KIND[kind]
    stream = world.make_stream(800_000_321, 64)
    vocabulary = world_vocabulary()
    for q in stream.questions(64, kinds=(kind,), per_kind=3):  # the options are words of that kind
        assert {vocabulary.answer_kind(option) for option in q.options} == {WORLD_KIND[kind]}, q.text


@pytest.mark.parametrize("question, kind", [
    ("What colour is the square now?", "colour"),
    ("what COLOR was the first object you saw", "colour"),
    ("Tell me the color of the circle.", "colour"),
    ("How many red circles did you see?", "count"),  # a count, though it names a colour
    ("What is the number of objects?", "count"),
    ("Which shape is purple?", "shape"),
    ("In which direction did the red square move?", "direction"),
    ("Did you see a red triangle?", "yes_no"),
    ("Isn\u2019t the door open?", "yes_no"),
    ("Is the circle red or blue?", ""),  # a choice, not yes or no
    ("What is the weather?", ""),
    ("When did you last see the red circle?", ""),
    ("Describe the scene.", ""),
    ("", ""),
])
def test_question_kinds(question, kind):
    assert question_kind(question) == kind


def test_answer_kinds_are_whole_words_of_the_vocabulary():
    vocabulary = world_vocabulary()
    assert vocabulary.answer_kind(" Yellow. ") == "colour" and vocabulary.answer_kind("2") == "count"
    assert vocabulary.answer_kind("right") == "direction" and vocabulary.answer_kind("NO") == "yes_no"
    for text in ("", "red circle", "yes red", "3", "orange", "I saw a red one"):
        assert vocabulary.answer_kind(text) == "", text


def test_the_issues_answers_are_of_the_wrong_kind():
    vocabulary = world_vocabulary()
    for question, said, wanted in [("What color is the square now?", "yes", "a colour"),
                                   ("What color was the first object you saw?", "right", "a colour"),
                                   ("Did you see a red triangle?", "yellow", "yes or no")]:
        judged = check_free_text(question, [], vocabulary, "world").judge(said)
        assert judged["kind_error"].startswith(f"the model answered '{said}', not {wanted}"), judged
        assert judged["answer_kind"] != judged["expected_kind"]
    right = check_free_text("What color is the square now?", [], vocabulary).judge("blue")
    assert right == {"expected_kind": "colour", "answer_kind": "colour", "kind_error": ""}
    cancelled = check_free_text("What color is the square now?", [], vocabulary).judge("bl", cancelled=True)
    assert cancelled["kind_error"] == ""  # a cancelled answer is said to be cancelled, not wrong


def test_a_question_outside_what_the_model_answers_is_refused_naming_what_it_answers():
    vocabulary = world_vocabulary()
    with pytest.raises(QuestionError) as refused:
        check_free_text("What is the weather?", [], vocabulary, "world-qwen2_5_vl")
    message = str(refused.value)
    assert "world-qwen2_5_vl answers only a colour (red, green, blue, yellow, white, purple)" in message
    assert "'How many ...?'" in message and "Nothing was encoded" in message
    with pytest.raises(QuestionError, match="`when` service"):
        check_free_text("When did you last see the red circle?", [], vocabulary)
    # a kind it answers, about what it never saw named: "sky", "door"
    for question, unknown in [("What color is the sky?", "'sky'"), ("Is the door open?", "'door', 'open'"),
                              ("How many red circles did you see?", "'circles'")]:
        with pytest.raises(QuestionError, match=f"uses words world was never asked with \\({unknown}\\)"):
            check_free_text(question, [], vocabulary, "world")
    for kind in world.OPTION_KINDS:  # every world question, whichever colour and shape
        for colour in world.COLOUR_NAMES:
            check_free_text(world.QUESTION_TEXT[kind].format(colour=colour, shape="square"), [], vocabulary)
    narrow = AnswerVocabulary.from_settings({"answers": {"yes_no": ["yes", "no"]}})
    with pytest.raises(QuestionError, match="asks for a colour, which it does not answer"):
        check_free_text("What color is the square now?", [], narrow)


def test_british_and_american_spellings_are_one_word():
    """'What colour is the square?' was once refused as a word never asked with; a question is
    read in the spelling its model knows, and a spelling the model knows is left as it is."""
    vocabulary = world_vocabulary()
    assert check_free_text("What colour is the square now?", [], vocabulary).expected == "colour"
    check_words("What colour was the first object you saw?", vocabulary)
    assert vocabulary.spelled("What colour is the square? Colour it") == "What color is the square? Color it"
    assert vocabulary.spelled("What color is the square?") == "What color is the square?"
    grey = AnswerVocabulary.from_settings({"answers": {"colour": ["gray", "red"], "yes_no": ["yes", "no"]},
                                           "question_words": ["did", "you", "see", "a", "gray", "red", "circle"]})
    check_words("Did you see a grey circle?", grey)
    assert grey.spelled("Did you see a Grey circle?") == "Did you see a Gray circle?"
    assert grey.answer_kind("Grey.") == "colour"
    with pytest.raises(QuestionError, match="never asked with \\('colourful'\\)"):  # whole words only
        check_words("Did you see a colourful circle?", vocabulary)


def test_one_word_check_for_ask_when_and_standing_questions():
    """`when` once answered "Is the door open?" while Ask refused it: the one check (check_words)
    refuses it with Ask's own message."""
    vocabulary = world_vocabulary()
    with pytest.raises(QuestionError) as asked:
        check_free_text("Is the door open?", [], vocabulary, "world")
    with pytest.raises(QuestionError) as checked:
        check_words("Is the door open?", vocabulary, "world")
    assert str(checked.value) == str(asked.value) and "never asked with ('door', 'open')" in str(asked.value)
    check_words("Is the door open?", None)  # a model that declares no words: not checked


def test_what_is_not_checked():
    # an option question's kind, and a model that declares nothing (real weights, the tiny models)
    assert check_free_text("What color is the circle now?", ["sunny", "rain"], world_vocabulary()).judge("x") == {}
    assert check_free_text("What is the weather?", [], None).judge("x") == {}


@pytest.mark.parametrize("question", ["Did you see a red star?", "Did you see a black square?"])
def test_an_option_question_in_words_the_model_never_knew_is_refused_as_one_without_options(question):
    with pytest.raises(QuestionError) as without:
        check_free_text(question, [], world_vocabulary(), "world")
    with pytest.raises(QuestionError) as with_options:
        check_free_text(question, ["yes", "no"], world_vocabulary(), "world")
    assert str(with_options.value) == str(without.value) and "never asked with" in str(without.value)


@pytest.mark.parametrize("model", ["world-qwen2_5_vl", "world-llava_onevision"])
def test_the_bundled_world_models_declare_the_worlds_answers(model):
    settings = read_model_settings(resolve_model_path(model))
    assert AnswerVocabulary.from_settings(settings) == world_vocabulary()


@pytest.mark.parametrize("model", ["tiny-qwen2_5_vl", "tiny-llava_onevision"])
def test_the_tiny_models_declare_none(model):
    assert AnswerVocabulary.from_settings(read_model_settings(resolve_model_path(model))) is None


@pytest.mark.parametrize("answers, said", [
    ([], "answers must map"),
    ({"weather": ["sunny"]}, "unknown kind 'weather'"),
    ({"colour": []}, "answers.colour must be a non-empty list"),
    ({"colour": ["red", 3]}, "answers.colour must be a non-empty list"),
    ({"colour": ["red"], "shape": ["Red"]}, "'red' under both colour and shape"),
    ({"colour": ["red"], "question_words": "what color"}, "question_words must be a list of words"),
])
def test_a_bad_answers_block_stops_the_load(tmp_path, answers, said):
    settings = {"answers": answers} if "question_words" not in answers else \
        {"answers": {k: v for k, v in answers.items() if k != "question_words"}, "question_words": answers["question_words"]}
    (tmp_path / "streamcache.json").write_text(json.dumps(settings))
    with pytest.raises(ModelLoadError, match=said):
        read_model_settings(str(tmp_path))
