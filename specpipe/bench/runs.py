"""`specpipe bench`: the generators, models and prompts a run needs, set up as the flags say."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from specpipe.app.wiring import drafter_forward, forward_mode, verifier_weights
from specpipe.bench.methods import STORE_DRAFTERS, Method
from specpipe.config.bench import BenchConfig
from specpipe.core.errors import InvalidArgument

if TYPE_CHECKING:
    from orchestrator.generator import Generator
    from specpipe.bench.measure import MethodRun


@dataclass(frozen=True)
class BaselineModels:
    """What the transformers baselines run on: eager is the verifier in eager fp32 (the one-core row);
    verifier and drafter are on specpipe's weights path (packed when specpipe's are, the drafter in
    its --draft-weights), so that a baseline differs from specpipe only in how it decodes."""

    eager: object
    verifier: object
    drafter: object | None = None


def transformers_runs(config: BenchConfig, baselines: list[str], eos: Sequence[int], models: BaselineModels,
                      cores: list[int]) -> tuple[dict[str, MethodRun], dict[str, str]]:
    """The transformers methods of baselines, in this process, and what each one's outputs must equal.
    The first is the baseline (eager, one thread on one core). The others run on specpipe's weights
    path with a thread per core the pipeline uses (cores); their yardstick is generate() on the same
    weights where it runs (generate-threads): a packed verifier in other weights than fp32 is another
    model than the eager one."""
    from specpipe.bench.measure import BASELINE, transformers_method

    runs = {
        BASELINE: transformers_method(models.eager, config.max_new_tokens, eos, threads=lambda: all_cores(cores[:1]))
    }
    path, threads = forward_mode(config.model), lambda: all_cores(cores)
    weights = verifier_weights(config.model) if path == "packed" else "fp32"
    where = f"{len(cores)} threads, {path}" + (f" {weights}" if weights != "fp32" else "")
    plain = f"verifier-only generate(), {where}"
    if "generate-threads" in baselines:
        runs[plain] = transformers_method(models.verifier, config.max_new_tokens, eos, threads=threads)
    if "assisted" in baselines:
        runs[f"transformers assisted generation, {where}"] = transformers_method(
            models.verifier, config.max_new_tokens, eos, threads=threads, plain=False, assistant_model=models.drafter)
    if "prompt-lookup" in baselines:
        for tokens in config.prompt_lookup_tokens:
            runs[f"transformers prompt lookup ({tokens} tokens), {where}"] = transformers_method(
                models.verifier, config.max_new_tokens, eos, threads=threads, plain=False,
                prompt_lookup_num_tokens=tokens)
    references = {method: plain for method in runs if method not in (BASELINE, plain)} if plain in runs else {}
    return runs, references


@contextlib.contextmanager
def all_cores(cores: list[int]) -> Iterator[None]:
    """Run on every core this process was started with, one torch thread each, then go back."""
    import torch

    threads, pinned = torch.get_num_threads(), os.sched_getaffinity(0) if cores else None
    try:
        if cores:
            os.sched_setaffinity(0, set(cores))
        torch.set_num_threads(max(1, len(cores)))
        yield
    finally:
        torch.set_num_threads(threads)
        if pinned is not None:
            os.sched_setaffinity(0, pinned)


def bench_prompts(config: BenchConfig,
                  generator: Generator) -> tuple[list[tuple[str, tuple[int, ...]]], dict[str, str]]:
    """[(prompt id, token ids)] to benchmark, and the category of each prompt that has one. With
    --turns 2, each prompt's second turn follows: its first turn is answered once, here, by
    generator (any lossless method gives the verifier's own greedy answer)."""
    from tqdm import tqdm

    from specpipe.bench.prompts import load_prompts_file, load_suite, second_turn
    from specpipe.core.types import GenerationRequest

    prompts = (
        load_prompts_file(config.prompts, config.limit) if config.prompts else load_suite(config.suite, config.limit)
    )
    if config.turns == 2:
        firsts = [p for p in prompts if p.followup]
        if not firsts:
            raise InvalidArgument("--turns 2 needs prompts with a second turn (the mtbench suite)")
        spec = config.speculation
        if spec.drafter not in ("none", *generator.drafters):  # one this run's generator has
            spec = replace(spec, drafter=next(iter(generator.drafters), "none"))
        for prompt in tqdm(firsts, desc="answering first turns"):
            request = GenerationRequest(generator.encode(messages=prompt.messages), config.max_new_tokens,
                                        speculation=spec)
            prompts.append(second_turn(prompt, "".join(chunk.text for chunk in generator.generate(request))))
    return ([(p.id, generator.encode(messages=p.messages)) for p in prompts],
            {p.id: p.category for p in prompts if p.category})


def pin(cores: int) -> None:
    """Pin this process to its first `cores` allowed cores (one per service that runs at once)."""
    if hasattr(os, "sched_setaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, set(allowed[:cores]))


def embedded_generators(
    config: BenchConfig, methods: list[Method], baselines: list[str]
) -> tuple[dict, BaselineModels]:
    """One in-process generator (by hop delay: 0) and the baselines' models: the generator's own
    (packed in place when compiled), and an eager copy of the verifier when they are packed. With a
    branch schedule the drafter and the verifier run at once, so the process gets a core for each."""
    from specpipe.app.wiring import embedded_generator

    if config.pin:
        pin(2 if any(m.schedule == "branch" for m in methods) else 1)
    kinds = {m.drafter for m in methods} | ({"model"} if "assisted" in baselines else set())
    generator = embedded_generator(config.generator, tuple(kinds))
    verifier = generator.verifier.model  # type: ignore[attr-defined]  # embedded: the ModelVerifier's model
    drafter = generator.drafters["model"].model if "model" in generator.drafters else None  # type: ignore[attr-defined]
    eager = verifier if forward_mode(config.model) == "eager" else _load(config, 0)
    return {0.0: generator}, BaselineModels(eager, verifier, drafter)


def _load(config: BenchConfig, role: int, weights: str | None = None) -> Any:
    """The verifier (role 0) or the drafter (1) of the model flags, eager, or packed in weights."""
    from specpipe.engine.models import load_model

    model_config = config.model
    model = load_model(model_config.specs()[role], model_config.device, model_config.torch_dtype, weights)
    if weights is not None:
        from specpipe.engine import native
        from specpipe.engine.runner import PACKED_WEIGHTS

        native.pack_linears(model, PACKED_WEIGHTS[weights])
    return model


@contextlib.contextmanager
def grpc_generators(config: BenchConfig, methods: list[Method],
                    baselines: list[str]) -> Iterator[tuple[dict[float, Generator], BaselineModels]]:
    """`specpipe serve verifier` and `serve drafter` processes on loopback (each pinned to its own
    core with --pin), and one orchestrator in this process per hop delay; and the baseline's model,
    which runs here, on the verifier's core."""
    import pathlib
    import tempfile

    from specpipe.app import topology
    from specpipe.app.wiring import remote_generator
    from specpipe.config.services import OrchestratorConfig, UpConfig
    from specpipe.engine.cores import set_threads

    model = replace(config.model, batching=True)
    up = UpConfig(model=model, base_port=0, threads_per_service=1, pin=config.pin,
                  startup_timeout_s=3600.0 if forward_mode(model) == "graphs" else 600.0,
                  log_dir=pathlib.Path(tempfile.mkdtemp(prefix="specpipe-bench-")), log_level="WARNING")
    cores = topology.service_cores(up, ("verifier", "drafter"))
    children = []
    try:
        for role in ("verifier", "drafter"):
            children.append(topology.start_service(role, up, cores.get(role), ()))
        for child in children:
            topology.wait_serving(child, up.startup_timeout_s, threading.Event())
        if "verifier" in cores:
            os.sched_setaffinity(0, {cores["verifier"]})
        set_threads(1)
        generators = {hop: remote_generator(OrchestratorConfig(
                          verifier_addr=children[0].address, drafter_addr=children[1].address, model=model,
                          speculation=config.speculation, hop_delay_ms=hop))
                      for hop in sorted({m.hop_delay_ms for m in methods})}
        yield generators, grpc_baseline_models(config, baselines)
    finally:
        topology.stop_all(children[::-1])


def grpc_baseline_models(config: BenchConfig, baselines: list[str]) -> BaselineModels:
    """The baselines' models, loaded here (the services hold theirs): an eager verifier, and where
    specpipe's weights are packed, a packed copy (and a packed drafter for assisted generation)."""
    eager = _load(config, 0)
    packed = forward_mode(config.model) == "packed"
    verifier = _load(config, 0, verifier_weights(config.model)) if packed and len(baselines) > 1 else eager
    drafter = None
    if "assisted" in baselines:
        drafter = _load(config, 1, drafter_forward(config.model)["weights"] if packed else None)
    return BaselineModels(eager, verifier, drafter)


def own_generator(generator: Generator, kind: str, learn_global: bool) -> Generator:
    """A method's own generator over the generator's models, so that no method learns from another's
    runs: fresh adaptive estimates and branch predictor calibration, and for the drafters of kind
    that read one, a new, empty in-memory n-gram store, shared by the method's prompts, which learns
    each finished output if learn_global."""
    from cache_service.memory import InMemoryNgramCache
    from orchestrator.generator import Generator
    from specpipe.app.wiring import build_drafters

    if kind not in STORE_DRAFTERS:
        return Generator(generator.tokenizer, generator.verifier, generator.drafters, generator.defaults,
                         generator.cache, learn_global=False, shared_cores=generator.shared_cores)
    store = InMemoryNgramCache()
    drafters = build_drafters((kind,), store, generator.drafters.get("model"), generator.info)
    return Generator(generator.tokenizer, generator.verifier, drafters, generator.defaults, store,
                     learn_global=learn_global, shared_cores=generator.shared_cores)
