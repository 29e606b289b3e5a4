"""Lint and types (pyproject.toml [tool.ruff], [tool.mypy]; .ci/run runs both too): ruff over the whole
tree at its 120 columns; every public function of specpipe/ and the roles typed in full (its parameters
and its return); mypy over them (-m slow: a cold run takes half a minute), --strict on specpipe/core and
specpipe/config."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("specpipe", "orchestrator", "drafter_service", "verifier_service", "cache_service")


def tool(name: str) -> str:
    found = shutil.which(name) or str(pathlib.Path(sys.executable).with_name(name))
    assert pathlib.Path(found).exists(), f"{name} is in the dev extra: pip install -e '.[dev]'"
    return found


def test_ruff_passes_over_the_whole_tree():
    proc = subprocess.run([tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]


def untyped_public_functions(path: pathlib.Path) -> list[str]:
    """name:line of each public function or method (not _private; dunders count) whose parameters
    (self and cls aside) or return is not annotated (__init__ needs no return)."""
    found = []

    def visit(node: ast.AST, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                visit(child, True)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                dunder = child.name.startswith("__") and child.name.endswith("__")
                if child.name.startswith("_") and not dunder:
                    continue
                args = [*child.args.posonlyargs, *child.args.args, *child.args.kwonlyargs]
                if in_class and args and args[0].arg in ("self", "cls"):
                    args = args[1:]
                args += [a for a in (child.args.vararg, child.args.kwarg) if a is not None]
                if any(a.annotation is None for a in args) or (child.returns is None and child.name != "__init__"):
                    found.append(f"{child.name}:{child.lineno}")

    visit(ast.parse(path.read_text()), False)
    return found


def test_every_public_function_is_typed():
    untyped = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            if "_pb2" in path.name:
                continue
            if found := untyped_public_functions(path):
                untyped[relative] = found
    assert not untyped, untyped


@pytest.mark.slow
def test_mypy_passes():
    proc = subprocess.run([tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
