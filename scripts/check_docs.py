"""Check that the docs the repository cites exist and say what is cited, and that the parameter
tables of docs/interfaces.md are what the node declares.

    python scripts/check_docs.py            (exit code 1 when something is missing or differs)
    python scripts/check_docs.py --write    (write the parameter tables into docs/interfaces.md)

- every ``docs/<name>.md`` named anywhere in the tracked files exists, and every section it is cited
  with (``docs/hermes.md §5``, ``docs/hermes.md D9``, ``docs/h2svc.md TC3``,
  ``docs/world-models.md, "One layout"``) is a heading of that page;
- every relative link and image in README.md and docs/*.md resolves, anchors included;
- every repository path written in backticks in README.md and docs/*.md exists (generated ones aside);
- the parameter tables between the two PARAMETERS markers of docs/interfaces.md are the ones made
  from the node's declarations (node/params.py: its own parameters, the engine's and every policy's
  settings dataclass, engine/parameters.py) and their descriptors: name, type, range, default,
  whether it may change at runtime, description. This part imports the package: run it in the
  project's venv (the other checks need nothing);
- every module and class docs/architecture.md names exists: a ``file.py`` in backticks is a file
  of the package (or of scripts/, bench/), a ``file.py: Name`` or ``Name.member`` is defined there,
  and a CamelCase name in backticks is a class of the package or an interface in msg/.
"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CITE = re.compile(r"docs/([\w\-]+\.md)((?:[,:]?\s*(?:§[\d.]+(?:\s*[-–]\s*§?[\d.]+)?|\"[^\"]+\"|D\d+|TC\d+)"
                  r"(?:\s*(?:/|,|and)\s*(?:§[\d.]+|D\d+|TC\d+))*)?)")
SECTION = re.compile(r"§[\d.]*\d|D\d+|TC\d+|\"[^\"]+\"")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
TICKED = re.compile(r"`([\w.\-]+(?:/[\w.\-]+)+\.(?:py|md|yaml|png|sh|json|srv|msg|action|txt|cfg|xml))`")
# made by set-up, colcon or a benchmark run, not kept in the repository
GENERATED = ("share/", "install/", "bench/results/", "data/", ".venv/")
INTERFACES = ROOT / "docs" / "interfaces.md"
PARAMETERS_BEGIN = ("<!-- PARAMETERS: made from the node's declarations by `python scripts/check_docs.py --write`; "
                    "edit those, not this -->")
PARAMETERS_END = "<!-- end of PARAMETERS -->"
SEARCH_ROOTS = ("", "streamcache_ros/", "streamcache_ros/engine/", "streamcache_ros/engine/cache/",
                "streamcache_ros/engine/ingest/", "streamcache_ros/engine/stream/", "streamcache_ros/engine/questions/",
                "streamcache_ros/engine/memory/", "streamcache_ros/engine/recall/", "streamcache_ros/engine/training/",
                "streamcache_ros/engine/adapters/")


ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "streamcache_ros"
# `file.py`, `dir/file.py`, optionally `: Name` or `: Name.member` after it
MODULE_NAMED = re.compile(r"`((?:[\w\-]+/)*[\w\-]+\.py)(?::\s*([A-Za-z_]\w*)(?:\.(\w+))?)?`")
# `ClassName` or `ClassName.member` (CamelCase: an upper-case letter, then a lower-case one somewhere)
CLASS_NAMED = re.compile(r"`([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)(?:\.(\w+))?(?:\([^`]*\))?`")


def _defines(path: pathlib.Path, name: str) -> bool:
    """Whether ``path`` defines ``name`` (a class, a function, or an assignment at any indent)."""
    pattern = re.compile(rf"^\s*(?:class|def|async def)\s+{name}\b|^\s*(?:self\.)?{name}\s*(?::[^=]*)?=|"
                         rf"^\s*{name}\s*:", re.MULTILINE)
    return bool(pattern.search(path.read_text(encoding="utf-8")))


def _modules(name: str) -> list[pathlib.Path]:
    """The files ``name`` (``cameras.py``, ``node/cameras.py``, ``engine/cache/clocks.py``) can mean."""
    roots = (PACKAGE, *(ROOT / folder for folder in ("scripts", "bench", "docs", "test", "examples", "launch")))
    return [path for root in roots for path in root.rglob("*.py") if path.as_posix().endswith("/" + name)]


def architecture_problems(text: str) -> list[str]:
    """Where docs/architecture.md (``text``) names a module, a class or a member that does not exist.
    A class may also be an interface of msg/ or a message the package imports (``CompressedImage``)."""
    problems = []
    classes: dict[str, pathlib.Path] = {}
    interfaces = {path.stem for path in (ROOT / "msg").rglob("*") if path.suffix in (".msg", ".srv", ".action")}
    for path in PACKAGE.rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        for match in re.finditer(r"^\s*class\s+(\w+)", source, re.MULTILINE):
            classes.setdefault(match.group(1), path)
        for match in re.finditer(r"^from \w+\.(?:msg|srv|action) import (.+)$", source, re.MULTILINE):
            interfaces.update(name.strip() for name in match.group(1).split(","))
    for module, name, member in MODULE_NAMED.findall(text):
        files = _modules(module)
        if not files:
            problems.append(f"docs/architecture.md: module `{module}` does not exist")
        elif name and not any(_defines(f, name) for f in files):
            problems.append(f"docs/architecture.md: `{module}` defines no `{name}`")
        elif member and not any(_defines(f, member) for f in files):
            problems.append(f"docs/architecture.md: `{module}` defines no `{name}.{member}`")
    for name, member in CLASS_NAMED.findall(text):
        if name in interfaces and not member:
            continue
        if name not in classes:
            problems.append(f"docs/architecture.md: class `{name}` does not exist")
        elif member and not _defines(classes[name], member):
            problems.append(f"docs/architecture.md: `{name}` has no `{member}`")
    return problems


POLICY_SECTION = "## The cache-policy interface"
POLICY_CALLED = re.compile(r"\bpolicy\.([A-Za-z_]\w*)")


def policy_calls() -> dict[str, str]:
    """Every ``policy.<name>`` the engine outside ``engine/cache/`` reads or calls, with a file that does."""
    cache = PACKAGE / "engine" / "cache"
    called: dict[str, str] = {}
    for path in sorted((PACKAGE / "engine").rglob("*.py")):
        if cache in path.parents:
            continue
        for name in POLICY_CALLED.findall(path.read_text(encoding="utf-8")):
            called.setdefault(name, path.relative_to(ROOT).as_posix())
    return called


def policy_table_problems(text: str) -> list[str]:
    """Where the cache-policy interface table of docs/architecture.md (``text``) and what the engine
    calls on a policy differ: a name called and not listed, or listed and called nowhere."""
    if POLICY_SECTION not in text:
        return [f"docs/architecture.md: no '{POLICY_SECTION}' section"]
    rows = [line for line in text.split(POLICY_SECTION, 1)[1].split("\n## ", 1)[0].splitlines()
            if line.startswith("| `")]
    listed = {name for row in rows for name in re.findall(r"`([A-Za-z_]\w*)", row.split("|")[1])}
    called = policy_calls()
    problems = [f"docs/architecture.md: the engine uses policy.{name} ({where}); the cache-policy table does not "
                f"list it" for name, where in sorted(called.items()) if name not in listed]
    problems += [f"docs/architecture.md: the cache-policy table lists `{name}`, which nothing outside engine/cache/ "
                 f"uses" for name in sorted(listed - set(called))]
    return problems


def headings(path: pathlib.Path) -> list[str]:
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.append(line.lstrip("#").strip())
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def has_section(titles: list[str], section: str) -> bool:
    if section.startswith('"'):
        wanted = section.strip('"').lower()
        return any(t.lower() == wanted or t.lower().startswith(wanted) for t in titles)
    return any(t == section or t.startswith(section + " ") for t in titles)


def tracked_files() -> list[pathlib.Path]:
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def _type(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    return _type(value[0]) + "[]"


ARRAY_NAMES = {"STRING_ARRAY": "string[]", "INTEGER_ARRAY": "int[]", "DOUBLE_ARRAY": "double[]", "BOOL_ARRAY": "bool[]"}


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, str):
        return f"'{value}'"
    return repr(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def parameter_tables() -> str:
    """The tables, from what the node declares: one row per parameter; a policy setting that every
    policy taking it describes alike is one row naming each ``<policy>.<setting>``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from streamcache_ros.node import params  # noqa: PLC0415 - needs the venv (rclpy, torch)

    rows: dict[tuple, list[str]] = {}
    for name, spec in params.all_specs().items():
        declared = params.descriptor(name, spec)
        default = params.plain(spec.default)
        kind = _type(default) if default != [] else ARRAY_NAMES[params.declared_type(name, spec).name]
        for bounds in (*declared.integer_range, *declared.floating_point_range):
            low, high = bounds.from_value, bounds.to_value
            kind += f" ≥ {low}" if high in (params.BIG, params.BIG_FLOAT) else f" {low}–{high}"
        shown = params.SHOWN_DEFAULTS.get(name) or _value(default)
        policy, _, setting = name.rpartition(".")
        what = declared.description.removeprefix(f"{policy}: ") if policy else declared.description
        if declared.additional_constraints == params.RUNTIME_CONSTRAINT:
            what = f"*runtime*. {what}"
        rows.setdefault((bool(policy), setting, kind, shown, what), []).append(name)
    lines = [PARAMETERS_BEGIN, "", "| parameter | type | default | what |", "|---|---|---|---|"]
    policy_lines = ["", "Each policy's own settings, `<policy>.<setting>` (a general parameter of the same name is the "
                    "default where the row says so):", "", "| parameter | type | default | what |", "|---|---|---|---|"]
    for (is_policy, _, kind, shown, what), names in rows.items():
        row = f"| {', '.join(f'`{n}`' for n in names)} | {kind} | `{_cell(shown)}` | {_cell(what)} |"
        (policy_lines if is_policy else lines).append(row)
    return "\n".join(lines + policy_lines + ["", PARAMETERS_END])


def parameter_problems(text: str) -> list[str]:
    """Where ``text`` (docs/interfaces.md) differs from the tables the node's declarations make."""
    start, end = text.find(PARAMETERS_BEGIN), text.find(PARAMETERS_END)
    if start < 0 or end < start:
        return ["docs/interfaces.md: no parameter tables between the PARAMETERS markers"]
    try:
        made = parameter_tables().splitlines()
    except ImportError as err:
        return [f"cannot make the parameter tables ({err}): run scripts/check_docs.py in the project's venv"]
    found = text[start:end + len(PARAMETERS_END)].splitlines()
    if found == made:
        return []
    first = next((i for i, (a, b) in enumerate(zip(found, made)) if a != b), min(len(found), len(made)))
    shown = found[first] if first < len(found) else "(the table ends)"
    wanted = made[first] if first < len(made) else "(the table ends)"
    return [f"docs/interfaces.md: the parameter tables differ from the node's declarations (run "
            f"`python scripts/check_docs.py --write`); first at\n  docs: {shown}\n  node: {wanted}"]


def write_parameter_tables() -> None:
    text = INTERFACES.read_text(encoding="utf-8")
    start, end = text.index(PARAMETERS_BEGIN), text.index(PARAMETERS_END) + len(PARAMETERS_END)
    INTERFACES.write_text(text[:start] + parameter_tables() + text[end:], encoding="utf-8")


def main() -> int:
    if "--write" in sys.argv[1:]:
        write_parameter_tables()
    problems = parameter_problems(INTERFACES.read_text(encoding="utf-8"))
    problems += architecture_problems(ARCHITECTURE.read_text(encoding="utf-8"))
    problems += policy_table_problems(ARCHITECTURE.read_text(encoding="utf-8"))
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        rel = path.relative_to(ROOT)
        for number, line in enumerate(text.splitlines(), 1):
            for match in CITE.finditer(line):
                target = ROOT / "docs" / match.group(1)
                if not target.is_file():
                    problems.append(f"{rel}:{number}: docs/{match.group(1)} does not exist")
                    continue
                titles = headings(target)
                for section in SECTION.findall(match.group(2) or ""):
                    if section[0].isdigit():
                        section = "§" + section
                    if not has_section(titles, section):
                        problems.append(f"{rel}:{number}: docs/{match.group(1)} has no heading {section}")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        rel = page.relative_to(ROOT)
        text = page.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                problems.append(f"{rel}: link {target}: {file_part} does not exist")
            elif anchor and anchor not in {slug(h) for h in headings(dest)}:
                problems.append(f"{rel}: link {target}: no heading with anchor #{anchor}")
        for name in TICKED.findall(text):
            if not name.startswith(GENERATED) and not any((ROOT / base / name).exists() for base in SEARCH_ROOTS):
                problems.append(f"{rel}: `{name}` does not exist")
    for problem in problems:
        print(problem)
    print(f"check_docs: {len(problems)} problem(s)" if problems else "check_docs: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
