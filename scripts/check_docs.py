"""Check that the docs the repository cites exist and say what is cited.

    python scripts/check_docs.py            (no dependencies; exit code 1 when something is missing)

- every ``docs/<name>.md`` named anywhere in the tracked files exists, and every section it is cited
  with (``docs/hermes.md §5``, ``docs/hermes.md D9``, ``docs/h2svc.md TC3``,
  ``docs/world-models.md, "One layout"``) is a heading of that page;
- every relative link and image in README.md and docs/*.md resolves, anchors included;
- every repository path written in backticks in README.md and docs/*.md exists (generated ones aside).
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
SEARCH_ROOTS = ("", "streamcache_ros/", "streamcache_ros/engine/", "streamcache_ros/engine/cache/",
                "streamcache_ros/engine/adapters/")


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


def main() -> int:
    problems = []
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
