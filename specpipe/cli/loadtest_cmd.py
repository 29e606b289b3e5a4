"""`specpipe loadtest`: Locust against the streaming Generate API (deploy/locust/), headless, with a
table per user level: aggregate tokens/s, p50/p99 TTFT and inter-token latency, goodput under
--slo, errors by gRPC status. Targets --addr, or a `specpipe up` it starts and stops itself. With
several --drafter values it runs the shape once per value against the same services (speculation
off against on); with --workload recurring, recurring requests against a server whose store
learns finished outputs and one whose does not; --report writes the comparison into a Markdown
file with plots; --memory-every samples the services' resident memory (a soak).

What it runs: specpipe.bench.loadtest, over the flags' specpipe.config.bench.LoadtestConfig."""

from __future__ import annotations

import argparse

from specpipe.bench import loadstats
from specpipe.bench.loadshapes import SHAPES, parse_levels
from specpipe.bench.loadtest import SUITE_PROMPTS, SUITES, WORKLOADS
from specpipe.bench.prompts import RECURRING_SIZE
from specpipe.cli import options, security_args
from specpipe.config.bench import LoadtestConfig
from specpipe.core.errors import InvalidArgument


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "loadtest",
        help="load-test the Generate API with Locust (tokens/s, TTFT, ITL per users)",
        description=__doc__.split("\n\n")[0],
    )
    target = parser.add_argument_group("target")
    options.add_settings(target, LoadtestConfig, "addr", "api", "preset")
    options.add_setting(target, LoadtestConfig, "up_args", action="append", default=None)
    options.add_setting(target, LoadtestConfig, "startup_timeout")
    load = parser.add_argument_group("load")
    options.add_setting(load, LoadtestConfig, "shape", choices=("constant", *SHAPES))
    options.add_setting(load, LoadtestConfig, "levels", type=_levels)
    options.add_settings(load, LoadtestConfig, "hold_s", "users", "run_time", "load_processes")
    work = parser.add_argument_group("requests (flags of deploy/locust/locustfile.py)")
    options.add_setting(work, LoadtestConfig, "workload", choices=WORKLOADS)
    options.add_setting(work, LoadtestConfig, "suite", choices=SUITES)
    options.add_setting(work, LoadtestConfig, "prompt_limit",
                        shown=f"{SUITE_PROMPTS} per suite, {RECURRING_SIZE} requests of the recurring sequence")
    options.add_settings(work, LoadtestConfig, "max_new_tokens", "deadline_s", "temperature", "top_p", "seed",
                         "drafter", "draft_len", "width", "schedule", "adaptive")
    security_args.add_client_tls_args(parser, " of --addr (without --addr and with --up-args --tls: the "
                                      "certificates `specpipe up` makes)")
    out = parser.add_argument_group("output")
    options.add_setting(out, LoadtestConfig, "slo", type=_slo)
    options.add_settings(out, LoadtestConfig, "out", "json", "report", "memory_every", "from_run", "warmup_s",
                         "itl_events")
    parser.set_defaults(func=run)


def _levels(text: str) -> str:
    parse_levels(text)
    return text


def _slo(text: str) -> str:
    try:
        loadstats.parse_slo(text)
    except InvalidArgument as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def run(args: argparse.Namespace) -> int:
    from specpipe.bench import loadtest
    from specpipe.config.bench import loadtest_config

    config = loadtest_config({**vars(args), "argv": run_argv(args)})
    return loadtest.from_run(config, described) if config.from_run else loadtest.loadtest(config)


def described(argv: list[str]) -> LoadtestConfig:
    """The config of an earlier run's flags."""
    from specpipe.cli.main import build_parser
    from specpipe.config.bench import loadtest_config

    return loadtest_config(vars(build_parser().parse_args(["loadtest", *argv])))


def run_argv(args: argparse.Namespace) -> list[str]:
    """The loadtest flags of this command line, without --from-run DIR: the command of the run."""
    argv = getattr(args, "argv", [])
    argv = argv[1:] if argv[:1] == ["loadtest"] else []
    if "--from-run" in argv:
        i = argv.index("--from-run")
        argv = argv[:i] + argv[i + 2:]
    return argv
