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
from specpipe.bench.loadtest import LEARN_FLAG, SERVER_DEFAULT, SUITE_PROMPTS, SUITES, WORKLOADS
from specpipe.bench.prompts import RECURRING_SIZE
from specpipe.cli import security_args
from specpipe.config.env import environment
from specpipe.config.presets import PRESETS
from specpipe.core.errors import InvalidArgument


def register(subparsers) -> None:
    parser = subparsers.add_parser("loadtest", help="load-test the Generate API with Locust (tokens/s, TTFT, ITL per users)",
                                   description=__doc__.split("\n\n")[0])
    target = parser.add_argument_group("target")
    target.add_argument("--addr", default=None, help="HOST:PORT of an orchestrator, or with --api openai the URL "
                        "of its HTTP API (default: start `specpipe up`)")
    target.add_argument("--api", default="grpc", choices=("grpc", "openai"),
                        help="the API the users call: the Generate RPC, or the OpenAI-compatible "
                        "/v1/chat/completions with server-sent events (docs/http-api.md) (default: %(default)s)")
    target.add_argument("--preset", default=environment().preset or "tiny", choices=sorted(PRESETS),
                        help="without --addr: the model pair of the `specpipe up` started (default: %(default)s)")
    target.add_argument("--up-args", action="append", default=None, metavar="[LABEL=]FLAGS",
                        help="without --addr: more `specpipe up` flags, e.g. \"--pin\". Repeat it to compare "
                        "servers in one run, each labelled, e.g. --up-args \"unbatched:default=--batching off --pin\" "
                        "--up-args \"batched=--pin\": each is started, loaded with every --drafter (or those "
                        "after LABEL:, comma-separated), and stopped")
    target.add_argument("--startup-timeout", type=float, default=600.0, metavar="S", help="(default: %(default)s)")
    load = parser.add_argument_group("load")
    load.add_argument("--shape", default="steps", choices=("constant", *SHAPES),
                      help="steps: each of --levels held --hold-s; ramp / spike over the same span; constant: "
                      "--users for --run-time (default: %(default)s)")
    load.add_argument("--levels", default="1,2,4,8,16", type=_levels, help="user counts (default: %(default)s)")
    load.add_argument("--hold-s", type=float, default=30.0, help="seconds per level (default: %(default)s)")
    load.add_argument("--users", type=int, default=4, help="constant: users (default: %(default)s)")
    load.add_argument("--run-time", type=float, default=60.0, metavar="S", help="constant: seconds (default: %(default)s)")
    work = parser.add_argument_group("requests (flags of deploy/locust/locustfile.py)")
    work.add_argument("--workload", default="suite", choices=WORKLOADS,
                      help="suite: the --suite prompts in turn; recurring: a sequence from HumanEval, MT-Bench and "
                      "GSM8K where about 30%% of the requests repeat an earlier one, 40%% take an earlier one's "
                      "template with other values and 30%% are unique, and without --addr every server twice, its "
                      f"n-gram store learning finished outputs off and on ({LEARN_FLAG} off / on), compared "
                      "(default: %(default)s)")
    work.add_argument("--suite", default="mix", choices=SUITES, help="mix: code, chat and math in turn (default: %(default)s)")
    work.add_argument("--prompt-limit", type=int, default=None,
                      help=f"prompts per suite (default: {SUITE_PROMPTS}); with --workload recurring, requests in the "
                      f"sequence (default: {RECURRING_SIZE}; after them it starts again)")
    work.add_argument("--max-new-tokens", type=int, default=environment().max_new_tokens or 64,
                      help="(default: %(default)s; env SPECPIPE_MAX_NEW_TOKENS)")
    work.add_argument("--deadline-s", type=float, default=120.0, help="client deadline per call (default: %(default)s)")
    work.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    work.add_argument("--top-p", type=float, default=1.0, help="(default: %(default)s)")
    work.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    work.add_argument("--drafter", default=SERVER_DEFAULT,
                      help="per-request drafter, comma-separated for one run each: model, ngram, hybrid, none "
                      f"(speculation off) or {SERVER_DEFAULT} (the server's) (default: %(default)s)")
    work.add_argument("--draft-len", type=int, default=0, help="0 = the server's (default: %(default)s)")
    work.add_argument("--width", type=int, default=0, help="0 = the server's (default: %(default)s)")
    work.add_argument("--schedule", default="", help="sequential or branch; empty = the server's")
    work.add_argument("--adaptive", default="", help="on or off; empty = the server's")
    security_args.add_client_tls_args(parser, " of --addr (without --addr and with --up-args --tls: the "
                                      "certificates `specpipe up` makes)")
    out = parser.add_argument_group("output")
    out.add_argument("--slo", default="", type=_slo, help="goodput SLOs: ttft=MS,itl=MS (ITL: a request's mean)")
    out.add_argument("--out", default=None, help="folder for Locust's CSV / HTML and the request records (default: a temp dir)")
    out.add_argument("--json", action="store_true", help="print the summary as JSON")
    out.add_argument("--report", default=None, metavar="MD", help="write the comparison into this Markdown file's "
                     "generated section, plots into <its folder>/load/<its name>-*.png")
    out.add_argument("--memory-every", type=float, default=0.0, metavar="S",
                     help="without --addr: sample the services' resident memory every S seconds (0 = off)")
    out.add_argument("--from-run", default=None, metavar="DIR",
                     help="instead of a load run: the tables (and --report) from the request records of an "
                     "earlier run's --out folder, described by that run's own flags (--slo, given, replaces "
                     "its SLOs), e.g. after a change to the statistics")
    out.add_argument("--warmup-s", type=float, default=30.0, help="memory samples before this are warm-up (default: %(default)s)")
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


def described(argv: list[str]):
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
