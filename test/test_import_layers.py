"""The package's imports go one way (docs/architecture.md "Layers"): parsed from the source, imports
inside functions and under TYPE_CHECKING included, so a circle cannot hide in a late import.

- no import circle anywhere under streamcache_ros/;
- the engine's packages import only packages of a lower layer (or their own), the face on top;
- cache/ and recall/archive/ know neither ROS nor each other;
- the engine imports no ROS module, and nothing of the node, the client or the tools;
- the node and the client reach the engine through its face only.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "streamcache_ros"
E = f"{PACKAGE}.engine"

# the engine's layers, lowest first; a module belongs to the longest group its name starts with
LAYERS: list[tuple[str, ...]] = [
    (f"{E}.errors", f"{E}.failpoints", f"{E}.status", f"{E}.config", f"{E}.places"),  # the base: plain data, errors
    (f"{E}.cache",),  # the KV cache and its policies
    (f"{E}.recall.archive",),  # the archive on disk
    (f"{E}.stream", f"{E}.memory"),  # how a stream becomes tokens; what the memory holds, snapshots
    (f"{E}.adapters",),  # the model families
    (f"{E}.ingest",),  # a chunk's path
    (f"{E}.recall",),  # the memory tier: working memory or a replay of the archive
    (f"{E}.questions",),  # a question's path
    (f"{E}.training",),
    (E, f"{E}.session", f"{E}.factory", f"{E}.parameters"),  # the face
]
# groups of one layer that may import each other (every other pair of groups in a layer may not)
SHARED_LAYERS = {0, len(LAYERS) - 1}
ENGINE_FACE = {E, f"{E}.parameters", f"{E}.status", f"{E}.errors"}
ROS_ROOTS = {"rclpy", "launch", "launch_ros", "rcl_interfaces", "builtin_interfaces", "std_msgs", "sensor_msgs",
             "diagnostic_msgs", "diagnostic_updater", "rosbag2_py", "cv_bridge", "action_msgs", "lifecycle_msgs",
             "streamcache_ros_interfaces", "ament_index_python", "rosidl_runtime_py", "geometry_msgs", "nav_msgs",
             "tf2_ros"}


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


MODULES = modules()


def resolved(name: str) -> str | None:
    """The package module ``name`` is, or lies in; None outside the package."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(name: str) -> dict[str, set[str]]:
    path = MODULES[name]
    return imports_in(path.read_text(), name, path.name == "__init__.py")


def imports_in(source: str, name: str, is_package: bool) -> dict[str, set[str]]:
    """{"package": modules of streamcache_ros the module ``name`` imports, "outside": top-level names
    of the rest}, every import statement counted wherever it stands."""
    here = name if is_package else name.rpartition(".")[0]
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            full = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            targets = [f"{full}.{alias.name}" if f"{full}.{alias.name}" in MODULES else full for alias in node.names]
        for target in targets:
            if target.split(".")[0] == PACKAGE:
                module = resolved(target)
                if module and module != name:
                    inside.add(module)
            else:
                outside.add(target.split(".")[0])
    return {"package": inside, "outside": outside}


GRAPH = {name: imports(name) for name in MODULES}


def group_of(module: str) -> tuple[int, str] | None:
    """(layer, group) of an engine module, by the longest group its name starts with."""
    best = None
    for layer, groups in enumerate(LAYERS):
        for group in groups:
            if (module == group or module.startswith(group + ".")) and (best is None or len(group) > len(best[1])):
                best = (layer, group)
    return best


def circles() -> list[list[str]]:
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]["package"]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))
    for v in GRAPH:
        if v not in index:
            visit(v)
    return found


def test_every_engine_module_has_a_layer():
    engine = [m for m in MODULES if m == E or m.startswith(E + ".")]
    assert len(engine) > 40, "the parser found too few modules: the walk above is broken"
    assert [m for m in engine if group_of(m) is None] == []


def test_no_import_circle_anywhere():
    assert circles() == []


def test_the_engine_imports_downward_only():
    wrong = []
    for module in MODULES:
        mine = group_of(module)
        if mine is None:
            continue
        for target in GRAPH[module]["package"]:
            theirs = group_of(target)
            if theirs is None:
                if target != f"{PACKAGE}.world":  # the shape world is data the training reads
                    wrong.append(f"{module} -> {target} (outside the engine)")
            elif theirs[1] != mine[1] and not (theirs[0] < mine[0] or (theirs[0] == mine[0] in SHARED_LAYERS)):
                wrong.append(f"{module} (layer {mine[0]}) -> {target} (layer {theirs[0]})")
    assert wrong == []


def test_cache_and_archive_know_neither_ros_nor_each_other():
    for own, other in ((f"{E}.cache", f"{E}.recall.archive"), (f"{E}.recall.archive", f"{E}.cache")):
        for module in [m for m in MODULES if m == own or m.startswith(own + ".")]:
            assert not any(t == other or t.startswith(other + ".") for t in GRAPH[module]["package"]), module
            assert not GRAPH[module]["outside"] & ROS_ROOTS, module


def test_the_engine_imports_no_ros():
    engine = [m for m in MODULES if m == E or m.startswith(E + ".")]
    assert {m: sorted(GRAPH[m]["outside"] & ROS_ROOTS) for m in engine if GRAPH[m]["outside"] & ROS_ROOTS} == {}


@pytest.mark.parametrize("front", ["node", "client"])
def test_the_node_and_client_reach_the_engine_through_its_face(front):
    prefix = f"{PACKAGE}.{front}"
    front_modules = [m for m in MODULES if m.startswith(prefix + ".") or m == prefix]
    assert front_modules
    wrong = {m: sorted(t for t in GRAPH[m]["package"] if t.startswith(E) and t not in ENGINE_FACE)
             for m in front_modules}
    assert {m: t for m, t in wrong.items() if t} == {}


def test_a_hidden_late_import_is_seen():
    """The parser sees an import inside a function and under TYPE_CHECKING (the places circles hid)."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .storage import Store\n"
              "def f():\n    from ..session import Session\n    import rclpy\n")
    found = imports_in(source, f"{E}.cache.base", is_package=False)
    assert found == {"package": {f"{E}.cache.storage", f"{E}.session"}, "outside": {"typing", "rclpy"}}
