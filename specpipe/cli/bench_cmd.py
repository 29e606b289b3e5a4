"""`specpipe bench`: every method on the same prompts in one run; the forward curve; the report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
from dataclasses import replace

from specpipe.app.wiring import forward_mode
from specpipe.bench.methods import Method, parse_baselines, parse_methods
from specpipe.cli import options
from specpipe.config.services import model_config
from specpipe.core.errors import InvalidArgument
from specpipe.engine.cores import set_threads

SUITES = ("humaneval", "mtbench", "gsm8k", "random", "noise")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark speculative decoding against the verifier alone",
        description="Run verifier-only transformers greedy generate() and speculative decoding on the same "
        "prompts in one run; report tokens/s, speed-up, tokens per verify call, and whether every output "
        "is identical to the baseline. Pinned to one CPU core per service that runs at once (the default); "
        "embedded, the verifier and the drafter share the process's cores (specpipe.engine.cores).",
    )
    parser.add_argument("--suite", choices=SUITES, default="humaneval",
                        help="prompt suite; random: made-up words to continue (the models copy them, so drafts "
                        "are good); noise: random base64, random passwords and poems of random words in mixed "
                        "scripts (poor drafts with --preset smollm2; qwen-coder copies and repeats, so its drafts "
                        "still land) (default: %(default)s)")
    parser.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                        help="your own prompts instead of --suite: one JSON object a line, {\"prompt\": ...} or "
                        "{\"messages\": [{\"role\", \"content\"}, ...]}, optional \"id\"")
    parser.add_argument("--limit", type=int, default=10,
                        help="prompts from the suite; MT-Bench takes its categories in turn (default: %(default)s)")
    parser.add_argument("--turns", type=int, choices=(1, 2), default=1,
                        help="2: also the second turn of each MT-Bench prompt, asked after the verifier's own "
                        "greedy answer to the first (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--json", dest="json_file", default=None, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--drafters", default=None, metavar="LIST",
                        help="comma-separated drafters to compare in this run, e.g. model,ngram,hybrid, each with "
                        "--schedule / --predictor (default: the one --drafter names)")
    parser.add_argument("--methods", default=None, metavar="LIST",
                        help="comma-separated methods, each DRAFTER[:SCHEDULE[:PREDICTOR]][/K][+adaptive][@HOP_MS] "
                        "(K: draft length, or with +adaptive its cap), e.g. model:sequential,model:branch,"
                        "model:branch:paper,hybrid:branch/8+adaptive,model:branch@2 (@HOP_MS needs --transport "
                        "grpc); overrides --drafters")
    parser.add_argument("--transport", choices=("embedded", "grpc"), default="embedded",
                        help="embedded: everything in this process; grpc: the verifier and the drafter as "
                        "`specpipe serve` processes on loopback, each pinned to its own core (default: %(default)s)")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="do not pin to one CPU core per service (pinned by default)")
    parser.add_argument("--baselines", default="generate,generate-threads", metavar="LIST",
                        help="transformers runs beside specpipe's, on the same prompts: generate (the verifier "
                        "alone, eager, one thread: always run, the speed-up column is over it); on specpipe's weights "
                        "path (packed when it is) with a thread per core the pipeline uses: generate-threads (the "
                        "verifier alone), assisted (assisted generation with the same drafter), prompt-lookup "
                        "(at each --prompt-lookup-tokens) (default: %(default)s)")
    parser.add_argument("--prompt-lookup-tokens", type=_token_counts, default=(4, 10), metavar="N,N,...",
                        help="prompt lookup's prompt_lookup_num_tokens settings, one run each; the report takes "
                        "the best (default: 4,10)")
    parser.add_argument("--sweep", default=None, metavar="K,K,...",
                        help="run every method that does not name its /K or +adaptive at each fixed draft length K "
                        "and adaptive (at most the largest K), and report the best fixed setting against adaptive")
    report = parser.add_argument_group("report")
    report.add_argument("--report", nargs="+", default=None, metavar="FILE.json",
                        help="instead of benchmarking: the results section (summary over suites, a table per "
                        "suite, plots) from bench JSON files")
    report.add_argument("--readme", default=None, metavar="README.md",
                        help="with --report: replace the README's section between <!-- bench-report:begin --> and "
                        "<!-- bench-report:end --> (default: print it)")
    report.add_argument("--section", default=None, metavar="NAME",
                        help="with --readme: the section between <!-- bench-report:NAME:begin --> and "
                        "<!-- bench-report:NAME:end --> instead")
    report.add_argument("--plot-dir", default="bench-results/plots", metavar="DIR",
                        help="with --report: where the PNG plots go (default: %(default)s)")
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
    # A thread per core the process may use (after pinning); a method is adaptive unless it names a
    # fixed /K (or --adaptive off).
    parser.set_defaults(func=run, threads=0)


def _token_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected counts >= 1, e.g. 4,10; got {text!r}")
    return counts


def pipeline_cores(args: argparse.Namespace, methods: list, cores: list[int]) -> list[int]:
    """The cores the specpipe methods use (pinned: one per service that runs at once), which the
    equal-footing baselines get a thread each of."""
    if not args.pin:
        return cores
    services = 2 if args.transport == "grpc" or any(m.schedule == "branch" for m in methods) else 1
    return cores[:services]


def run(args: argparse.Namespace) -> int:
    from specpipe.bench.measure import benchmark, specpipe_method
    from specpipe.bench.report import detail_table, markdown_table, sweep_table, to_json
    from specpipe.bench.runs import (
        bench_prompts,
        embedded_generators,
        grpc_generators,
        own_generator,
        transformers_runs,
    )

    if args.forward_curve:
        return run_forward_curve(args)
    if args.report:
        return run_report(args)
    methods = parse_methods(args)
    compiled = forward_mode(model_config(vars(args))) != "eager"
    none = next((m for m in methods if m.drafter == "none"), None)
    if compiled and none is None:  # the compiled verifier alone: the compiled methods' baseline and yardstick
        none = Method("none", "sequential", args.predictor)
        methods.insert(0, none)
    if args.cache != "memory":
        raise InvalidArgument("bench gives each method a fresh in-memory n-gram store (so no method drafts from "
                              "outputs another learned); leave --cache at memory")
    baselines = parse_baselines(args.baselines)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []  # before any pinning
    with contextlib.ExitStack() as stack:
        if args.transport == "embedded":
            generators, models = embedded_generators(args, methods, baselines)
        else:
            generators, models = stack.enter_context(grpc_generators(args, methods, baselines))
        any_generator = next(iter(generators.values()))
        prompts, categories = bench_prompts(args, any_generator)
        runs = transformers_runs(args, baselines, any_generator.info.eos_token_ids, models, pipeline_cores(args, methods, cores))
        specs = {method: method.resolve(args) for method in methods}
        for spec in specs.values():
            generator = own_generator(generators[spec.hop_delay_ms], spec.drafter)
            runs[spec.name()] = specpipe_method(generator, args.max_new_tokens, spec.speculation())
        reference = specs[none].name() if compiled else None
        references = {spec.name(): reference for m, spec in specs.items() if reference and m is not none}
        by_name = {spec.name(): spec for spec in specs.values()}
        summaries = [replace(s, spec=by_name.get(s.method)) for s in benchmark(prompts, runs, references)]
    print(markdown_table(summaries))
    print()
    print(detail_table(summaries))
    if args.sweep:
        print()
        print(sweep_table(summaries))
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

        meta = {"preset": args.preset, "suite": args.prompts or args.suite, "limit": args.limit,
                "max_new_tokens": args.max_new_tokens,
                "threads": torch.get_num_threads(), "pinned": args.pin, "transport": args.transport,
                "compile": args.compile, "draft_weights": args.draft_weights, "models": any_generator.info.model_name,
                "cache": args.cache, "baselines": baselines, "sweep": args.sweep, "turns": args.turns,
                "categories": categories, **machine_info()}
        with open(args.json_file, "w") as f:
            json.dump(to_json(summaries, meta), f, indent=1)
    return 0 if ok else 1


def run_report(args: argparse.Namespace) -> int:
    import pathlib

    from specpipe.bench.report import replace_section, report

    for path in args.report:
        if not os.path.isfile(path):
            raise InvalidArgument(f"bench result {path} does not exist")
    readme = pathlib.Path(args.readme) if args.readme else None
    body = report(args.report, pathlib.Path(args.plot_dir), readme.parent if readme else pathlib.Path("."))
    if readme is None:
        print(body)
        return 0
    try:
        readme.write_text(replace_section(readme.read_text(), body, args.section))
    except ValueError as err:
        raise InvalidArgument(f"{readme}: {err}") from None
    print(f"{readme}: results section regenerated from {len(args.report)} bench file(s)")
    return 0


def run_forward_curve(args: argparse.Namespace) -> int:
    from specpipe.bench import curve
    from specpipe.bench.runs import pin
    from specpipe.engine.models import load_model
    from specpipe.engine.runner import Runner

    try:
        acceptances = [float(a) for a in args.acceptance.split(",") if a]
    except ValueError:
        acceptances = []
    if not acceptances or not all(0.0 <= a <= 1.0 for a in acceptances):
        raise InvalidArgument(f"--acceptance takes rates in [0, 1], got {args.acceptance!r}")
    if args.pin:
        pin(1)
    set_threads(args.threads or 1)
    model = model_config(vars(args))
    modes = ("eager", forward_mode(model)) if forward_mode(model) != "eager" else ("eager",)
    curves: dict[str, dict[int, float]] = {}
    for role, spec in zip(("verifier", "drafter"), model.specs()):
        runners = {}
        for mode in modes:  # a model each: packed changes its model in place
            runners[f"{role} {mode}"] = Runner(load_model(spec, model.device, model.torch_dtype), mode)
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
