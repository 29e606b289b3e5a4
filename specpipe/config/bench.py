"""The configs of `specpipe bench` (what runs, on which models and prompts, reported where) and of
`specpipe loadtest` (docs/cli.md, docs/load.md), built from the commands' flags by bench_config and
loadtest_config (the keys are the flags' names, as in specpipe.config.services)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specpipe.config.presets import PRESETS
from specpipe.config.services import (
    GeneratorConfig,
    ModelConfig,
    TlsFiles,
    generator_config,
    given_settings,
    tls_files,
)
from specpipe.core.settings import setting
from specpipe.core.types import SpeculationOptions

SUITE_PROMPTS = 20  # `specpipe loadtest` (and the locustfile): prompts per suite unless --prompt-limit says
BENCH_SUITES = ("humaneval", "mtbench", "gsm8k", "random", "noise", "recurring")


@dataclass(frozen=True)
class BenchConfig:
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)  # models, speculation, store
    draft_len: int | None = None          # --draft-len as given (None: each method's own, else the default)
    hop_delay_ms: float = 0.0
    suite: str = setting(
        "humaneval", "prompt suite; random: made-up words to continue (the models copy them, so drafts are good); "
        "noise: random base64, random passwords and poems of random words in mixed scripts (poor drafts with "
        "--preset smollm2; qwen-coder copies and repeats, so its drafts still land); recurring: requests from "
        "HumanEval, MT-Bench and GSM8K that recur, in order (30% repeat an earlier request, 40% an earlier one's "
        "template with other numbers, names or identifiers, 30% unique), each drafting method run with its store "
        "learning finished outputs and not, beside the verifier alone, reported by kind", choices=BENCH_SUITES)
    prompts: str | None = setting(  # a JSONL file of prompts instead of the suite
        None, "your own prompts instead of --suite: one JSON object a line, {\"prompt\": ...} or {\"messages\": "
        "[{\"role\", \"content\"}, ...]}, optional \"id\"", metavar="FILE.jsonl", shown="")
    limit: int = setting(10, "prompts from the suite; MT-Bench takes its categories in turn; recurring: requests in "
                         "the sequence")
    turns: int = setting(1, "2: also the second turn of each MT-Bench prompt, asked after the verifier's own greedy "
                         "answer to the first", choices=(1, 2))
    max_new_tokens: int = setting(128, "")
    json_file: str | None = setting(None, "write the results as JSON", key="json", metavar="FILE", shown="")
    drafters: str | None = setting(  # comma list: one method each, with the schedule and predictor flags
        None, "comma-separated drafters to compare in this run, e.g. model,ngram,hybrid, each with --schedule / "
        "--predictor", metavar="LIST", shown="the one --drafter names")
    methods: str | None = setting(  # comma list of DRAFTER[:SCHEDULE[:PREDICTOR]][/K][+adaptive][@HOP_MS]
        None, "comma-separated methods, each DRAFTER[:SCHEDULE[:PREDICTOR]][/K][+adaptive][+learn|+no-learn]"
        "[@HOP_MS] (K: draft length, or with +adaptive its cap; +learn / +no-learn: the method's n-gram store "
        "learns each finished output or not; default: the orchestrator's default, and with --suite recurring "
        "both), e.g. model:sequential,model:branch,model:branch:paper,hybrid:branch/8+adaptive,model:branch@2 "
        "(@HOP_MS needs --transport grpc); overrides --drafters", metavar="LIST", shown="")
    transport: str = setting(
        "embedded", "embedded: everything in this process; grpc: the verifier and the drafter as `specpipe serve` "
        "processes on loopback, each pinned to its own core", choices=("embedded", "grpc"))
    pin: bool = setting(True, "do not pin to one CPU core per service (pinned by default)")
    baselines: str = setting(
        "generate,generate-threads", "transformers runs beside specpipe's, on the same prompts: generate (the "
        "verifier alone, eager, one thread: always run, the speed-up column is over it); on specpipe's weights "
        "path (packed when it is) with a thread per core the pipeline uses: generate-threads (the verifier alone), "
        "assisted (assisted generation with the same drafter), prompt-lookup (at each --prompt-lookup-tokens); "
        "llama-cpp: llama.cpp's plain greedy decoding and its prompt lookup (at each --prompt-lookup-tokens) on the "
        "verifier's GGUF file, a thread per core the pipeline uses (llama-cpp-python: the llama extra)",
        metavar="LIST")
    prompt_lookup_tokens: tuple[int, ...] = setting(
        (4, 10), "prompt lookup's draft tokens a round (transformers' prompt_lookup_num_tokens, llama-cpp-python's "
        "num_pred_tokens), one run each; the report takes the best",
        metavar="N,N,...", shown="4,10")
    sweep: str | None = setting(
        None, "run every method that does not name its /K or +adaptive at each fixed draft length K and adaptive "
        "(at most the largest K), and report the best fixed setting against adaptive", metavar="K,K,...", shown="")
    report: tuple[str, ...] | None = setting(  # bench JSON files to report instead of benchmarking
        None, "instead of benchmarking: the results section (summary over suites, a table per suite, plots) from "
        "bench JSON files", metavar="FILE.json", shown="")
    readme: str | None = setting(
        None, "with --report: replace the README's section between <!-- bench-report:begin --> and "
        "<!-- bench-report:end -->", metavar="README.md", shown="print it")
    section: str | None = setting(
        None, "with --readme: the section between <!-- bench-report:NAME:begin --> and <!-- bench-report:NAME:end "
        "--> instead", metavar="NAME", shown="")
    plot_dir: str | None = setting(None, "with --report: where the PNG plots go", metavar="DIR",
                                   shown="plots/ in the first FILE.json's folder")
    forward_curve: bool = setting(
        False, "instead of decoding prompts: measure T(k), one forward of k new tokens after a 300-token context, "
        "for the verifier and the drafter, eager and (with --compile on) compiled, and the speed-up bounds it "
        "implies")
    acceptance: str = setting(
        "0.99,0.72,0.42", "per-token acceptance rates to compute bounds for", metavar="LIST",
        shown="the model drafter's measured HumanEval, GSM8K and MT-Bench rates, 0.99,0.72,0.42")
    plot: str | None = setting(None, "write the curves as a PNG plot", metavar="PNG", shown="")

    @property
    def model(self) -> ModelConfig:
        return self.generator.model

    @property
    def speculation(self) -> SpeculationOptions:
        return self.generator.speculation


def bench_config(values: Mapping[str, Any]) -> BenchConfig:
    given = given_settings(values, BenchConfig)
    if "report" in given:
        given["report"] = tuple(given["report"])
    plain = {name: values[name] for name in ("draft_len", "hop_delay_ms") if values.get(name) is not None}
    return BenchConfig(generator_config(values), **plain, **given)


@dataclass(frozen=True)
class LoadtestConfig:
    """`specpipe loadtest`: Locust against a server (--addr) or against `specpipe up`s it starts
    (docs/load.md). Built from the loadtest's flags by loadtest_config."""

    addr: str | None = setting(  # None: start `specpipe up`
        None, "HOST:PORT of an orchestrator, or with --api openai the URL of its HTTP API",
        shown="start `specpipe up`")
    api: str = setting("grpc", "the API the users call: the Generate RPC, or the OpenAI-compatible "
                       "/v1/chat/completions with server-sent events (docs/http-api.md)", choices=("grpc", "openai"))
    preset: str = setting("tiny", "without --addr: the model pair of the `specpipe up` started", env="SPECPIPE_PRESET",
                          choices=tuple(sorted(PRESETS)))
    up_args: tuple[str, ...] = setting(  # "[LABEL[:DRAFTER,...]=]FLAGS" each
        (), "without --addr: more `specpipe up` flags, e.g. \"--pin\". Repeat it to compare servers in one run, "
        "each labelled, e.g. --up-args \"unbatched:default=--batching off --pin\" --up-args \"batched=--pin\": each "
        "is started, loaded with every --drafter (or those after LABEL:, comma-separated), and stopped",
        metavar="[LABEL=]FLAGS", shown="")
    startup_timeout: float = setting(600.0, "", metavar="S")
    shape: str = setting(  # constant, or one of specpipe.bench.loadshapes.SHAPES
        "steps", "steps: each of --levels held --hold-s; ramp / spike over the same span; constant: --users for "
        "--run-time")
    levels: str = setting("1,2,4,8,16", "user counts")
    hold_s: float = setting(30.0, "seconds per level")
    users: int = setting(4, "constant: users")
    load_processes: int = setting(
        1, "Locust processes generating the load (Locust's --processes: its workers, the users split evenly among "
        "them): one Python process's CPU caps the load it makes near 3,000 plainly decoded tokens a second, so a "
        "faster server needs several; every user count must be a multiple of it", metavar="N")
    run_time: float = setting(60.0, "constant: seconds", metavar="S")
    workload: str = setting(  # suite: the --suite prompts; recurring: specpipe.bench.recurring
        "suite", "suite: the --suite prompts in turn; recurring: a sequence from HumanEval, MT-Bench and GSM8K where "
        "about 30% of the requests repeat an earlier one, 40% take an earlier one's template with other values and "
        "30% are unique, and without --addr every server twice, its n-gram store learning finished outputs off and "
        "on (--learn-global off / on), compared")
    suite: str = setting("mix", "mix: code, chat and math in turn")
    prompt_limit: int | None = setting(  # None: the default of the suite or of the recurring sequence
        None, "prompts per suite; with --workload recurring, requests in the sequence (after them it starts again)")
    max_new_tokens: int = setting(64, "", env="SPECPIPE_MAX_NEW_TOKENS")
    deadline_s: float = setting(120.0, "client deadline per call")
    temperature: float = setting(0.0, "0 = greedy")
    top_p: float = setting(1.0, "")
    seed: int = setting(0, "")
    drafter: str = setting(  # comma list: one run each ("default": the server's)
        "default", "per-request drafter, comma-separated for one run each: model, ngram, hybrid, none (speculation "
        "off) or default (the server's)")
    draft_len: int = setting(0, "0 = the server's (the API's empty field)")
    width: int = setting(0, "0 = the server's (the API's empty field)")
    schedule: str = setting("", "sequential or branch; empty = the server's", shown="")
    adaptive: str = setting("", "on or off; empty = the server's", shown="")
    itl_events: str = setting(
        "chunk", "Locust's own itl entries: token (one event per token), chunk (one a chunk: the load generator's "
        "CPU per token is a fraction, what a load at GPU speed needs) or off; the tables come from the request "
        "records either way", choices=("token", "chunk", "off"))
    tls: TlsFiles | None = None           # the client's, towards addr
    auth_token_file: str | None = None
    slo: str = setting("", "goodput SLOs: ttft=MS,itl=MS (ITL: a request's mean)", shown="")
    out: str | None = setting(None, "folder for Locust's CSV / HTML and the request records", shown="a temp dir")
    json: bool = setting(False, "print the summary as JSON")
    report: str | None = setting(None, "write the comparison into this Markdown file's generated section, plots into "
                                 "<its folder>/load/<its name>-*.png", metavar="MD", shown="")
    memory_every: float = setting(0.0, "without --addr: sample the services' resident memory every S seconds "
                                  "(0 = off)", metavar="S", shown="")
    from_run: str | None = setting(
        None, "instead of a load run: the tables (and --report) from the request records of an earlier run's --out "
        "folder, described by that run's own flags (--slo, given, replaces its SLOs), e.g. after a change to the "
        "statistics", metavar="DIR", shown="")
    warmup_s: float = setting(30.0, "memory samples before this are warm-up")
    argv: tuple[str, ...] = ()            # the flags as given, without --from-run: the run's command

    @property
    def drafters(self) -> list[str]:
        return [d.strip() for d in self.drafter.split(",") if d.strip()]


def loadtest_config(values: Mapping[str, Any]) -> LoadtestConfig:
    given = given_settings(values, LoadtestConfig)
    if "up_args" in given:
        given["up_args"] = tuple(given["up_args"])
    return LoadtestConfig(tls=tls_files(values), auth_token_file=values.get("auth_token_file"),
                          argv=tuple(values.get("argv") or ()), **given)
