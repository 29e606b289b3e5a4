"""`specpipe loadtest`: Locust against the streaming Generate API (deploy/locust/), headless, with a
table per user level: aggregate tokens/s, p50/p99 TTFT and inter-token latency, goodput under
--slo, errors by gRPC status. Targets --addr, or a `specpipe up` it starts and stops itself. With
several --drafter values it runs the shape once per value against the same services (speculation
off against on); --report writes the comparison into a Markdown file with plots; --memory-every
samples the services' resident memory (a soak)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from specpipe.bench import loadstats
from specpipe.bench.loadshapes import SHAPES, parse_levels
from specpipe.cli import security_args
from specpipe.config.env import environment
from specpipe.config.presets import PRESETS
from specpipe.core.errors import FailedPrecondition, InvalidArgument
from specpipe.core.types import DRAFTER_KINDS

SERVER_DEFAULT = "default"  # a --drafter value: the server's own default speculation
SUITES = ("mix", "humaneval", "mtbench", "gsm8k", "random", "noise")  # mix: the first three in turn


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
    work.add_argument("--suite", default="mix", choices=SUITES, help="mix: code, chat and math in turn (default: %(default)s)")
    work.add_argument("--prompt-limit", type=int, default=20, help="prompts per suite (default: %(default)s)")
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


def _slo(text: str) -> loadstats.Slo:
    try:
        return loadstats.parse_slo(text)
    except InvalidArgument as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def server_configs(up_args: list[str] | None, addr: str | None, drafters: list[str]) -> dict[str, tuple[str, list[str]]]:
    """label -> (`specpipe up` flags, drafters to load it with), from the --up-args given
    ("[LABEL[:DRAFTER,...]=]FLAGS"); one unlabelled server when --up-args is given at most once."""
    if addr is not None and up_args:
        raise InvalidArgument("--up-args configures the `specpipe up` loadtest starts: drop --addr")
    labelled = [_labelled(item, drafters) for item in up_args or [""]]
    if len(labelled) == 1:
        return {"": labelled[0][1:]}
    labels = [label for label, _, _ in labelled]
    if not all(labels) or len(set(labels)) < len(labels):
        raise InvalidArgument(f"--up-args given several times needs a distinct LABEL=FLAGS each; got {up_args}")
    return {label: (flags, own) for label, flags, own in labelled}


def _labelled(item: str, drafters: list[str]) -> tuple[str, str, list[str]]:
    """"LABEL[:DRAFTER,...]=FLAGS" -> (LABEL, FLAGS, drafters); flags alone -> ("", FLAGS, drafters)."""
    head, eq, flags = item.partition("=")
    if not eq or not head or head.startswith("-") or " " in head:
        return "", item, drafters
    label, colon, own = head.partition(":")
    own_drafters = [d for d in own.split(",") if d] if colon else drafters
    check_drafters(own_drafters, item)
    return label, flags, own_drafters


def check_drafters(drafters: list[str], given: str) -> None:
    if not drafters or set(drafters) - {SERVER_DEFAULT, *DRAFTER_KINDS}:
        raise InvalidArgument(f"--drafter takes {', '.join((SERVER_DEFAULT, *DRAFTER_KINDS))}, comma-separated; "
                              f"got {given!r}")


def client_flags(args: argparse.Namespace, up_args: str, up_dir: Path) -> tuple[str, ...]:
    """The Locust user's TLS and token flags: the client's, or with `up --tls` the client
    certificate that up issues (specpipe.app.up_security)."""
    security = security_args.locust_flags(vars(args))
    if args.addr is None and "--tls" in shlex.split(up_args) and not security:
        tls_dir = up_dir / "tls"
        security = security_args.locust_flags({"tls_ca": tls_dir / "ca.pem", "tls_cert": tls_dir / "client.pem",
                                               "tls_key": tls_dir / "client.key"})
    return security


def workload_flags(args: argparse.Namespace, drafter: str) -> tuple[str, ...]:
    flags = ["--api", args.api, "--suite", args.suite, "--prompt-limit", str(args.prompt_limit),
             "--max-new-tokens", str(args.max_new_tokens),
             "--deadline-s", f"{args.deadline_s:g}", "--temperature", f"{args.temperature:g}", "--top-p", f"{args.top_p:g}",
             "--seed", str(args.seed), "--draft-len", str(args.draft_len), "--width", str(args.width)]
    for name, value in (("--drafter", "" if drafter == SERVER_DEFAULT else drafter), ("--schedule", args.schedule),
                        ("--adaptive", args.adaptive)):
        if value:
            flags += [name, value]
    return tuple(flags)


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from specpipe.bench import loadruns as loadtest_runs

    if importlib.util.find_spec("locust") is None:
        raise FailedPrecondition("specpipe loadtest drives Locust: pip install 'specpipe[load]'")
    drafters = [d.strip() for d in args.drafter.split(",") if d.strip()]
    check_drafters(drafters, args.drafter)
    if args.from_run:
        return _from_run(args, Path(args.from_run))
    if args.report:
        _check_report(Path(args.report))  # before the run, not after it
    if args.memory_every > 0 and args.addr:
        raise InvalidArgument("--memory-every samples the services of the `specpipe up` loadtest starts: drop --addr")
    servers = server_configs(args.up_args, args.addr, drafters)
    if args.memory_every > 0 and len(servers) > 1:
        raise InvalidArgument("--memory-every samples one `specpipe up`: give --up-args once")
    security_args.client_security(args)  # unreadable files fail now, not in every Locust user
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="specpipe-loadtest-")).resolve()  # Locust runs in it
    out_dir.mkdir(parents=True, exist_ok=True)
    runs, statuses, sampler = {}, {}, None
    for server, (up_args, server_drafters) in servers.items():
        stack = None
        try:
            if args.addr is None:
                print(f"specpipe loadtest: starting specpipe up --preset {args.preset} {up_args}", file=sys.stderr,
                      flush=True)
                stack = loadtest_runs.start_up(["--preset", args.preset, *shlex.split(up_args)],
                                               out_dir / "up" / server, args.startup_timeout)
                if args.memory_every > 0:
                    sampler = loadtest_runs.MemorySampler(stack.pids, args.memory_every, out_dir / "memory.jsonl")
                    sampler.start()
            host = args.addr or (stack.http_url if args.api == "openai" else stack.addresses["orchestrator"])
            if host is None:
                raise FailedPrecondition("--api openai: the `specpipe up` started serves no HTTP API (--http-port -1?)")
            security = client_flags(args, up_args, out_dir / "up" / server)
            for drafter in server_drafters:
                label = f"{server} {drafter}".strip()
                run_dir = out_dir / label.replace(" ", "-") if len(servers) > 1 or len(drafters) > 1 else out_dir
                locust_run = loadtest_runs.LocustRun(host, run_dir, args.shape, args.users, args.run_time,
                                                     args.levels, args.hold_s,
                                                     workload_flags(args, drafter) + security, args.deadline_s)
                print(f"specpipe loadtest: {label or drafter}, {args.shape} load on {host}; output in {run_dir}",
                      file=sys.stderr, flush=True)
                statuses[label] = loadtest_runs.run_locust(locust_run)
                records = loadstats.read_records(locust_run.records) if locust_run.records.exists() else []
                runs[label] = loadstats.summarize(records, args.slo)
        finally:
            if sampler is not None:
                sampler.stop()
            if stack is not None:
                stack.stop()
    memory = {role: loadstats.memory_trend(samples, args.warmup_s) for role, samples in sampler.samples.items()} \
        if sampler is not None else {}
    summary = {"argv": run_argv(args), "out": str(out_dir), "runs": {d: loadstats.to_json(levels, args.slo)["levels"] for d, levels in runs.items()},
               "slo": loadstats.to_json([], args.slo)["slo"], "locust_status": statuses,
               "memory": {role: None if t is None else {**asdict(t), "growth_mb": t.growth_mb} for role, t in memory.items()}}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if args.report:
        _write_report(args, runs)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        _print_tables(runs, args.slo, memory)
    requests = sum(s.requests for levels in runs.values() for s in levels)
    errors = sum(sum(s.errors.values()) for levels in runs.values() for s in levels)
    return 1 if errors or not requests or any(statuses.values()) else 0


def run_argv(args: argparse.Namespace) -> list[str]:
    """The loadtest flags of this command line, without --from-run DIR: the command of the run."""
    argv = getattr(args, "argv", [])
    argv = argv[1:] if argv[:1] == ["loadtest"] else []
    if "--from-run" in argv:
        i = argv.index("--from-run")
        argv = argv[:i] + argv[i + 2:]
    return argv


def _from_run(args: argparse.Namespace, out_dir: Path) -> int:
    """The summaries of an earlier run, from its records (summary.json names its runs, in order). The
    run's own flags (stored in summary.json) describe it in the report; --slo, when given, replaces
    its SLOs."""
    try:
        summary = json.loads((out_dir / "summary.json").read_text())
        labels = list(summary["runs"])
    except (OSError, ValueError, KeyError):
        raise InvalidArgument(f"--from-run {out_dir}: no summary.json of a loadtest run there") from None
    if args.report:
        _check_report(Path(args.report))
    run_args = args
    if summary.get("argv"):  # runs before 2026-11-25 stored no flags: the flags given now describe them
        from specpipe.cli.main import build_parser

        run_args = build_parser().parse_args(["loadtest", *summary["argv"]])
        run_args.argv = ["loadtest", *summary["argv"]]
        run_args.report = args.report
        if args.slo != loadstats.Slo():
            run_args.slo = args.slo
    runs = {}
    for label in labels:
        path = out_dir / label.replace(" ", "-") / "requests.jsonl"
        runs[label] = loadstats.summarize(loadstats.read_records(path if path.exists() else out_dir / "requests.jsonl"),
                                          run_args.slo)
    if args.report:
        _write_report(run_args, runs)
    _print_tables(runs, run_args.slo, {})
    return 0


def _print_tables(runs: dict, slo: loadstats.Slo, memory: dict) -> None:
    from specpipe.bench.loadreport import run_label

    for label, levels in runs.items():
        print(f"\n{run_label(label)}\n{loadstats.markdown_table(levels, slo)}")
    if memory:
        print("\n| service | RSS first third (MB) | last third (MB) | growth (MB) | peak (MB) | slope (MB/min) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for role, t in memory.items():
            print(f"| {role} | - | - | - | - | too few samples |" if t is None else
                  f"| {role} | {t.first_mb:.1f} | {t.last_mb:.1f} | {t.growth_mb:+.1f} | {t.peak_mb:.1f} | "
                  f"{t.slope_mb_per_min:+.2f} |")


def _write_report(args: argparse.Namespace, runs: dict) -> None:
    from specpipe.bench import loadreport

    path = Path(args.report)
    images = loadreport.plot(runs, path.parent / "load", path.stem)
    meta = {"preset": "(--addr)" if args.addr else args.preset, "up args": " / ".join(args.up_args or ["-"]), "shape": args.shape,
            "levels": args.levels, "hold s": f"{args.hold_s:g}", "suite": args.suite,
            "max new tokens": args.max_new_tokens, "temperature": f"{args.temperature:g}",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    command = "specpipe loadtest " + shlex.join(run_argv(args))
    loadreport.write_report(path, loadreport.report_markdown(runs, args.slo, meta, images, path.parent, command))


def _check_report(path: Path) -> None:
    from specpipe.bench import loadreport
    from specpipe.bench.report import markers

    begin, end = markers(loadreport.SECTION)
    if not path.is_file() or begin not in (text := path.read_text()) or end not in text:
        raise InvalidArgument(f"--report {path}: needs a Markdown file with a {begin} ... {end} section")
