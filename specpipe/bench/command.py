"""`specpipe bench`: every method on the same prompts in one run; the forward curve; the report
(the command's flags: specpipe.config.bench)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
from dataclasses import replace
from typing import TYPE_CHECKING

from specpipe.app.wiring import forward_mode, verifier_weights
from specpipe.bench import recurring_report
from specpipe.bench.methods import Method, parse_baselines, parse_methods, recurring
from specpipe.bench.prompts import RECURRING
from specpipe.config.bench import BenchConfig
from specpipe.core.errors import InvalidArgument
from specpipe.engine.cores import set_threads

if TYPE_CHECKING:
    from specpipe.bench.measure import MethodSummary


def bench(config: BenchConfig) -> int:
    """The forward curve, a report of earlier runs, or a bench run, as the config says."""
    if config.forward_curve:
        return run_forward_curve(config)
    if config.report:
        return run_report(config)
    return run(config)


def pipeline_cores(config: BenchConfig, methods: list, cores: list[int]) -> list[int]:
    """The cores the specpipe methods use (pinned: one per service that runs at once), which the
    equal-footing baselines get a thread each of."""
    if not config.pin:
        return cores
    services = 2 if config.transport == "grpc" or any(m.schedule == "branch" for m in methods) else 1
    return cores[:services]


def run(config: BenchConfig) -> int:
    from specpipe.bench.llamacpp import baseline_gguf, llama_cpp_references, llama_cpp_runs
    from specpipe.bench.measure import BASELINE, benchmark, specpipe_method
    from specpipe.bench.report import (
        cpu_table,
        detail_table,
        is_default,
        markdown_table,
        sweep_table,
        time_table,
        to_json,
    )
    from specpipe.bench.runs import (
        bench_prompts,
        embedded_generators,
        grpc_generators,
        own_generator,
        transformers_runs,
    )
    from specpipe.config.services import in_process_default, speculation

    methods = parse_methods(config)
    compiled = forward_mode(config.model) != "eager"
    none = next((m for m in methods if m.drafter == "none"), None)
    if compiled and none is None:  # the compiled verifier alone: the compiled methods' baseline and yardstick
        none = Method("none", "sequential", config.speculation.predictor)
        methods.insert(0, none)
    if config.generator.cache != "memory":
        raise InvalidArgument("bench gives each method a fresh in-memory n-gram store (so no method drafts from "
                              "outputs another learned); leave --cache at memory")
    baselines = parse_baselines(config.baselines)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []  # before any pinning
    gguf = baseline_gguf(config.model.specs()[0]) if "llama-cpp" in baselines else None
    with contextlib.ExitStack() as stack:
        if config.transport == "embedded":
            generators, models = embedded_generators(config, methods, baselines)
        else:
            generators, models = stack.enter_context(grpc_generators(config, methods, baselines))
        any_generator = next(iter(generators.values()))
        prompts, categories = bench_prompts(config, any_generator)
        baseline_cores = pipeline_cores(config, methods, cores)
        runs, references = transformers_runs(config, baselines, any_generator.info.eos_token_ids, models,
                                             baseline_cores)
        if gguf is not None:
            runs |= stack.enter_context(llama_cpp_runs(gguf, config.prompt_lookup_tokens, config.max_new_tokens,
                                                       any_generator.info.eos_token_ids, baseline_cores))
        specs = {method: method.resolve(config) for method in methods}
        for spec in specs.values():
            generator = own_generator(generators[spec.hop_delay_ms], spec.drafter, spec.learn_global)
            runs[spec.name()] = specpipe_method(generator, config.max_new_tokens, spec.speculation())
        reference = specs[none].name() if compiled and none is not None else None
        references |= {spec.name(): reference for m, spec in specs.items() if reference and m is not none}
        references |= llama_cpp_references(list(runs), reference or BASELINE)
        by_name = {spec.name(): spec for spec in specs.values()}
        default = in_process_default(config.model) if config.transport == "embedded" else \
            speculation({}, drafter_service=True)
        summaries = [replace(s, spec=by_name.get(s.method), default=is_default(by_name.get(s.method), default))
                     for s in benchmark(prompts, runs, references)]
    print(markdown_table(summaries))
    print()
    print(detail_table(summaries))
    print()
    print(time_table(summaries))
    print()
    print(cpu_table(summaries))
    if config.sweep:
        print()
        print(sweep_table(summaries))
    if recurring(config):
        print()
        print(recurring_report.markdown(summaries, categories))
    ok, verdict = lossless_check(summaries, set(references.values()))
    print(verdict)
    if reference:
        alone = next(s for s in summaries if s.method == reference)
        weights = verifier_weights(config.model)
        why = " (floating-point differences changed a greedy token)" if weights == "fp32" else \
            f" (its linear layers are {weights}: another model than the eager fp32 one)"
        print(f"compiled vs eager: the compiled verifier alone gave the eager generate() output on {alone.identical} "
              f"of {alone.prompts} prompts" + ("" if alone.identical == alone.prompts else why))
    if config.json_file:
        import torch

        meta = {"preset": config.model.preset, "suite": config.prompts or config.suite, "limit": config.limit,
                "max_new_tokens": config.max_new_tokens,
                "threads": torch.get_num_threads(), "pinned": config.pin, "transport": config.transport,
                "compile": config.model.compile, "draft_weights": config.model.draft_weights,
                "verifier_weights": verifier_weights(config.model), "models": any_generator.info.model_name,
                "cache": config.generator.cache, "baselines": baselines, "sweep": config.sweep, "turns": config.turns,
                "categories": categories, **machine_info()}
        data = to_json(summaries, meta)
        if recurring(config):
            data[RECURRING] = recurring_report.to_json(summaries, categories)
        with open(config.json_file, "w") as f:
            json.dump(data, f, indent=1)
    return 0 if ok else 1


def run_report(config: BenchConfig) -> int:
    import pathlib

    from specpipe.bench.report import replace_section, report

    paths = config.report or ()  # run for --report only
    for path in paths:
        if not os.path.isfile(path):
            raise InvalidArgument(f"bench result {path} does not exist")
    readme = pathlib.Path(config.readme) if config.readme else None
    plot_dir = pathlib.Path(config.plot_dir) if config.plot_dir else pathlib.Path(paths[0]).parent / "plots"
    body = report(paths, plot_dir, readme.parent if readme else pathlib.Path("."))
    if readme is None:
        print(body)
        return 0
    try:
        readme.write_text(replace_section(readme.read_text(), body, config.section))
    except ValueError as err:
        raise InvalidArgument(f"{readme}: {err}") from None
    print(f"{readme}: results section regenerated from {len(paths)} bench file(s)")
    return 0


def run_forward_curve(config: BenchConfig) -> int:
    from specpipe.bench import curve
    from specpipe.bench.runs import pin
    from specpipe.engine.models import load_model
    from specpipe.engine.runner import Runner, packed_on_load

    try:
        acceptances = [float(a) for a in config.acceptance.split(",") if a]
    except ValueError:
        acceptances = []
    if not acceptances or not all(0.0 <= a <= 1.0 for a in acceptances):
        raise InvalidArgument(f"--acceptance takes rates in [0, 1], got {config.acceptance!r}")
    if config.pin:
        pin(1)
    set_threads(config.model.threads or 1)  # the curve is of one thread unless --threads says otherwise
    model = config.model
    modes = ("eager", forward_mode(model)) if forward_mode(model) != "eager" else ("eager",)
    curves: dict[str, dict[int, float]] = {}
    for role, spec in zip(("verifier", "drafter"), model.specs()):
        runners = {}
        # a model each: packed changes its model in place; the verifier packed in bf16 and int8 too
        # (--verifier-weights)
        forwards = [(mode, "fp32") for mode in modes] + [("packed", "bf16"), ("packed", "int8")] * (
            role == "verifier" and "packed" in modes
        )
        for mode, weights in forwards:
            label = f"{role} {mode}" + (f" {weights}" if weights != "fp32" else "")
            loaded = load_model(spec, model.device, model.torch_dtype, packed_on_load(mode, weights))
            runners[label] = Runner(loaded, mode, weights=weights)
            runners[label].warm_up(progress=True)
        curves.update(curve.forward_curves(runners, desc=f"T(k) {role}"))
        del runners
    print(curve.curve_markdown(curves))
    bounds = {mode: curve.bounds_table(curves[f"verifier {mode}"], curves[f"drafter {mode.split()[0]}"][1], acceptances)
              for mode in (*modes, *(f"packed {w}" for w in ("bf16", "int8") if f"verifier packed {w}" in curves))}
    print()
    print(curve.bounds_markdown(bounds))
    if config.plot:
        curve.plot_curves(curves, config.plot)
    if config.json_file:
        import torch

        meta = {
            "preset": config.model.preset,
            "threads": torch.get_num_threads(),
            "pinned": config.pin,
            **machine_info(),
        }
        with open(config.json_file, "w") as f:
            json.dump(
                {
                    "meta": meta,
                    "curves": {label: {str(k): t for k, t in c.items()} for label, c in curves.items()},
                    "bounds": bounds,
                },
                f,
                indent=1,
            )
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


def lossless_check(summaries: list[MethodSummary], yardsticks: set[str]) -> tuple[bool, str]:
    """The bench's verdict: whether each specpipe method's outputs equal its verifier alone's (the claim),
    and the line that says so; where a transformers method's differ from its own generate() on the same
    weights, the line says that beside it. Yardsticks (each verifier alone: generate() on any weights,
    specpipe's compared with eager below) and llama.cpp (another computation) are left out."""
    from specpipe.bench.llamacpp import LLAMA_CPP
    from specpipe.bench.measure import BASELINE

    checked = [s for s in summaries
               if s.method not in yardsticks and not s.method.startswith((BASELINE, LLAMA_CPP))]
    ok = all(s.identical == s.prompts for s in checked if s.spec is not None)
    theirs = [f"{s.method} {s.identical}/{s.prompts}" for s in checked if s.spec is None and s.identical != s.prompts]
    verdict = "lossless check: every output is identical to the verifier-only output run the same way" if ok else \
        "LOSSLESS CHECK FAILED: some outputs differ from the verifier-only output run the same way"
    if theirs:
        verdict = verdict.replace("every output", "every specpipe output") + "; transformers' own speculation " + \
            f"is not lossless on these weights (outputs equal to its generate() on them: {', '.join(theirs)})"
    return ok, verdict
