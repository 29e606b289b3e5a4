"""`specpipe up`: verifier, drafter and orchestrator, each its own process on loopback (docs/design.md,
"Deployment shapes and serving", shape 2). With --pin each gets its own CPU core, the stand-in for one
accelerator per service (docs/design.md, "Measuring on machines without a GPU"). With --cache redis a private
redis-server (no persistence) is started first and is the n-gram store of the orchestrator and the drafter.
Ctrl-C / SIGTERM stops all of them: SIGTERM, then SIGKILL after a grace; the redis-server last.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import tempfile
from typing import Any

from specpipe.app.topology import run_up
from specpipe.cli import options, security_args
from specpipe.config.services import (
    ModelConfig,
    UpConfig,
    given_settings,
    model_config,
    speculation,
    tracing_config,
)
from specpipe.core.types import DRAFTER_WITH_MODEL


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("up", help="run verifier, drafter and orchestrator as local processes",
                                   description=__doc__.split("\n\n")[0])
    options.add_settings(parser, ModelConfig, "preset", "verifier", "draft_model")
    options.add_setting(parser, ModelConfig, "device", help="torch device of the model services")
    options.add_dtype_arg(parser)
    options.add_prepare_arg(parser)
    options.add_compile_arg(parser)
    options.add_settings(parser, UpConfig, "base_port", "http_port", "threads_per_service", "tls", "pin",
                         "startup_timeout")
    options.add_setting(parser, UpConfig, "log_dir", default=None)
    options.add_setting(parser, UpConfig, "log_level", type=str.upper)
    options.add_settings(parser, UpConfig, "verifiers", "drafters", "orchestrators", "drain_timeout")
    options.add_setting(parser, UpConfig, "verifier_flags", default="")
    group = parser.add_argument_group("simulated device (load tests)")
    options.add_settings(group, UpConfig, "cost_model", "replay")
    options.add_speculation_args(parser, drafter=DRAFTER_WITH_MODEL)
    options.add_hop_delay_arg(parser)
    security_args.add_learn_global_arg(parser)
    options.add_admission_args(parser, "orchestrator")  # the orchestrator's; the verifier's: --verifier-flags
    security_args.add_limit_args(parser)  # the orchestrator's input caps
    security_args.add_http_limit_args(parser)
    options.add_tracing_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from specpipe.cli.serve_cmd import exit_now

    exit_now(_up(args))  # the children are stopped; skip the interpreter's slow teardown


def _up(args: argparse.Namespace) -> int:
    return run_up(up_config(vars(args), pathlib.Path(args.log_dir or tempfile.mkdtemp(prefix="specpipe-up-"))))


def up_config(values: dict[str, Any], log_dir: pathlib.Path) -> UpConfig:
    """The UpConfig of up's flags: --http-port -1 is off, the orchestrator's flags passed on as flags."""
    passed_on = ("--hop-delay-ms", str(values["hop_delay_ms"]), "--learn-global", values["learn_global"])
    return UpConfig(**{
        **given_settings(values, UpConfig), "model": model_config(values), "log_dir": log_dir,
        "http_port": None if values["http_port"] < 0 else values["http_port"],
        "speculation": options.speculation_flags(speculation(values)) + passed_on + orchestrator_flags(values),
        "verifier_flags": verifier_flags(values), "tracing": tracing_config(values),
    })


def verifier_flags(values: dict[str, Any]) -> tuple[str, ...]:
    """Every verifier replica's `serve verifier` flags: room for the sessions of all the orchestrators (one
    replica takes them all when the others are gone), unless --verifier-flags sets --max-sessions itself."""
    given = tuple(shlex.split(values["verifier_flags"]))
    if any(flag.split("=")[0] == "--max-sessions" for flag in given):
        return given
    return ("--max-sessions", str(values["orchestrators"] * values["max_sessions"])) + given


def orchestrator_flags(values: dict[str, Any]) -> tuple[str, ...]:
    """The orchestrator's admission, input caps and HTTP bounds, as `up` was given them."""
    return (("--max-sessions", str(values["max_sessions"]), "--max-queue", str(values["max_queue"]))
            + security_args.limit_flags(values) + security_args.http_limit_flags(values))
