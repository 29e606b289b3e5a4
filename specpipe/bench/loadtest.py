"""`specpipe loadtest` (docs/load.md): Locust against the streaming Generate API or the
OpenAI-compatible one, headless, with a table per user level: aggregate tokens/s, p50/p99 TTFT and
inter-token latency, goodput under the SLOs, errors by status. Targets an address, or each `specpipe
up` it starts and stops itself; with several drafters it runs the shape once per drafter against the
same services (speculation off against on); the report writes the comparison into a Markdown file
with plots; memory sampling watches the services' resident memory (a soak)."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from specpipe.bench import loadreport, loadruns, loadstats, pipecost
from specpipe.bench.loadshapes import parse_levels
from specpipe.bench.prompts import RECURRING, RECURRING_SIZE
from specpipe.config.bench import SUITE_PROMPTS, LoadtestConfig
from specpipe.config.services import TlsFiles
from specpipe.core.errors import FailedPrecondition, InvalidArgument
from specpipe.core.types import DRAFTER_KINDS
from specpipe.serving.security import Tls, read_token

SERVER_DEFAULT = "default"  # a drafter: the server's own default speculation
SUITES = ("mix", "humaneval", "mtbench", "gsm8k", "random", "noise")  # mix: the first three in turn
WORKLOADS = ("suite", RECURRING)  # the --suite prompts in turn; or the recurring sequence, learning off and on
LEARN_FLAG = "--learn-global"  # the orchestrator's switch for its store learning finished outputs (on / off)
LEARNING = (("learn-off", "off"), ("learn-on", "on"))  # the recurring workload's servers: label, LEARN_FLAG value
LOCUST_PREFIX = "--grpc-"  # Locust has --tls-cert / --tls-key of its own (its web UI)


def loadtest(config: LoadtestConfig) -> int:
    """Every server, loaded with each of its drafters; 0 when every request succeeded."""
    check(config)
    servers = server_configs(config.up_args, config.addr, config.drafters)
    if config.workload == RECURRING and config.addr is None:
        servers = learning_servers(servers)
    if config.memory_every > 0 and config.addr:
        raise InvalidArgument("--memory-every samples the services of the `specpipe up` loadtest starts: drop --addr")
    if config.memory_every > 0 and len(servers) > 1:
        raise InvalidArgument("--memory-every samples one `specpipe up`: give --up-args once")
    Tls.of(config.tls), read_token(config.auth_token_file)  # unreadable files fail now, not in every Locust user
    slo = loadstats.parse_slo(config.slo)
    out_dir = Path(config.out or tempfile.mkdtemp(prefix="specpipe-loadtest-")).resolve()  # Locust runs in it
    out_dir.mkdir(parents=True, exist_ok=True)
    runs, statuses, sampler, costs, clocks = {}, {}, None, {}, {}
    for server, (up_args, server_drafters) in servers.items():
        stack = None
        try:
            if config.addr is None:
                print(f"specpipe loadtest: starting specpipe up --preset {config.preset} {up_args}", file=sys.stderr,
                      flush=True)
                stack = loadruns.start_up(["--preset", config.preset, *shlex.split(up_args)],
                                          out_dir / "up" / server, config.startup_timeout)
                if config.memory_every > 0:
                    sampler = loadruns.MemorySampler(stack.pids, config.memory_every, out_dir / "memory.jsonl")
                    sampler.start()
            host: str | None
            if config.addr is not None:
                host = config.addr
            else:
                assert stack is not None  # started above
                host = stack.http_url if config.api == "openai" else orchestrators(stack)
            if host is None:
                raise FailedPrecondition("--api openai: the `specpipe up` started serves no HTTP API (--http-port -1?)")
            security = client_flags(config, up_args, out_dir / "up" / server)
            for drafter in server_drafters:
                label = f"{server} {drafter}".strip()
                run_dir = out_dir / label.replace(" ", "-") if len(servers) > 1 or len(config.drafters) > 1 else out_dir
                locust_run = loadruns.LocustRun(host, run_dir, config.shape, config.users, config.run_time,
                                                config.levels, config.hold_s,
                                                workload_flags(config, drafter) + security, config.deadline_s,
                                                config.load_processes)
                print(f"specpipe loadtest: {label or drafter}, {config.shape} load on {host}; output in {run_dir}",
                      file=sys.stderr, flush=True)
                statuses[label], samples = run_sampled(locust_run, stack)
                records = loadstats.read_records(locust_run.records) if locust_run.records.exists() else []
                runs[label] = loadstats.summarize(records, slo)
                costs[label] = pipecost.level_costs(samples, loadstats.level_windows(records))
                clocks[label] = clock_label(up_args)
                if config.workload == RECURRING:
                    check_recurring_shares(label, len(records), prompt_limit(config))
        finally:
            if sampler is not None:
                sampler.stop()
            if stack is not None:
                stack.stop()
    memory = {role: loadstats.memory_trend(samples, config.warmup_s) for role, samples in sampler.samples.items()} \
        if sampler is not None else {}
    summary = {
        "argv": list(config.argv),
        "out": str(out_dir),
        "runs": {d: loadstats.to_json(levels, slo)["levels"] for d, levels in runs.items()},
        "ratios": loadreport.tokens_per_s_ratios(runs),
        "slo": loadstats.to_json([], slo)["slo"],
        "locust_status": statuses,
        "memory": {role: None if t is None else {**asdict(t), "growth_mb": t.growth_mb} for role, t in memory.items()},
        "costs": {d: pipecost.to_json(c) for d, c in costs.items()},
        "clocks": clocks,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if config.report:
        write_report(config, runs)
    if config.json:
        print(json.dumps(summary, indent=1))
    else:
        print_tables(runs, slo, memory, costs, clocks)
    requests = sum(s.requests for levels in runs.values() for s in levels)
    errors = sum(sum(s.errors.values()) for levels in runs.values() for s in levels)
    return 1 if errors or not requests or any(statuses.values()) else 0


def from_run(config: LoadtestConfig, described: Callable[[list[str]], LoadtestConfig]) -> int:
    """The summaries of an earlier run (config.from_run, its --out folder), from its records
    (summary.json names its runs, in order). The run's own flags (stored in summary.json, read by
    described) describe it in the report; config's SLOs, when given, replace its."""
    check(config)
    assert config.from_run is not None  # the command runs this for --from-run only
    out_dir = Path(config.from_run)
    try:
        summary = json.loads((out_dir / "summary.json").read_text())
        labels = list(summary["runs"])
    except (OSError, ValueError, KeyError):
        raise InvalidArgument(f"--from-run {out_dir}: no summary.json of a loadtest run there") from None
    run = config
    if summary.get("argv"):  # runs before 2026-11-25 stored no flags: the flags given now describe them
        stored = described(summary["argv"])
        run = replace(stored, argv=tuple(summary["argv"]), report=config.report, slo=config.slo or stored.slo)
    slo = loadstats.parse_slo(run.slo)
    runs = {}
    for label in labels:
        path = out_dir / label.replace(" ", "-") / "requests.jsonl"
        runs[label] = loadstats.summarize(loadstats.read_records(path if path.exists() else out_dir / "requests.jsonl"),
                                          slo)
    if config.report:
        write_report(run, runs)
    print_tables(runs, slo, {})
    return 0


def check(config: LoadtestConfig) -> None:
    """What fails before anything starts: Locust missing, unknown drafters, a report file without its section."""
    if importlib.util.find_spec("locust") is None:
        raise FailedPrecondition("specpipe loadtest drives Locust: pip install 'specpipe[load]'")
    check_drafters(config.drafters, config.drafter)
    check_processes(config)
    if config.report:
        check_report(Path(config.report))


def check_processes(config: LoadtestConfig) -> None:
    """Several load processes split every user count evenly (each records its share times their number)."""
    processes = config.load_processes
    if processes < 1:
        raise InvalidArgument(f"--load-processes must be at least 1, got {processes}")
    if processes == 1:
        return
    if config.shape == "ramp":
        raise InvalidArgument("--load-processes: a ramp passes through every user count, which several processes "
                              "cannot split evenly; use --shape steps or constant")
    counts = [config.users] if config.shape == "constant" else list(parse_levels(config.levels))
    if uneven := [n for n in counts if n % processes]:
        raise InvalidArgument(f"--load-processes {processes}: every user count must be a multiple of it (the users "
                              f"split evenly among the processes); got {', '.join(map(str, uneven))}")


def server_configs(up_args: tuple[str, ...] | list[str], addr: str | None,
                   drafters: list[str]) -> dict[str, tuple[str, list[str]]]:
    """label -> (`specpipe up` flags, drafters to load it with), from the --up-args given
    ("[LABEL[:DRAFTER,...]=]FLAGS"); one unlabelled server when --up-args is given at most once."""
    if addr is not None and up_args:
        raise InvalidArgument("--up-args configures the `specpipe up` loadtest starts: drop --addr")
    labelled = [_labelled(item, drafters) for item in up_args or [""]]
    if len(labelled) == 1:
        return {"": labelled[0][1:]}
    labels = [label for label, _, _ in labelled]
    if not all(labels) or len(set(labels)) < len(labels):
        raise InvalidArgument(f"--up-args given several times needs a distinct LABEL=FLAGS each; got {list(up_args)}")
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


def learning_servers(servers: dict[str, tuple[str, list[str]]]) -> dict[str, tuple[str, list[str]]]:
    """Each server twice, its store learning finished outputs off and then on (LEARN_FLAG), labelled
    learn-off / learn-on (LABEL-learn-off / LABEL-learn-on for a labelled server)."""
    return {"-".join(filter(None, (label, name))): (f"{flags} {LEARN_FLAG} {value}".strip(), drafters)
            for label, (flags, drafters) in servers.items() for name, value in LEARNING}


def prompt_limit(config: LoadtestConfig) -> int:
    """--prompt-limit, or its default: prompts per suite, or the recurring sequence's requests."""
    return config.prompt_limit or (RECURRING_SIZE if config.workload == RECURRING else SUITE_PROMPTS)


def check_recurring_shares(label: str, requests: int, sequence: int) -> None:
    """Say when a run's requests do not keep the recurring sequence's shares: the users take its
    requests in a shuffled order (deploy/locust/locustfile.py), so a run that makes far fewer
    requests sees few recur, and one that makes more repeats the sequence from its start."""
    if requests > sequence or 2 * requests < sequence:
        print(f"specpipe loadtest: {label or 'the run'} made {requests} requests of a recurring sequence of "
              f"{sequence}, taken in a shuffled order: the shares of repeats, templates and unique prompts hold for "
              "about as many requests as the sequence has (--prompt-limit)", file=sys.stderr, flush=True)


def check_drafters(drafters: list[str], given: str) -> None:
    if not drafters or set(drafters) - {SERVER_DEFAULT, *DRAFTER_KINDS}:
        raise InvalidArgument(f"--drafter takes {', '.join((SERVER_DEFAULT, *DRAFTER_KINDS))}, comma-separated; "
                              f"got {given!r}")


def locust_flags(tls: TlsFiles | None, token_file: str | None) -> tuple[str, ...]:
    """The locustfile's client security flags (deploy/locust/locustfile.py)."""
    files = {"tls_ca": tls and tls.ca, "tls_cert": tls and tls.cert, "tls_key": tls and tls.key,
             "auth_token_file": token_file}
    return tuple(item for dest, value in files.items() if value
                 for item in (LOCUST_PREFIX + dest.replace("_", "-"), str(value)))


def client_flags(config: LoadtestConfig, up_args: str, up_dir: Path) -> tuple[str, ...]:
    """The Locust user's TLS and token flags: the client's, or with `up --tls` the client
    certificate that up issues (specpipe.app.up_security)."""
    security = locust_flags(config.tls, config.auth_token_file)
    if config.addr is None and "--tls" in shlex.split(up_args) and not security:
        tls_dir = up_dir / "tls"
        security = locust_flags(TlsFiles(cert=str(tls_dir / "client.pem"), key=str(tls_dir / "client.key"),
                                         ca=str(tls_dir / "ca.pem")), None)
    return security


def workload_flags(config: LoadtestConfig, drafter: str) -> tuple[str, ...]:
    suite = RECURRING if config.workload == RECURRING else config.suite  # the locustfile loads it as a suite
    flags = ["--api", config.api, "--suite", suite, "--prompt-limit", str(prompt_limit(config)),
             "--max-new-tokens", str(config.max_new_tokens), "--deadline-s", f"{config.deadline_s:g}",
             "--temperature", f"{config.temperature:g}", "--top-p", f"{config.top_p:g}",
             "--seed", str(config.seed), "--draft-len", str(config.draft_len), "--width", str(config.width),
             "--itl-events", config.itl_events]
    for name, value in (("--drafter", "" if drafter == SERVER_DEFAULT else drafter), ("--schedule", config.schedule),
                        ("--adaptive", config.adaptive)):
        if value:
            flags += [name, value]
    return tuple(flags)


def orchestrators(stack: loadruns.Stack) -> str:
    """The orchestrator replicas' addresses, comma-separated: the users take them in turn (as a Service
    spreads connections)."""
    return ",".join(address for name, address in sorted(stack.addresses.items()) if name.startswith("orchestrator"))


def run_sampled(locust_run: loadruns.LocustRun, stack: loadruns.Stack | None) -> tuple[int, list]:
    """Locust's status, and the cost samples of the services it loaded (none against --addr)."""
    if stack is None or not stack.metrics:
        return loadruns.run_locust(locust_run), []
    sampler = loadruns.CostSampler(stack.metrics, stack.pids)
    sampler.start()
    try:
        return loadruns.run_locust(locust_run, lambda pid: sampler.watch(loadruns.LOAD_GENERATOR, pid)), sampler.samples
    finally:
        sampler.stop()


def clock_label(up_args: str) -> str:
    """The verifier's clock in a `specpipe up`'s flags: a cost model's (simulated), a replay's transcript."""
    from specpipe.engine.costmodel import load_curve

    flags = shlex.split(up_args)

    def value(flag: str) -> str | None:
        return flags[flags.index(flag) + 1] if flag in flags[:-1] else None

    curve, replay = value("--cost-model"), value("--replay")
    label = load_curve(curve, "verifier").label if curve else ""
    return label + (f", replaying {Path(replay).name}" if replay else "")


def print_tables(runs: dict, slo: loadstats.Slo, memory: dict, costs: dict | None = None,
                 clocks: dict | None = None) -> None:
    for label, levels in runs.items():
        print(f"\n{loadreport.run_label(label)}\n{loadstats.markdown_table(levels, slo)}")
        if costs and costs.get(label):
            print(f"\n{pipecost.markdown_table(costs[label], (clocks or {}).get(label, ''))}")
    if len(runs) > 1:
        print(f"\nthe runs side by side\n{loadreport.comparison_table(runs)}")
    if memory:
        print("\n| service | RSS first third (MB) | last third (MB) | growth (MB) | peak (MB) | slope (MB/min) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for role, t in memory.items():
            print(f"| {role} | - | - | - | - | too few samples |" if t is None else
                  f"| {role} | {t.first_mb:.1f} | {t.last_mb:.1f} | {t.growth_mb:+.1f} | {t.peak_mb:.1f} | "
                  f"{t.slope_mb_per_min:+.2f} |")


def write_report(config: LoadtestConfig, runs: dict[str, Any]) -> None:
    assert config.report is not None  # written for --report only
    path = Path(config.report)
    images = loadreport.plot(runs, path.parent / "load", path.stem)
    meta = {"preset": "(--addr)" if config.addr else config.preset, "up args": " / ".join(config.up_args or ["-"]),
            "shape": config.shape, "levels": config.levels, "hold s": f"{config.hold_s:g}",
            "suite": f"{RECURRING} ({prompt_limit(config)} requests)" if config.workload == RECURRING else config.suite,
            "max new tokens": config.max_new_tokens, "temperature": f"{config.temperature:g}",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    command = "specpipe loadtest " + shlex.join(config.argv)
    loadreport.write_report(path, loadreport.report_markdown(runs, loadstats.parse_slo(config.slo), meta, images,
                                                             path.parent, command))


def check_report(path: Path) -> None:
    from specpipe.bench.report import markers

    begin, end = markers(loadreport.SECTION)
    if not path.is_file() or begin not in (text := path.read_text()) or end not in text:
        raise InvalidArgument(f"--report {path}: needs a Markdown file with a {begin} ... {end} section")
