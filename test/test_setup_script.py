"""The checks scripts/setup.sh runs at the end of an install import the engine by path; a module
that moves must not leave set-up failing on a fresh machine (the suite itself would never notice,
since it runs from a venv set up earlier)."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEREDOC = re.compile(r"python - (?:\"\$ROOT\" )?<<'PY'\n(.*?)\nPY\n", re.S)


def setup_snippets():
    return HEREDOC.findall((ROOT / "scripts" / "setup.sh").read_text())


def test_setup_has_its_install_checks():
    snippets = setup_snippets()
    assert len(snippets) >= 2, "scripts/setup.sh's python checks were not found: the pattern above is stale"


def test_install_check_imports_what_exists():
    install_check = next(s for s in setup_snippets() if "bundled models" in s)
    done = subprocess.run([sys.executable, "-c", install_check], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[setup] ok:" in done.stdout and "world-qwen2_5_vl" in done.stdout, done.stdout


def test_launch_check_imports_resolve():
    launch_check = next(s for s in setup_snippets() if "ros2_launch_unavailable" in s)
    imports = "\n".join(line for line in launch_check.splitlines() if line.startswith(("import ", "from ")))
    done = subprocess.run([sys.executable, "-c", imports], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
