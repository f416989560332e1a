"""docs/architecture.md names only modules, classes and members that exist (scripts/check_docs.py),
so the page cannot drift from the code again."""
from test_node_params import check_docs


def test_every_module_and_class_the_architecture_names_exists():
    docs = check_docs()
    text = docs.ARCHITECTURE.read_text(encoding="utf-8")
    assert docs.architecture_problems(text) == []
    assert "`node/cameras.py: Cameras._on_image`" in text


def test_a_name_that_went_away_is_found():
    docs = check_docs()
    text = docs.ARCHITECTURE.read_text(encoding="utf-8")
    moved = text.replace("`node/cameras.py: Cameras._on_image`", "`node/node.py: _on_image`")
    assert docs.architecture_problems(moved) == ["docs/architecture.md: `node/node.py` defines no `_on_image`"]
    assert docs.architecture_problems(text + "\n`node/mixins.py`, `CameraIngest`\n") == [
        "docs/architecture.md: module `node/mixins.py` does not exist",
        "docs/architecture.md: class `CameraIngest` does not exist"]
