"""The configs of `specpipe bench` (what runs, on which models and prompts, reported where) and of
`specpipe loadtest` (docs/cli.md, docs/load.md), built from the commands' flags by bench_config and
loadtest_config (the keys are the flags' names, as in specpipe.config.services)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specpipe.config.services import GeneratorConfig, TlsFiles, generator_config, tls_files


@dataclass(frozen=True)
class BenchConfig:
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)  # models, speculation, store
    draft_len: int | None = None          # --draft-len as given (None: each method's own, else the default)
    hop_delay_ms: float = 0.0
    suite: str = "humaneval"
    prompts: str | None = None            # a JSONL file of prompts instead of the suite
    limit: int = 10
    turns: int = 1
    max_new_tokens: int = 128
    json_file: str | None = None
    drafters: str | None = None           # comma list: one method each, with the schedule and predictor flags
    methods: str | None = None            # comma list of DRAFTER[:SCHEDULE[:PREDICTOR]][/K][+adaptive][@HOP_MS]
    transport: str = "embedded"
    pin: bool = True
    baselines: str = "generate,generate-threads"
    prompt_lookup_tokens: tuple[int, ...] = (4, 10)
    sweep: str | None = None
    report: tuple[str, ...] | None = None  # bench JSON files to report instead of benchmarking
    readme: str | None = None
    section: str | None = None
    plot_dir: str = "bench-results/plots"
    forward_curve: bool = False
    acceptance: str = "0.99,0.72,0.42"
    plot: str | None = None

    @property
    def model(self):
        return self.generator.model

    @property
    def speculation(self):
        return self.generator.speculation


def bench_config(values: Mapping[str, Any]) -> BenchConfig:
    given = {name: values[name] for name in BenchConfig.__dataclass_fields__
             if name != "generator" and values.get(name) is not None}
    if "report" in given:
        given["report"] = tuple(given["report"])
    return BenchConfig(generator_config(values), **given)


@dataclass(frozen=True)
class LoadtestConfig:
    """`specpipe loadtest`: Locust against a server (--addr) or against `specpipe up`s it starts
    (docs/load.md). Built from the loadtest's flags by loadtest_config."""

    addr: str | None = None               # an orchestrator (or with api openai, its HTTP API); None: start up
    api: str = "grpc"                     # grpc or openai
    preset: str = "tiny"
    up_args: tuple[str, ...] = ()         # "[LABEL[:DRAFTER,...]=]FLAGS" each
    startup_timeout: float = 600.0
    shape: str = "steps"                  # constant, or one of specpipe.bench.loadshapes.SHAPES
    levels: str = "1,2,4,8,16"
    hold_s: float = 30.0
    users: int = 4
    run_time: float = 60.0
    workload: str = "suite"               # suite: the --suite prompts; recurring: specpipe.bench.recurring
    suite: str = "mix"
    prompt_limit: int | None = None       # prompts per suite, or the recurring sequence's requests (None: the default)
    max_new_tokens: int = 64
    deadline_s: float = 120.0
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    drafter: str = "default"              # comma list: one run each ("default": the server's)
    draft_len: int = 0                    # 0 / "": the server's
    width: int = 0
    schedule: str = ""
    adaptive: str = ""
    tls: TlsFiles | None = None           # the client's, towards addr
    auth_token_file: str | None = None
    slo: str = ""                         # ttft=MS,itl=MS
    out: str | None = None
    json: bool = False
    report: str | None = None
    memory_every: float = 0.0
    from_run: str | None = None
    warmup_s: float = 30.0
    argv: tuple[str, ...] = ()            # the flags as given, without --from-run: the run's command

    @property
    def drafters(self) -> list[str]:
        return [d.strip() for d in self.drafter.split(",") if d.strip()]


def loadtest_config(values: Mapping[str, Any]) -> LoadtestConfig:
    given = {name: values[name] for name in LoadtestConfig.__dataclass_fields__
             if name != "tls" and values.get(name) is not None}
    for name in ("up_args", "argv"):
        if name in given:
            given[name] = tuple(given[name])
    return LoadtestConfig(tls=tls_files(values), **given)
