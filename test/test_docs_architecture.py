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


def test_the_policy_table_lists_what_the_engine_calls_and_nothing_else():
    docs = check_docs()
    text = docs.ARCHITECTURE.read_text(encoding="utf-8")
    assert docs.policy_table_problems(text) == []
    called = docs.policy_calls()
    assert {"unit_tokens", "set_budget", "settings_class", "prefill_unit_by_unit", "needs_guidance"} <= set(called)
    dropped = text.replace("| `settings_class`, `set_budget(tokens)` |", "| `set_budget(tokens)` |")
    assert docs.policy_table_problems(dropped) == [
        f"docs/architecture.md: the engine uses policy.settings_class ({called['settings_class']}); the "
        "cache-policy table does not list it"]
    invented = text.replace("| `layer_stores()` |", "| `layer_stores()`, `append(layer, k, v)` |")
    assert docs.policy_table_problems(invented) == [
        "docs/architecture.md: the cache-policy table lists `append`, which nothing outside engine/cache/ uses"]


def test_the_architecture_describes_the_archive_tier():
    text = check_docs().ARCHITECTURE.read_text(encoding="utf-8")
    for named in ("`engine/recall/tier.py`", "MemoryTier.plan_ask", "`chunk_store.py`", "QuestionDesk.ask",
                  "test/test_import_layers.py", "prefill_block_tokens", "EMPTY_ARRAY_TYPES", "Cameras.key"):
        assert named in text, named
