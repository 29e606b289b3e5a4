"""`specpipe bench`'s config: what runs, on which models and prompts, reported where (docs/cli.md).
Built from the bench's flags by bench_config (the keys are the flags' names, as in
specpipe.config.services)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specpipe.config.services import GeneratorConfig, generator_config


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
