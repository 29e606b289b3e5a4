"""What each service is told: one frozen, validated config per role (and per in-process generator),
and one function per config that builds it from a mapping of settings.

Each default is written once, here (and in specpipe.config.limits, specpipe.core.types), beside its
help text (specpipe.core.settings): the CLI's flags are built from these fields, the Ray YAML and the
Kubernetes args are checked against them (tests/test_settings.py). The mapping's keys are the flags'
names (`--max-sessions` is max_sessions; an input cap's is limit_ and its field, limit_max_prompt_tokens
for `--limit-prompt-tokens`): the CLI passes its parsed flags (vars(args)), the Ray application a
role's YAML args, tests a dict. A key left out, or None, takes the default, so a mapping says only
what differs (docs/cli.md, docs/ray.md); a zero is a zero, or refused where it means nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from specpipe.config.limits import DEFAULT_LIMITS, HTTP_PREFIX, LIMIT_PREFIX, HttpLimits, Limits
from specpipe.config.presets import DEFAULT_PRESET, PRESETS, ModelSpec, model_specs
from specpipe.core import settings
from specpipe.core.errors import InvalidArgument
from specpipe.core.settings import setting
from specpipe.core.types import (
    ADAPTIVE,
    ALL_HYPOTHESES,
    DRAFTER_KINDS,
    DRAFTER_WITH_MODEL,
    FIXED_DRAFT_LEN,
    PREDICTORS,
    SCHEDULES,
    SpeculationOptions,
)

DTYPES = ("auto", "float32", "bfloat16")
COMPILE = ("auto", "off", "on")
DRAFT_WEIGHTS = ("auto", "fp32", "bf16", "int8", "w8a8")
VERIFIER_WEIGHTS = ("auto", "fp32", "bf16", "int8", "w8a8", "w4a8")
ON_OFF = ("on", "off")  # the choices of a bool setting's flag
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_SPECULATION = SpeculationOptions()  # the product's defaults (specpipe.core.types)
GATHER_GRACE_SHARE = 0.5  # of a forward's predicted time: the longest a verifier forward waits for decoding sessions
SESSION_TTL_S = 600.0  # the verifier's and the drafter's: an idle session's lifetime
DRAIN_TIMEOUT_S = 30.0  # a service's drain on SIGTERM (`serve` and each of `up`'s)
TLS_PREFIX = "tls_"  # a TLS file's key in a mapping of settings: tls_cert (--tls-cert)
METRICS_OFFSET = 100  # `specpipe up`: a service's metrics port is its gRPC port + this
MODEL_PATH_HELP = ("local model folder, or a model id in the local Hugging Face cache, of the {role} (overrides "
                   "the preset)")


def _choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise InvalidArgument(f"{name} {value!r}: choose from {', '.join(choices)}")


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise InvalidArgument(f"{name} must be > 0, got {value}")


def _session_ttl() -> Any:
    return setting(SESSION_TTL_S, "a session idle this long is evicted by a background sweeper, its KV cache freed "
                   "(clients that went away without releasing)", key="session_ttl", metavar="S")


def _store(default: str | None = "memory") -> Any:
    """The n-gram store a process drafts from and feeds (--cache)."""
    return setting(default, "n-gram store: memory (this process), redis (`specpipe up` only: starts a local "
                   "redis-server), redis://[:password@]host:port/db, rediss://... (TLS) or grpc://host:port (a "
                   "cache service); all but memory are shared by every replica", env="SPECPIPE_CACHE",
                   metavar="URL")


def _learn_global() -> Any:
    return setting(True, "on: finished outputs feed their tenant's learned store, which drafts for the tenant's "
                   "later requests (one tenant is one trust domain); off: it holds `specpipe cache seed` corpora "
                   "only, so no output ever drafts for another request: for endpoints whose users must not learn "
                   "about each other", choices=("off", "on"), shown="on; docs/security.md")


def _cost_model() -> Any:
    return setting(None, "hold every forward to the time a recorded device's curve gives for its shape: a load "
                   "test's simulated device (a curve file, a GPU record, or a packaged curve's name such as "
                   "nvidia-h200-qwen-coder; NAME:xN scales its times by N). Real compute that takes longer keeps its "
                   "time and is counted; never for serving", metavar="CURVE", shown="off; docs/pipeline.md")


def _preset() -> Any:
    return setting(DEFAULT_PRESET, "model pair", env="SPECPIPE_PRESET", choices=tuple(sorted(PRESETS)))


@dataclass(frozen=True)
class ModelConfig:
    """The models a process loads and how it runs them."""

    preset: str = _preset()
    verifier: str | None = setting(None, MODEL_PATH_HELP.format(role="verifier"), shown="")
    draft_model: str | None = setting(None, MODEL_PATH_HELP.format(role="drafter"), shown="")
    device: str = setting("cpu", "torch device, e.g. cpu, cuda, cuda:1")
    dtype: str = setting("auto", "the models' weights and activations; auto: bfloat16 on a GPU, float32 on a CPU "
                         "(where bf16 is no faster)", choices=DTYPES)
    threads: int = setting(0, "torch threads per process; 0: one per core the process may use", shown="all cores")
    compile: str = setting(  # the fast forward of the device (docs/compiled-forward.md)
        "auto", "fast forward passes, chosen by --device. CPU: every linear layer runs a small-M GEMM kernel "
        "built for this CPU with the C compiler (once, cached) over weights packed at load; CUDA: CUDA graphs "
        "over bucketed shapes (batched and one-session forwards), captured at start-up (seconds). auto: the CPU "
        "kernel when a C compiler is there, else eager; the graphs on CUDA; on: always (an error without a "
        "compiler); off: eager", choices=COMPILE)
    draft_weights: str = setting(
        "auto", "the weights of the drafter's packed linear layers (CPU kernel only): bf16 streams half the bytes "
        "per token, int8 (a scale per output feature) a quarter, with fp32 arithmetic; w8a8: int8 weights times "
        "int8 activations (a scale per 64 features of a token) in integer dot products; they change what the "
        "drafter proposes, never what is emitted (the verifier's weights are --verifier-weights). auto: int8 when "
        "the CPU kernel runs, else fp32", choices=DRAFT_WEIGHTS)
    verifier_weights: str = setting(
        "auto", "the weights of the verifier's packed linear layers (CPU kernel only): bf16 streams half the bytes "
        "per token, int8 (a scale per output feature) a quarter, with fp32 arithmetic; w8a8: int8 weights times "
        "int8 activations in integer dot products, attention row by row (batching on); w4a8: as w8a8 on the GGUF's "
        "own 4-bit Q4_K blocks (its other layers, and a model not read from GGUF, in Q4_K rounded at load); each "
        "but fp32 changes the model: the output is then that verifier's own greedy decoding (lossless against it, "
        "not against transformers' fp32 output, which fp32 keeps). auto: w4a8 where the CPU kernel runs with "
        "batching on, else fp32",
        choices=VERIFIER_WEIGHTS)
    batching: bool = setting(
        True, "on: the verifier (and the model drafter) run the work of all their sessions as one forward "
        "(docs/batching.md); off: one session per forward, as before batching (to compare)", choices=ON_OFF)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise InvalidArgument(f"unknown preset {self.preset!r}; choose from {', '.join(PRESETS)}")
        _choice("dtype", self.dtype, DTYPES)
        _choice("compile", self.compile, COMPILE)
        _choice("draft_weights", self.draft_weights, DRAFT_WEIGHTS)
        _choice("verifier_weights", self.verifier_weights, VERIFIER_WEIGHTS)
        if self.threads < 0:
            raise InvalidArgument(f"threads must be >= 0 (0: one per core), got {self.threads}")

    @property
    def on_cpu(self) -> bool:
        return self.device.split(":")[0] == "cpu"

    @property
    def torch_dtype(self) -> str:
        """float32 or bfloat16: auto is bfloat16 on a GPU, float32 on a CPU (where bf16 is no faster)."""
        if self.dtype != "auto":
            return self.dtype
        return "float32" if self.on_cpu else "bfloat16"

    def specs(self) -> tuple[ModelSpec, ModelSpec]:
        """(verifier, drafter) of the preset, with --verifier / --draft-model taking precedence."""
        return model_specs(self.preset, self.verifier, self.draft_model)


@dataclass(frozen=True)
class BatchConfig:
    """How a verifier (or model drafter) gathers its sessions' work into one forward (docs/batching.md)."""

    max_batch_tokens: int = setting(512, "tokens per batched verifier forward, all sessions together")
    prefill_chunk: int = setting(  # drafter: the prompt tokens of a catch-up per forward
        256, "prompt tokens a prefill feeds per forward, so a long prompt never stalls other sessions' rounds for "
        "more than one chunk")
    max_queue: int = setting(64, "requests waiting for the model; beyond: RESOURCE_EXHAUSTED")
    prefill_stall: float = setting(
        1.5, "while other sessions decode, prompt chunks are cut so a forward takes at most X times as long as "
        "their rounds alone (steered by the measured forward times), keeping their inter-token latency while a "
        "long prompt is admitted; a higher X admits the prompt sooner; 0 = chunks of --prefill-chunk",
        metavar="X")
    gather_grace: float = setting(
        GATHER_GRACE_SHARE, "while sessions decode, a forward first waits up to this share of its predicted time "
        "(2-50 ms) for their rounds that are not in yet and are due back (their round ended within the longest of "
        "recent turnarounds), so they share one forward instead of splitting into groups that each pay one; a "
        "lone session never waits; 0 = dispatch at once", metavar="SHARE")

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "prefill_chunk", "max_queue"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.prefill_stall != 0 and self.prefill_stall <= 1:
            raise InvalidArgument(f"prefill_stall must be above 1 (or 0: off), got {self.prefill_stall}")
        if not 0 <= self.gather_grace <= 1:
            raise InvalidArgument(f"gather_grace must be in [0, 1], got {self.gather_grace}")


@dataclass(frozen=True)
class AdmissionConfig:
    """The orchestrator's admission of Generate streams (orchestrator.admission)."""

    max_sessions: int = setting(64, "generations running at once; beyond: a queue, then RESOURCE_EXHAUSTED "
                                "before any work")
    max_queue: int = setting(64, "generations waiting for a slot; beyond: RESOURCE_EXHAUSTED; 0 = none wait")

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.max_queue < 0:
            raise InvalidArgument(f"max_sessions must be >= 1 and max_queue >= 0, got {self.max_sessions}, "
                                  f"{self.max_queue}")


@dataclass(frozen=True)
class TracingConfig:
    """Distributed traces (OpenTelemetry; docs/observability.md): off by default, at no cost. On, a
    process exports spans through the exporters the standard OTEL_* variables name (OTEL_TRACES_EXPORTER:
    otlp, console or none; OTEL_EXPORTER_OTLP_ENDPOINT, ...) and --trace-file's."""

    enabled: bool = setting(False, "export OpenTelemetry traces: one trace per generation, a span per round and "
                            "its hops (the `otel` extra; exporters from the OTEL_* variables)", key="tracing",
                            env="SPECPIPE_TRACING", choices=ON_OFF, shown="off; docs/observability.md")
    trace_ratio: float = setting(
        1.0, "with tracing on, the share of generations traced (a client's W3C traceparent decides for its own "
        "request); the verifier and drafter follow the orchestrator's choice", env="SPECPIPE_TRACE_RATIO",
        metavar="R")
    trace_file: str | None = setting(
        None, "also write every finished span as one JSON line to FILE (appended; several processes may share "
        "one); without OTEL_TRACES_EXPORTER it is the only exporter", metavar="FILE", shown="none")

    def __post_init__(self) -> None:
        if not 0.0 <= self.trace_ratio <= 1.0:
            raise InvalidArgument(f"trace_ratio must be in [0, 1], got {self.trace_ratio}")


@dataclass(frozen=True)
class TlsFiles:
    """PEM files (docs/security.md): this side's certificate and key, and the CA peers chain to."""

    cert: str | None = setting(None, "this service's certificate: served over TLS, and presented to peers for "
                               "mutual TLS", env="SPECPIPE_TLS_CERT", metavar="PEM", shown="plaintext")
    key: str | None = setting(None, "the private key of --tls-cert", env="SPECPIPE_TLS_KEY", metavar="PEM", shown="")
    ca: str | None = setting(None, "CA that peers' certificates must chain to; a server given one requires client "
                             "certificates (mutual TLS)", env="SPECPIPE_TLS_CA", metavar="PEM", shown="")


@dataclass(frozen=True)
class VerifierConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    max_sessions: int = setting(64, "sessions open at once; beyond: RESOURCE_EXHAUSTED before any work")
    batch: BatchConfig = field(default_factory=BatchConfig)
    limits: Limits = DEFAULT_LIMITS
    session_ttl_s: float = _session_ttl()
    cost_model: str | None = _cost_model()
    replay: str | None = setting(
        None, "answer from a recorded transcript of the model's greedy decoding (`specpipe transcript record`) "
        "instead of running it: the real model's acceptance at --cost-model's speed, without its weights; greedy "
        "requests on the recorded prompts only", metavar="FILE", shown="off; docs/pipeline.md")
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def __post_init__(self) -> None:
        _positive("max_sessions", self.max_sessions)
        _positive("session_ttl_s", self.session_ttl_s)


@dataclass(frozen=True)
class DrafterConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: str | None = setting(  # with one, the drafter also serves the ngram and hybrid methods
        None, "n-gram store: memory, redis://..., rediss://... or grpc://host:port. A drafter given one also serves "
        "the ngram and hybrid draft methods; it must be the store the orchestrator feeds", env="SPECPIPE_CACHE",
        metavar="URL")
    limits: Limits = DEFAULT_LIMITS
    session_ttl_s: float = _session_ttl()
    tls: TlsFiles | None = None  # of its channel to a cache service
    cost_model: str | None = _cost_model()  # the model drafter's forwards
    replay: str | None = setting(
        None, "the small model drafts from a recorded transcript's drafter table (`specpipe transcript record`) "
        "instead of running: its drafts at --cost-model's speed, without its weights; greedy requests on the "
        "recorded prompts only (a transcript without the table: the model runs)", metavar="FILE",
        shown="off; docs/pipeline.md")
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def __post_init__(self) -> None:
        _positive("session_ttl_s", self.session_ttl_s)


@dataclass(frozen=True)
class CacheConfig:
    cache: str = setting("memory", "the store to serve", metavar="URL")
    limits: Limits = DEFAULT_LIMITS
    tls: TlsFiles | None = None
    tracing: TracingConfig = field(default_factory=TracingConfig)


@dataclass(frozen=True)
class SeedConfig:
    """`specpipe cache seed`: text files into a shared store's learned store (a corpus), tokenized with
    the verifier's tokenizer (specpipe.app.seed)."""

    files: tuple[str, ...] = ()
    cache: str = setting(  # redis://..., rediss://... or grpc://host:port
        "", "the shared store: redis://[:password@]host:port/db, rediss://..., redis+cluster://host:port or "
        "grpc://host:port (memory is refused: the seed would die with this process)", env="SPECPIPE_CACHE",
        metavar="URL", shown="")
    preset: str = setting(DEFAULT_PRESET, "whose verifier's tokenizer to use", env="SPECPIPE_PRESET",
                          choices=tuple(sorted(PRESETS)))
    verifier: str | None = setting(None, MODEL_PATH_HELP.format(role="verifier"), shown="")
    tenant: str = setting("", "seed this tenant's learned store (docs/security.md, \"Tenants\")", metavar="ID",
                          shown="the default tenant's")
    chunk_tokens: int = setting(  # tokens per store call (one Redis round trip, a bounded Lua run)
        4096, "tokens per store call: each chunk is a document, overlapping the previous one by 32 tokens",
        metavar="N")
    timeout: float = setting(30.0, "seconds per store call", metavar="S")


@dataclass(frozen=True)
class OrchestratorConfig:
    """The public Generation API over remote verifier and drafter replicas (on Ray: deployment handles,
    and no addresses)."""

    verifier_addr: str = setting(
        "", "the verifier replicas (required): host:port, a comma list, or dns:///name:port (a headless Service, "
        "re-resolved as replicas come and go)", env="SPECPIPE_VERIFIER_ADDR", shown="")
    drafter_addr: str | None = setting(
        None, "the drafter replicas, same forms as --verifier-addr; without it only --drafter none works",
        env="SPECPIPE_DRAFTER_ADDR", shown="")
    model: ModelConfig = field(default_factory=ModelConfig)  # the verifier's tokenizer
    speculation: SpeculationOptions = DEFAULT_SPECULATION
    cache: str = _store()
    rpc_timeout_s: float = setting(
        60.0, "deadline of each verifier / drafter call in seconds; a Prefill has the client's deadline only (its "
        "time grows with the prompt and the load)", key="rpc_timeout", metavar="S")
    connect_timeout_s: float = setting(600.0, "how long to wait at start for the verifier (loading its model)",
                                       key="connect_timeout", metavar="S")
    hop_delay_ms: float = setting(
        0.0, "add MS of latency to each direction of every gRPC call to the verifier and drafter, to measure how "
        "well a schedule hides network latency on loopback", metavar="MS", shown="off")
    limits: Limits = DEFAULT_LIMITS
    learn_global: bool = _learn_global()  # finished outputs feed their tenant's learned store (docs/security.md)
    tls: TlsFiles | None = None
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    http: HttpLimits = field(default_factory=HttpLimits)  # the OpenAI-compatible API's bounds on its clients
    tracing: TracingConfig = field(default_factory=TracingConfig)
    ttft_slo_ms: float = setting(
        2000.0, "the time-to-first-token objective: exported as specpipe_ttft_slo_ms, which the dashboard draws and "
        "the TTFT alert compares the p99 with (deploy/k8s/components/monitoring)", metavar="MS")

    def __post_init__(self) -> None:
        _positive("rpc_timeout_s", self.rpc_timeout_s)
        _positive("connect_timeout_s", self.connect_timeout_s)
        _positive("ttft_slo_ms", self.ttft_slo_ms)
        if self.hop_delay_ms < 0:
            raise InvalidArgument(f"hop_delay_ms must be >= 0, got {self.hop_delay_ms}")

    def check_peers(self) -> None:
        """The addresses a gRPC orchestrator needs (checked before anything heavy loads)."""
        if not self.verifier_addr:
            raise InvalidArgument("--verifier-addr is required: the orchestrator needs a running verifier service "
                                  "(host:port, e.g. from `specpipe serve verifier`)")
        if self.speculation.drafter in ("model", "hybrid") and not self.drafter_addr:
            raise InvalidArgument(f"--drafter-addr is required with --drafter {self.speculation.drafter}; pass "
                                  "--drafter ngram or none to draft without the small model")


@dataclass(frozen=True)
class GeneratorConfig:
    """Everything in one process (`specpipe generate`, the bench): the verifier, the drafters the
    speculation needs, and the n-gram store."""

    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    speculation: SpeculationOptions = DEFAULT_SPECULATION
    cache: str = _store()
    tracing: TracingConfig = field(default_factory=TracingConfig)

    @property
    def model(self) -> ModelConfig:
        return self.verifier.model


@dataclass(frozen=True)
class ServeConfig:
    """`specpipe serve ROLE`: where one service listens, how it logs and how it stops (its role's
    config says what it serves)."""

    host: str = setting("127.0.0.1", "address to bind; 0.0.0.0 in a container", env="SPECPIPE_HOST")
    port: int = setting(0, "gRPC port; 0 = a free one")  # `specpipe serve` gives each role its own
    metrics_port: int | None = setting(None, "Prometheus HTTP port; 0 = a free one", shown="off")
    health_port: int | None = setting(
        None, "also serve the health service alone here, in plaintext, for probes that speak no TLS (Kubernetes' "
        "gRPC probes); 0 = a free one", env="SPECPIPE_HEALTH_PORT", shown="off")
    max_workers: int = setting(64, "concurrent RPCs; each Generate stream holds one")
    drain_timeout_s: float = setting(
        DRAIN_TIMEOUT_S, "on SIGTERM: health NOT_SERVING, new sessions refused, running calls get this long to "
        "finish", key="drain_timeout", env="SPECPIPE_DRAIN_TIMEOUT", metavar="S")
    log_level: str = setting("INFO", "", choices=LOG_LEVELS)
    log_format: str = setting("json", "", choices=("json", "text"))
    reflection: bool = setting(False, "serve gRPC reflection", shown="off")
    auth_token_file: str | None = setting(  # the orchestrator's
        None, "require 'authorization: Bearer <the file's token>' on the Generation API; UNAUTHENTICATED otherwise",
        env="SPECPIPE_AUTH_TOKEN_FILE", metavar="FILE", shown="no token")
    http_port: int | None = setting(  # the orchestrator's
        None, "also serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
        "/health) on this port, with the same TLS files and token; 0 = a free one", metavar="PORT",
        shown="off; docs/http-api.md")

    def __post_init__(self) -> None:
        if self.max_workers < 1:
            raise InvalidArgument(f"max_workers must be >= 1, got {self.max_workers}")
        if self.drain_timeout_s < 0:
            raise InvalidArgument(f"drain_timeout must be >= 0, got {self.drain_timeout_s}")


@dataclass(frozen=True)
class UpConfig:
    """`specpipe up`: the services as local processes (specpipe.app.topology)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    base_port: int = setting(50051, "gRPC ports N (orchestrator), N+1 (verifier), N+2 (drafter), metrics ports "
                             f"N+{METRICS_OFFSET}..; 0 = free ports")
    http_port: int | None = setting(  # None: off, 0: a free one
        8000, "the orchestrator's OpenAI-compatible HTTP API (docs/http-api.md); 0 = a free one, -1 = off; with "
        "--base-port 0 a free one")
    threads_per_service: int = setting(1, "torch threads per service")
    pin: bool = setting(  # the verifiers and drafters first, the orchestrator where a core is left
        False, "pin each service to its own CPU core when there are enough: the model services (verifiers and "
        "drafters) first, the orchestrator (which runs no model) only where a core is left, so a 2-core host "
        "pins the verifier and the drafter; fewer cores than model services: no pinning")
    startup_timeout_s: float = setting(300.0, "", key="startup_timeout", metavar="S")
    log_dir: Path = setting(Path("."), "where the services' stdout / stderr go", shown="a temp dir")
    log_level: str = setting("INFO", "", choices=LOG_LEVELS)
    speculation: tuple[str, ...] = ()  # orchestrator flags: --drafter ... --schedule ... --hop-delay-ms ...
    cache: str = _store()            # memory, redis (a local redis-server) or a store URL
    verifiers: int = setting(  # replicas (one process each); the orchestrator routes over them
        1, "verifier replicas; each session is pinned to the least loaded", metavar="N")
    drafters: int = setting(1, "drafter replicas", metavar="M")
    orchestrators: int = setting(  # replicas sharing the verifiers and drafters, as behind a Service
        1, "orchestrator replicas, each its own process over the same verifiers and drafters (more Python for "
        "one GPU verifier: docs/pipeline.md); give them a shared --cache (redis) to share what the store learns",
        metavar="K")
    drain_timeout_s: float = setting(DRAIN_TIMEOUT_S, "each service's drain on SIGTERM", key="drain_timeout",
                                     metavar="S")
    tls: bool = setting(  # a private CA: mutual TLS between the services, TLS on the public port
        False, "generate a private CA and certificates (in the log dir): mutual TLS between the services, TLS on the "
        "public port, rediss:// to --cache redis")
    verifier_flags: tuple[str, ...] = setting(  # more `serve verifier` flags (batching, admission)
        (), "more `specpipe serve verifier` flags for every verifier replica, e.g. \"--max-batch-tokens 1024 "
        "--gather-grace 0\"", metavar="FLAGS", shown="")
    cost_model: str | None = _cost_model()  # every verifier's and drafter's
    replay: str | None = setting(None, "every verifier answers from this transcript, and every drafter's small model "
                                 "drafts from its drafter table (`specpipe serve verifier|drafter --replay`)",
                                 metavar="FILE", shown="off; docs/pipeline.md")
    tracing: TracingConfig = field(default_factory=TracingConfig)  # every service's

    def __post_init__(self) -> None:
        if self.verifiers < 1 or self.drafters < 1 or self.orchestrators < 1:
            raise InvalidArgument("--verifiers, --drafters and --orchestrators must be >= 1")
        _positive("startup_timeout", self.startup_timeout_s)


# --- from a mapping of settings (flags' names) ------------------------------------------------

def given_settings(values: Mapping[str, Any], cls: type, prefix: str = "") -> dict[str, Any]:
    """The settings of values that are fields of cls (by prefix + each field's key), None left out; a
    bool setting given as its flag's on / off is that bool."""
    given = settings.given(values, cls, prefix)
    for f in fields(cls):
        if f.name in given and f.type == "bool" and isinstance(given[f.name], str):
            given[f.name] = _on(f.name, given[f.name])
    return given


def _on(name: str, value: str) -> bool:
    if value not in ON_OFF:
        raise InvalidArgument(f"{name} {value!r}: choose from on, off")
    return value == "on"


def model_config(values: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**given_settings(values, ModelConfig))


def batch_config(values: Mapping[str, Any]) -> BatchConfig:
    return BatchConfig(**given_settings(values, BatchConfig))


def admission_config(values: Mapping[str, Any]) -> AdmissionConfig:
    return AdmissionConfig(**given_settings(values, AdmissionConfig))


def limits_config(values: Mapping[str, Any]) -> Limits:
    """The input caps: limit_<field> (--limit-prompt-tokens for max_prompt_tokens, ...)."""
    try:
        return Limits(**given_settings(values, Limits, LIMIT_PREFIX))
    except ValueError as err:
        raise InvalidArgument(str(err)) from None


def http_limits(values: Mapping[str, Any]) -> HttpLimits:
    """The HTTP API's bounds: http_<key> (--http-header-timeout for header_timeout_s, ...)."""
    try:
        return HttpLimits(**given_settings(values, HttpLimits, HTTP_PREFIX))
    except ValueError as err:
        raise InvalidArgument(str(err)) from None


def tracing_config(values: Mapping[str, Any]) -> TracingConfig:
    return TracingConfig(**given_settings(values, TracingConfig))


def tls_files(values: Mapping[str, Any]) -> TlsFiles | None:
    given = given_settings(values, TlsFiles, TLS_PREFIX)
    return TlsFiles(**given) if given else None


def in_process_default(model: ModelConfig) -> SpeculationOptions:
    """The product's speculation in one process with these models: the defaults, drafting with
    DRAFTER_WITH_MODEL where the drafter is a separate small model (not the verifier's own first layers)."""
    own_model = model.specs()[1].num_layers is None
    return replace(DEFAULT_SPECULATION, drafter=DRAFTER_WITH_MODEL) if own_model else DEFAULT_SPECULATION


def default_drafter(values: Mapping[str, Any], drafter_service: bool = False, in_process: bool = False) -> str:
    """The drafter left out: DRAFTER_WITH_MODEL where a drafter service drafts (drafter_service, as on
    Ray, or a drafter_addr given); in_process, in_process_default's; else the n-gram default."""
    if drafter_service or values.get("drafter_addr"):
        return DRAFTER_WITH_MODEL
    return in_process_default(model_config(values)).drafter if in_process else DEFAULT_SPECULATION.drafter


def speculation(
    values: Mapping[str, Any], drafter_service: bool = False, in_process: bool = False
) -> SpeculationOptions:
    """draft_len alone fixes the depth (0: no drafts); adaptive alone, or neither, chooses it up to a cap.
    A drafter left out: default_drafter's. A zero width or hypotheses count is refused, never replaced."""
    given = given_settings(values, SpeculationOptions)
    if given.get("adaptive") is None:
        given["adaptive"] = "off" if "draft_len" in given else DEFAULT_SPECULATION.adaptive
    if "draft_len" not in given and given["adaptive"] == "off":
        given["draft_len"] = FIXED_DRAFT_LEN
    given.setdefault("drafter", default_drafter(values, drafter_service, in_process))
    if given.get("hypotheses") == "all":
        given["hypotheses"] = ALL_HYPOTHESES
    options = SpeculationOptions(**given)
    for name, value, choices in (
        ("drafter", options.drafter, DRAFTER_KINDS),
        ("schedule", options.schedule, SCHEDULES),
        ("predictor", options.predictor, PREDICTORS),
        ("adaptive", options.adaptive, ADAPTIVE),
    ):
        _choice(name, value, choices)
    options = replace(options, hypotheses=int(options.hypotheses))
    if options.draft_len < 0 or options.width < 1:
        raise InvalidArgument(f"draft_len must be >= 0 and width >= 1, got {options.draft_len} and {options.width}")
    if options.hypotheses < 1 and options.hypotheses != ALL_HYPOTHESES:
        raise InvalidArgument(f"hypotheses must be >= 1 or all, got {options.hypotheses}")
    return options


def verifier_config(values: Mapping[str, Any]) -> VerifierConfig:
    return VerifierConfig(model=model_config(values), batch=batch_config(values), limits=limits_config(values),
                          tracing=tracing_config(values), **given_settings(values, VerifierConfig))


def drafter_config(values: Mapping[str, Any]) -> DrafterConfig:
    return DrafterConfig(model=model_config(values), limits=limits_config(values), tls=tls_files(values),
                         tracing=tracing_config(values), **given_settings(values, DrafterConfig))


def cache_config(values: Mapping[str, Any]) -> CacheConfig:
    return CacheConfig(limits=limits_config(values), tls=tls_files(values), tracing=tracing_config(values),
                       **given_settings(values, CacheConfig))


def orchestrator_config(values: Mapping[str, Any], drafter_service: bool = False) -> OrchestratorConfig:
    """drafter_service: a drafter service drafts whatever the drafter_addr says (the Ray application)."""
    return OrchestratorConfig(
        model=model_config(values), speculation=speculation(values, drafter_service), limits=limits_config(values),
        tls=tls_files(values), admission=admission_config(values), http=http_limits(values),
        tracing=tracing_config(values),
        **given_settings(values, OrchestratorConfig))


def serve_config(values: Mapping[str, Any]) -> ServeConfig:
    return ServeConfig(**given_settings(values, ServeConfig))


def seed_config(values: Mapping[str, Any]) -> SeedConfig:
    return SeedConfig(files=tuple(values.get("files") or ()), **given_settings(values, SeedConfig))


def generator_config(values: Mapping[str, Any]) -> GeneratorConfig:
    return GeneratorConfig(verifier_config(values), speculation(values, in_process=True),
                           tracing=tracing_config(values), **given_settings(values, GeneratorConfig))


# --- the settings each role takes (the Ray application's YAML keys) ----------------------------

def _keys(cls: type, prefix: str = "") -> frozenset[str]:
    return frozenset(prefix + key for key in settings.settings_of(cls))


_PEERS = frozenset(("verifier_addr", "drafter_addr", "connect_timeout", "hop_delay_ms"))  # on Ray: handles
_MODEL, _LIMITS, _TLS = _keys(ModelConfig), _keys(Limits, LIMIT_PREFIX), _keys(TlsFiles, TLS_PREFIX)
_TRACING = _keys(TracingConfig)
SETTINGS = {
    "verifier": _MODEL | _LIMITS | _TRACING | _keys(BatchConfig) | _keys(VerifierConfig),
    "drafter": _MODEL | _LIMITS | _TLS | _TRACING | _keys(DrafterConfig),
    "orchestrator": (_MODEL | _LIMITS | _TLS | _TRACING | _keys(SpeculationOptions) | _keys(AdmissionConfig)
                     | _keys(OrchestratorConfig) - _PEERS
                     | {HTTP_PREFIX + "request_timeout"}),  # on Ray the HTTP server is Serve's proxy: its own bounds
}


def check_settings(role: str, values: Mapping[str, Any]) -> None:
    """Refuse settings the role does not take (a typo in a YAML file would otherwise pass silently)."""
    unknown = sorted(set(values) - SETTINGS[role])
    if unknown:
        raise InvalidArgument(f"unknown {role} settings {unknown}; a {role} takes {', '.join(sorted(SETTINGS[role]))}")
