"""Which reference docs describe the given files: each docs/*.md says the code it describes on its
second line, `<!-- describes: PATH ... -->` (a file, or a folder and all below it). When that code
changes, read those docs again: they say how it works now.

    python3 scripts/docs_for.py specpipe/engine/batched.py   # docs/batching.md
    python3 scripts/docs_for.py                               # the files this branch changed
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
DESCRIBES = re.compile(r"^<!-- describes: (.+) -->$")


def described() -> dict[str, tuple[str, ...]]:
    """docs/NAME.md -> the paths it describes."""
    table = {}
    for doc in sorted((ROOT / "docs").glob("*.md")):
        lines = doc.read_text().splitlines()
        match = DESCRIBES.match(lines[1]) if len(lines) > 1 else None
        table[f"docs/{doc.name}"] = tuple(match.group(1).split()) if match else ()
    return table


def describes(path: str, owned: str) -> bool:
    return path == owned or (owned.endswith("/") and path.startswith(owned))


def docs_for(paths: list[str]) -> dict[str, list[str]]:
    """path -> the docs that describe it (empty: none does)."""
    table = described()
    return {path: [doc for doc, owned in table.items() if any(describes(path, o) for o in owned)] for path in paths}


def changed_files() -> list[str]:
    """The files changed since this branch left main, committed or not."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    return git("diff", "--name-only", git("merge-base", "main", "HEAD").strip()).split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "paths", nargs="*", help="files, relative to the repository root (default: those changed since main)"
    )
    args = parser.parse_args()
    for path, docs in docs_for(args.paths or changed_files()).items():
        if docs:
            print(f"{path}: {', '.join(docs)}")


if __name__ == "__main__":
    main()
