"""`specpipe bench`: verifier-only greedy vs speculative on a prompt suite, in one run."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import threading
from dataclasses import dataclass, replace

from specpipe.cli import options
from specpipe.errors import InvalidArgument
from specpipe.types import ALL_HYPOTHESES, DRAFTER_KINDS, PREDICTORS, SCHEDULES, SpeculationOptions

SUITES = ("humaneval", "mtbench", "gsm8k")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark speculative decoding against the verifier alone",
        description="Run verifier-only transformers greedy generate() and speculative decoding on the same "
        "prompts in one run; report tokens/s, speed-up, tokens per verify call, and whether every output "
        "is identical to the baseline. One CPU core per service: --threads 1 --pin (the default).",
    )
    parser.add_argument("--suite", choices=SUITES, default="humaneval", help="prompt suite (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=10, help="prompts from the suite (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--json", dest="json_file", default=None, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--drafters", default=None, metavar="LIST",
                        help="comma-separated drafters to compare in this run, e.g. model,ngram,hybrid, each with "
                        "--schedule / --predictor (default: the one --drafter names)")
    parser.add_argument("--methods", default=None, metavar="LIST",
                        help="comma-separated methods, each DRAFTER[:SCHEDULE[:PREDICTOR]][@HOP_MS], e.g. "
                        "model:sequential,model:branch,model:branch:paper,model:branch@2 (@HOP_MS needs "
                        "--transport grpc); overrides --drafters")
    parser.add_argument("--transport", choices=("embedded", "grpc"), default="embedded",
                        help="embedded: everything in this process; grpc: the verifier and the drafter as "
                        "`specpipe serve` processes on loopback, each pinned to its own core (default: %(default)s)")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="do not pin to one CPU core per service (pinned by default)")
    curve = parser.add_argument_group("forward curve")
    curve.add_argument("--forward-curve", action="store_true",
                       help="instead of decoding prompts: measure T(k), one forward of k new tokens after a "
                       "300-token context, for the verifier and the drafter, eager and (with --compile on) "
                       "compiled, and the speed-up bounds it implies")
    curve.add_argument("--acceptance", default="0.99,0.72,0.42", metavar="LIST",
                       help="per-token acceptance rates to compute bounds for (default: the model drafter's "
                       "measured HumanEval, GSM8K and MT-Bench rates, %(default)s)")
    curve.add_argument("--plot", default=None, metavar="PNG", help="write the curves as a PNG plot")
    options.add_model_args(parser)
    options.add_speculation_args(parser)
    options.add_hop_delay_arg(parser)
    parser.set_defaults(func=run, threads=1)


@dataclass(frozen=True)
class Method:
    drafter: str
    schedule: str
    predictor: str
    hop_delay_ms: float = 0.0

    def name(self, speculation: SpeculationOptions, compiled: bool) -> str:
        if self.drafter == "none":
            return f"specpipe verifier alone{' compiled' if compiled else ''}"
        name = f"specpipe {self.drafter} k={speculation.draft_len} width={speculation.width} {self.schedule}"
        if self.schedule == "branch":
            m = "all" if speculation.hypotheses == ALL_HYPOTHESES else speculation.hypotheses
            name += f" {self.predictor} M={m}"
        return name + (f" hop {self.hop_delay_ms:g} ms" if self.hop_delay_ms else "")


def parse_methods(args: argparse.Namespace) -> list[Method]:
    """--methods, or --drafters with --schedule / --predictor."""
    if not args.methods:
        kinds = args.drafters.split(",") if args.drafters else [args.drafter]
        methods = [Method(kind, args.schedule, args.predictor, args.hop_delay_ms) for kind in check_kinds(kinds)]
    else:
        methods = [parse_method(item, args) for item in args.methods.split(",")]
    if args.transport == "embedded" and any(m.hop_delay_ms for m in methods):
        raise InvalidArgument("a hop delay delays gRPC calls: use it with --transport grpc")
    return methods


def parse_method(item: str, args: argparse.Namespace) -> Method:
    """DRAFTER[:SCHEDULE[:PREDICTOR]][@HOP_MS]; what is left out comes from the flags."""
    spec, _, hop = item.partition("@")
    parts = spec.split(":")
    if len(parts) > 3:
        raise InvalidArgument(f"bad method {item!r}: expected DRAFTER[:SCHEDULE[:PREDICTOR]][@HOP_MS]")
    drafter, schedule, predictor = parts + [args.schedule, args.predictor][len(parts) - 1:]
    check_kinds([drafter])
    if schedule not in SCHEDULES or predictor not in PREDICTORS:
        raise InvalidArgument(f"bad method {item!r}: schedule is one of {', '.join(SCHEDULES)}, predictor one of "
                              f"{', '.join(PREDICTORS)}")
    try:
        hop_ms = float(hop) if hop else args.hop_delay_ms
    except ValueError:
        raise InvalidArgument(f"bad method {item!r}: @HOP_MS must be a number of milliseconds") from None
    return Method(drafter, schedule, predictor, hop_ms)


def check_kinds(kinds: list[str]) -> list[str]:
    unknown = [k for k in kinds if k not in DRAFTER_KINDS]
    if unknown:
        raise InvalidArgument(f"unknown drafters {unknown}; choose from {', '.join(DRAFTER_KINDS)}")
    return kinds


def run(args: argparse.Namespace) -> int:
    from specpipe.bench import benchmark, markdown_table, to_json
    from specpipe.prompts import load_suite

    if args.forward_curve:
        return run_forward_curve(args)
    methods = parse_methods(args)
    compiled = args.compile == "on"
    none = next((m for m in methods if m.drafter == "none"), None)
    if compiled and none is None:  # the compiled verifier alone: the compiled methods' baseline and yardstick
        none = Method("none", "sequential", args.predictor)
        methods.insert(0, none)
    if args.cache != "memory":
        raise InvalidArgument("bench gives each method a fresh in-memory n-gram store (so no method drafts from "
                              "outputs another learned); leave --cache at memory")
    with contextlib.ExitStack() as stack:
        if args.transport == "embedded":
            generators = embedded_generators(args, methods)
        else:
            generators = stack.enter_context(grpc_generators(args, methods))
        any_generator = next(iter(generators.values()))
        prompts = [(p.id, any_generator.encode(messages=p.messages)) for p in load_suite(args.suite, args.limit)]
        runs = {}
        for method in methods:
            speculation = replace(options.speculation_options(args), drafter=method.drafter, schedule=method.schedule,
                                  predictor=method.predictor)
            runs[method.name(speculation, compiled)] = (
                with_fresh_store(generators[method.hop_delay_ms], method.drafter), speculation)
        reference = none.name(options.speculation_options(args), compiled) if compiled else None
        summaries = benchmark(args.baseline_model, any_generator.info.eos_token_ids, prompts, args.max_new_tokens, runs,
                              reference)
    print(markdown_table(summaries))
    ok = all(s.identical == s.prompts for s in summaries if s.method != reference)
    print("lossless check: every output is identical to the verifier-only output run the same way" if ok else
          "LOSSLESS CHECK FAILED: some outputs differ from the verifier-only output run the same way")
    if reference:
        alone = next(s for s in summaries if s.method == reference)
        print(f"compiled vs eager: the compiled verifier alone gave the eager generate() output on {alone.identical} "
              f"of {alone.prompts} prompts" + ("" if alone.identical == alone.prompts else
                                               " (floating-point differences changed a greedy token)"))
    if args.json_file:
        import torch

        meta = {"preset": args.preset, "suite": args.suite, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
                "threads": torch.get_num_threads(), "pinned": args.pin, "transport": args.transport,
                "compile": args.compile, "draft_weights": args.draft_weights, "models": any_generator.info.model_name,
                "cache": args.cache, **machine_info()}
        with open(args.json_file, "w") as f:
            json.dump(to_json(summaries, meta), f, indent=1)
    return 0 if ok else 1


def run_forward_curve(args: argparse.Namespace) -> int:
    from specpipe import curve
    from specpipe.models import load_model
    from specpipe.presets import model_specs
    from specpipe.runner import Runner

    try:
        acceptances = [float(a) for a in args.acceptance.split(",") if a]
    except ValueError:
        acceptances = []
    if not acceptances or not all(0.0 <= a <= 1.0 for a in acceptances):
        raise InvalidArgument(f"--acceptance takes rates in [0, 1], got {args.acceptance!r}")
    if args.pin:
        pin(1)
    options.set_threads(args.threads)
    modes = ("eager", options.forward_mode(args)) if args.compile == "on" else ("eager",)
    curves: dict[str, dict[int, float]] = {}
    for role, spec in zip(("verifier", "drafter"), model_specs(args.preset, args.verifier, args.draft_model)):
        runners = {}
        for mode in modes:  # a model each: packed changes its model in place
            runners[f"{role} {mode}"] = Runner(load_model(spec, args.device), mode)
            runners[f"{role} {mode}"].warm_up(progress=True)
        curves.update(curve.forward_curves(runners, desc=f"T(k) {role}"))
        del runners
    print(curve.curve_markdown(curves))
    bounds = {mode: curve.bounds_table(curves[f"verifier {mode}"], curves[f"drafter {mode}"][1], acceptances)
              for mode in modes}
    print()
    print(curve.bounds_markdown(bounds))
    if args.plot:
        curve.plot_curves(curves, args.plot)
    if args.json_file:
        import torch

        meta = {"preset": args.preset, "threads": torch.get_num_threads(), "pinned": args.pin, **machine_info()}
        with open(args.json_file, "w") as f:
            json.dump({"meta": meta, "curves": {label: {str(k): t for k, t in c.items()} for label, c in curves.items()},
                       "bounds": bounds}, f, indent=1)
    return 0


def machine_info() -> dict:
    """The CPU that the numbers come from: model name, vector extensions, cores."""
    cpu, flags = platform.processor() or platform.machine(), set()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            fields = {key.strip(): value for key, _, value in
                      (line.partition(":") for line in f.read().split("\n\n")[0].splitlines())}
        cpu = fields.get("model name", cpu).strip()
        flags = set(fields.get("flags", "").split())
    return {"machine": cpu, "cpu_count": os.cpu_count(),
            "vector_extensions": [x for x in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if x in flags]}


def pin(cores: int) -> None:
    """Pin this process to its first `cores` allowed cores (one per service that runs at once)."""
    if hasattr(os, "sched_setaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, set(allowed[:cores]))


def embedded_generators(args: argparse.Namespace, methods: list[Method]) -> dict:
    """One in-process generator; with a branch schedule the drafter and the verifier run at once, so
    the process gets a core for each."""
    from specpipe.cli.wiring import embedded_generator

    if args.pin:
        pin(2 if any(m.schedule == "branch" for m in methods) else 1)
    generator = embedded_generator(args, tuple({m.drafter for m in methods}))
    args.baseline_model = generator.verifier.model
    if args.compile == "on":  # the verifier's model is compiled (packed in place); the baseline is eager
        from specpipe.models import load_model
        from specpipe.presets import model_specs

        args.baseline_model = load_model(model_specs(args.preset, args.verifier, args.draft_model)[0], args.device)
    return {0.0: generator}


@contextlib.contextmanager
def grpc_generators(args: argparse.Namespace, methods: list[Method]):
    """`specpipe serve verifier` and `serve drafter` processes on loopback (each pinned to its own
    core with --pin), and one orchestrator in this process per hop delay. The baseline runs here, on
    the verifier's core."""
    import pathlib
    import tempfile

    from specpipe.cli import up_cmd
    from specpipe.cli.wiring import remote_generator
    from specpipe.models import load_model
    from specpipe.presets import model_specs

    config = up_cmd.UpConfig(
        preset=args.preset, verifier=args.verifier, draft_model=args.draft_model, device=args.device,
        compile=args.compile, draft_weights=args.draft_weights, base_port=0, threads_per_service=1, pin=args.pin,
        startup_timeout_s=3600.0 if options.forward_mode(args) == "graphs" else 600.0,
        log_dir=pathlib.Path(tempfile.mkdtemp(prefix="specpipe-bench-")), log_level="WARNING", speculation=(),
        cache="memory")
    cores = up_cmd.service_cores(config, ("verifier", "drafter"))
    children = []
    try:
        for role in ("verifier", "drafter"):
            children.append(up_cmd.start_service(role, config, cores.get(role), ()))
        for child in children:
            up_cmd.wait_serving(child, config.startup_timeout_s, threading.Event())
        if "verifier" in cores:
            os.sched_setaffinity(0, {cores["verifier"]})
        options.set_threads(1)
        verifier_spec = model_specs(args.preset, args.verifier, args.draft_model)[0]
        args.baseline_model = load_model(verifier_spec, args.device)
        yield {hop: remote_generator(verifier_spec, children[0].address, children[1].address,
                                     options.speculation_options(args), hop_delay_ms=hop)
               for hop in sorted({m.hop_delay_ms for m in methods})}
    finally:
        up_cmd.stop_all(children[::-1])


def with_fresh_store(generator, kind: str):
    """The generator's models with the drafters of kind over a new, empty in-memory n-gram store."""
    from cache_service.memory import InMemoryNgramCache
    from orchestrator.generator import Generator
    from specpipe.cli.wiring import build_drafters

    if kind not in ("ngram", "hybrid"):
        return generator
    store = InMemoryNgramCache()
    drafters = build_drafters((kind,), store, generator.drafters.get("model"), generator.info)
    return Generator(generator.tokenizer, generator.verifier, drafters, generator.defaults, store)
