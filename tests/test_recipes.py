"""bench-results/ is data only, and the scripts that make it keep working: every recipe
(bench-results/recipes/) and every script (scripts/) parses its --help, which imports what it imports
of specpipe, so a rename inside the package breaks this test rather than the next measurement; each
run's folder is named `<date>-<question>/` and holds the command that made it."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import runpy
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECIPES = ROOT / "bench-results" / "recipes"
LIBRARIES = {"arms.py"}  # imported by the recipes, not run
PYTHON = sorted(p for p in [*RECIPES.glob("*.py"), *(ROOT / "scripts").glob("*.py")] if p.name not in LIBRARIES)
SHELL = sorted(p for p in [*RECIPES.glob("*.sh"), *(ROOT / "scripts").glob("*.sh")] if p.name != "lib.sh")
RUN_FOLDER = re.compile(r"^20\d\d-\d\d-\d\d-[a-z0-9-]+$")


@pytest.mark.parametrize("script", PYTHON, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_python_recipe_parses_its_help(script, monkeypatch):
    """Run in this process (the imports are shared, so it takes milliseconds), as `PYTHONPATH=. python3
    SCRIPT --help` runs it: its own folder first on the path."""
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit:
        runpy.run_path(str(script), run_name="__main__")
    assert exit.value.code in (0, None) and "usage:" in out.getvalue(), out.getvalue()[-2000:]


@pytest.mark.parametrize("script", SHELL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_shell_recipe_says_what_it_does(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if script.name == "soak.sh":  # its flags are the loadtest's: --help is the loadtest's, which a test checks
        return
    proc = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) >= 1, proc.stderr


def test_bench_results_holds_run_folders_and_the_recipes_only():
    tracked = subprocess.run(["git", "ls-files", "bench-results"], cwd=ROOT, capture_output=True, text=True).stdout
    entries = sorted({path.split("/")[1] for path in tracked.split()} - {"recipes"})
    assert all(RUN_FOLDER.match(name) for name in entries), [n for n in entries if not RUN_FOLDER.match(n)]
    assert all((ROOT / "bench-results" / name / "command.txt").is_file() for name in entries)
    scripts = [path for path in tracked.split() if path.endswith((".py", ".sh")) and "/recipes/" not in path]
    assert not scripts, f"scripts belong in bench-results/recipes/ or scripts/: {scripts}"
