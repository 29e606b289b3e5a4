"""`specpipe up`: verifier, drafter and orchestrator, each its own process on loopback (docs/design.md,
"Deployment shapes and serving", shape 2). With --pin each gets its own CPU core, the stand-in for one accelerator per
service (docs/design.md, "Measuring on machines without a GPU"). With --cache redis a private redis-server (no persistence) is started
first and is the n-gram store of the orchestrator and the drafter. Ctrl-C / SIGTERM stops all of
them: SIGTERM, then SIGKILL after a grace; the redis-server last.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import tempfile

from specpipe.app.topology import METRICS_OFFSET, run_up
from specpipe.cli import options, security_args
from specpipe.config.env import environment
from specpipe.config.presets import DEFAULT_PRESET, PRESETS
from specpipe.config.services import UpConfig, model_config, speculation
from specpipe.core.types import DRAFTER_WITH_MODEL


def register(subparsers) -> None:
    parser = subparsers.add_parser("up", help="run verifier, drafter and orchestrator as local processes",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default=environment().preset or DEFAULT_PRESET, choices=sorted(PRESETS),
                        help="model pair (default: %(default)s; env SPECPIPE_PRESET)")
    parser.add_argument("--verifier", default=None, help="local model folder, or a model id in the local Hugging Face cache, of the verifier (overrides the preset)")
    parser.add_argument("--draft-model", default=None, help="local model folder, or a model id in the local Hugging Face cache, of the drafter (overrides the preset)")
    parser.add_argument("--device", default="cpu", help="torch device of the model services (default: %(default)s)")
    options.add_dtype_arg(parser)
    options.add_prepare_arg(parser)
    options.add_compile_arg(parser)
    parser.add_argument("--base-port", type=int, default=50051,
                        help="gRPC ports N (orchestrator), N+1 (verifier), N+2 (drafter), metrics ports "
                        f"N+{METRICS_OFFSET}..; 0 = free ports (default: %(default)s)")
    parser.add_argument("--http-port", type=int, default=8000,
                        help="the orchestrator's OpenAI-compatible HTTP API (docs/http-api.md); 0 = a free one, -1 = "
                        "off; with --base-port 0 a free one (default: %(default)s)")
    parser.add_argument("--threads-per-service", type=int, default=1, help="torch threads per service (default: %(default)s)")
    parser.add_argument("--tls", action="store_true", help="generate a private CA and certificates (in the log "
                        "dir): mutual TLS between the services, TLS on the public port, rediss:// to --cache redis")
    parser.add_argument("--pin", action="store_true", help="pin each service to its own CPU core when there are enough")
    parser.add_argument("--startup-timeout", type=float, default=300.0, metavar="S", help="(default: %(default)s)")
    parser.add_argument("--log-dir", default=None, help="where the services' stdout / stderr go (default: a temp dir)")
    parser.add_argument("--log-level", default="INFO", type=str.upper, help="(default: %(default)s)")
    parser.add_argument("--verifiers", type=int, default=1, metavar="N",
                        help="verifier replicas; each session is pinned to the least loaded (default: %(default)s)")
    parser.add_argument("--drafters", type=int, default=1, metavar="M", help="drafter replicas (default: %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                        help="each service's drain on SIGTERM (default: %(default)s)")
    parser.add_argument("--verifier-flags", default="", metavar="FLAGS",
                        help='more `specpipe serve verifier` flags for every verifier replica, e.g. '
                        '"--max-batch-tokens 1024 --gather-grace 0"')
    options.add_speculation_args(parser, drafter=DRAFTER_WITH_MODEL)
    options.add_hop_delay_arg(parser)
    security_args.add_learn_global_arg(parser)
    options.add_admission_args(parser, "orchestrator")  # the orchestrator's; the verifier's: --verifier-flags
    security_args.add_limit_args(parser)  # the orchestrator's input caps
    security_args.add_http_limit_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specpipe.cli.serve_cmd import exit_now

    exit_now(_up(args))  # the children are stopped; skip the interpreter's slow teardown


def _up(args: argparse.Namespace) -> int:
    config = UpConfig(
        model=model_config(vars(args)), base_port=args.base_port, http_port=None if args.http_port < 0 else args.http_port,
        threads_per_service=args.threads_per_service,
        pin=args.pin, startup_timeout_s=args.startup_timeout,
        log_dir=pathlib.Path(args.log_dir or tempfile.mkdtemp(prefix="specpipe-up-")), log_level=args.log_level,
        speculation=options.speculation_flags(speculation(vars(args))) + ("--hop-delay-ms", str(args.hop_delay_ms),
                                                                          "--learn-global", args.learn_global)
        + orchestrator_flags(args),
        cache=args.cache, verifiers=args.verifiers, drafters=args.drafters, drain_timeout_s=args.drain_timeout,
        tls=args.tls, verifier_flags=tuple(shlex.split(args.verifier_flags)),
    )
    return run_up(config)


def orchestrator_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The orchestrator's admission, input caps and HTTP bounds, as `up` was given them."""
    return (("--max-sessions", str(args.max_sessions), "--max-queue", str(args.max_queue))
            + security_args.limit_flags(args) + security_args.http_limit_flags(args))
