"""What each service is told: one frozen, validated config per role (and per in-process generator),
and one function per config that builds it from a mapping of settings.

The mapping's keys are the flags' names (`--max-sessions` is max_sessions, `--limit-prompt-tokens`
limit_prompt_tokens): the CLI passes its parsed flags (vars(args)), the Ray application a role's
YAML args, tests a dict. A key left out, or None, takes the default, so a mapping says only what
differs (docs/cli.md, docs/ray.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from specpipe.config.limits import DEFAULT_HTTP, DEFAULT_LIMITS, HttpLimits, Limits
from specpipe.config.presets import DEFAULT_PRESET, PRESETS, ModelSpec, model_specs
from specpipe.core.errors import InvalidArgument
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
DRAFT_WEIGHTS = ("auto", "fp32", "bf16", "int8")
VERIFIER_WEIGHTS = ("fp32", "bf16")
DEFAULT_SPECULATION = SpeculationOptions()  # the product's defaults (specpipe.core.types)
GATHER_GRACE_SHARE = 0.5  # of a forward's predicted time: the longest a verifier forward waits for decoding sessions


def _choice(name: str, value: str, choices) -> None:
    if value not in choices:
        raise InvalidArgument(f"{name} {value!r}: choose from {', '.join(choices)}")


@dataclass(frozen=True)
class ModelConfig:
    """The models a process loads and how it runs them."""

    preset: str = DEFAULT_PRESET
    verifier: str | None = None      # a local model folder (or a locally cached model id) instead of the preset's
    draft_model: str | None = None
    device: str = "cpu"              # cpu, cuda, cuda:1, ...
    dtype: str = "auto"              # auto: bfloat16 on a GPU, float32 on a CPU
    threads: int = 0                 # torch threads; 0: one per core the process may use
    compile: str = "auto"            # the fast forward of the device (docs/compiled-forward.md)
    draft_weights: str = "auto"      # the drafter's packed weights (CPU kernel)
    verifier_weights: str = "fp32"   # the verifier's packed weights (CPU kernel)
    batching: bool = True            # all sessions' work in one forward (docs/batching.md)

    def __post_init__(self):
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

    max_batch_tokens: int = 512  # tokens per forward, all sessions together
    prefill_chunk: int = 256     # prompt tokens a prefill (drafter: a catch-up) feeds per forward
    max_queue: int = 64          # requests waiting for the model; beyond: RESOURCE_EXHAUSTED
    prefill_stall: float = 1.5   # beside decode steps, chunks keep a forward within this x their time; 0: off
    gather_grace: float = GATHER_GRACE_SHARE  # verifier: share of a forward's time it waits for decoding sessions; 0: off

    def __post_init__(self):
        for name in ("max_batch_tokens", "prefill_chunk", "max_queue"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.prefill_stall != 0 and self.prefill_stall <= 1:
            raise InvalidArgument(f"prefill_stall must be above 1 (or 0: off), got {self.prefill_stall}")
        if not 0 <= self.gather_grace <= 1:
            raise InvalidArgument(f"gather_grace must be in [0, 1], got {self.gather_grace}")


@dataclass(frozen=True)
class TlsFiles:
    """PEM files (docs/security.md): this side's certificate and key, and the CA peers chain to."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None


@dataclass(frozen=True)
class VerifierConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    max_sessions: int = 64
    batch: BatchConfig = field(default_factory=BatchConfig)
    limits: Limits = DEFAULT_LIMITS
    session_ttl_s: float = 600.0

    def __post_init__(self):
        _positive("max_sessions", self.max_sessions)
        _positive("session_ttl_s", self.session_ttl_s)


@dataclass(frozen=True)
class DrafterConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: str | None = None  # an n-gram store: with one, the drafter also serves the ngram and hybrid methods
    limits: Limits = DEFAULT_LIMITS
    session_ttl_s: float = 600.0
    tls: TlsFiles | None = None  # of its channel to a cache service

    def __post_init__(self):
        _positive("session_ttl_s", self.session_ttl_s)


@dataclass(frozen=True)
class CacheConfig:
    cache: str = "memory"
    limits: Limits = DEFAULT_LIMITS
    tls: TlsFiles | None = None


@dataclass(frozen=True)
class SeedConfig:
    """`specpipe cache seed`: text files into a shared store's learned store (a corpus), tokenized with
    the verifier's tokenizer (specpipe.app.seed)."""

    files: tuple[str, ...] = ()
    cache: str = ""                  # redis://..., rediss://... or grpc://host:port
    preset: str = DEFAULT_PRESET
    verifier: str | None = None      # overrides the preset's verifier (its tokenizer)
    tenant: str = ""
    chunk_tokens: int = 4096         # tokens per store call (one Redis round trip, a bounded Lua run)
    timeout: float = 30.0            # seconds per store call


@dataclass(frozen=True)
class OrchestratorConfig:
    """The public Generation API over remote verifier and drafter replicas (on Ray: deployment handles,
    and no addresses)."""

    verifier_addr: str = ""
    drafter_addr: str | None = None
    model: ModelConfig = field(default_factory=ModelConfig)  # the verifier's tokenizer
    speculation: SpeculationOptions = DEFAULT_SPECULATION
    cache: str = "memory"
    rpc_timeout_s: float | None = 60.0
    connect_timeout_s: float = 600.0
    hop_delay_ms: float = 0.0
    limits: Limits = DEFAULT_LIMITS
    learn_global: bool = True  # finished outputs feed their tenant's learned store (docs/security.md)
    tls: TlsFiles | None = None
    max_sessions: int = 64
    max_queue: int = 64
    http: HttpLimits = DEFAULT_HTTP  # the OpenAI-compatible API's bounds on its clients

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
    cache: str = "memory"

    @property
    def model(self) -> ModelConfig:
        return self.verifier.model


@dataclass(frozen=True)
class UpConfig:
    """`specpipe up`: the services as local processes (specpipe.app.topology)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    base_port: int = 50051           # 0 = free ports
    http_port: int | None = 8000     # the orchestrator's OpenAI-compatible API; None: off, 0: a free one
    threads_per_service: int = 1
    pin: bool = False
    startup_timeout_s: float = 300.0
    log_dir: Path = Path(".")
    log_level: str = "INFO"
    speculation: tuple[str, ...] = ()  # orchestrator flags: --drafter ... --schedule ... --hop-delay-ms ...
    cache: str = "memory"            # memory, redis (a local redis-server) or a store URL
    verifiers: int = 1               # replicas (one process each); the orchestrator routes over them
    drafters: int = 1
    drain_timeout_s: float = 30.0
    tls: bool = False                # a private CA: mutual TLS between the services, TLS on the public port
    verifier_flags: tuple[str, ...] = ()  # more `serve verifier` flags (batching, admission)

    def __post_init__(self):
        if self.verifiers < 1 or self.drafters < 1:
            raise InvalidArgument("--verifiers and --drafters must be >= 1")


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise InvalidArgument(f"{name} must be > 0, got {value}")


# --- from a mapping of settings (flags' names) ------------------------------------------------

def _given(values: Mapping[str, Any], cls, prefix: str = "") -> dict:
    """The settings of values that are fields of cls (named prefix + field), None left out."""
    return {f.name: values[prefix + f.name] for f in fields(cls) if values.get(prefix + f.name) is not None}


def model_config(values: Mapping[str, Any]) -> ModelConfig:
    given = _given(values, ModelConfig)
    if isinstance(given.get("batching"), str):
        given["batching"] = given["batching"] == "on"
    return ModelConfig(**given)


def batch_config(values: Mapping[str, Any]) -> BatchConfig:
    return BatchConfig(**_given(values, BatchConfig))


def limits_config(values: Mapping[str, Any]) -> Limits:
    """The input caps: limit_<field> (--limit-prompt-tokens for max_prompt_tokens, ...)."""
    given = {f.name: values[f"limit_{f.name}"] for f in fields(Limits) if values.get(f"limit_{f.name}") is not None}
    try:
        return Limits(**{**{f.name: getattr(DEFAULT_LIMITS, f.name) for f in fields(Limits)}, **given})
    except ValueError as err:
        raise InvalidArgument(str(err)) from None


def http_limits(values: Mapping[str, Any]) -> HttpLimits:
    """The HTTP API's bounds: http_<field> (--http-header-timeout for header_timeout_s, ...)."""
    try:
        return HttpLimits(**_given(values, HttpLimits, "http_"))
    except ValueError as err:
        raise InvalidArgument(str(err)) from None


def tls_files(values: Mapping[str, Any]) -> TlsFiles | None:
    given = _given(values, TlsFiles, "tls_")
    return TlsFiles(**given) if given else None


def in_process_default(model: ModelConfig) -> SpeculationOptions:
    """The product's speculation in one process with these models: the defaults, drafting with
    DRAFTER_WITH_MODEL where the drafter is a separate small model (not the verifier's own first layers)."""
    own_model = model.specs()[1].num_layers is None
    return replace(DEFAULT_SPECULATION, drafter=DRAFTER_WITH_MODEL) if own_model else DEFAULT_SPECULATION


def speculation(values: Mapping[str, Any], drafter_service: bool = False, in_process: bool = False) -> SpeculationOptions:
    """draft_len alone fixes the depth; adaptive alone, or neither, chooses it up to a cap. A drafter
    left out: DRAFTER_WITH_MODEL where a drafter service drafts (drafter_service, as on Ray, or a
    drafter_addr given); in_process, in_process_default's; else the n-gram default."""
    draft_len, adaptive = values.get("draft_len"), values.get("adaptive")
    adaptive = adaptive or ("off" if draft_len is not None else DEFAULT_SPECULATION.adaptive)
    draft_len = draft_len or (DEFAULT_SPECULATION.draft_len if adaptive == "on" else FIXED_DRAFT_LEN)
    served = drafter_service or bool(values.get("drafter_addr"))
    drafter = (DRAFTER_WITH_MODEL if served else in_process_default(model_config(values)).drafter if in_process
               else DEFAULT_SPECULATION.drafter)
    hypotheses = values.get("hypotheses") or DEFAULT_SPECULATION.hypotheses
    if hypotheses == "all":
        hypotheses = ALL_HYPOTHESES
    options = SpeculationOptions(
        drafter=values.get("drafter") or drafter,
        draft_len=draft_len, width=values.get("width") or DEFAULT_SPECULATION.width,
        schedule=values.get("schedule") or DEFAULT_SPECULATION.schedule,
        predictor=values.get("predictor") or DEFAULT_SPECULATION.predictor, hypotheses=int(hypotheses),
        adaptive=adaptive)
    for name, value, choices in (("drafter", options.drafter, DRAFTER_KINDS), ("schedule", options.schedule, SCHEDULES),
                                 ("predictor", options.predictor, PREDICTORS), ("adaptive", options.adaptive, ADAPTIVE)):
        _choice(name, value, choices)
    return options


def verifier_config(values: Mapping[str, Any]) -> VerifierConfig:
    return VerifierConfig(model_config(values), values.get("max_sessions") or 64, batch_config(values),
                          limits_config(values), values.get("session_ttl") or 600.0)


def drafter_config(values: Mapping[str, Any]) -> DrafterConfig:
    return DrafterConfig(model_config(values), values.get("cache"), limits_config(values),
                         values.get("session_ttl") or 600.0, tls_files(values))


def cache_config(values: Mapping[str, Any]) -> CacheConfig:
    return CacheConfig(values.get("cache") or "memory", limits_config(values), tls_files(values))


def orchestrator_config(values: Mapping[str, Any], drafter_service: bool = False) -> OrchestratorConfig:
    """drafter_service: a drafter service drafts whatever the drafter_addr says (the Ray application)."""
    rpc_timeout = values.get("rpc_timeout", 60.0)
    return OrchestratorConfig(
        verifier_addr=values.get("verifier_addr") or "", drafter_addr=values.get("drafter_addr"),
        model=model_config(values), speculation=speculation(values, drafter_service),
        cache=values.get("cache") or "memory", rpc_timeout_s=rpc_timeout or None,
        connect_timeout_s=values.get("connect_timeout") or 600.0, hop_delay_ms=values.get("hop_delay_ms") or 0.0,
        limits=limits_config(values), learn_global=values.get("learn_global", True) in ("on", True),
        tls=tls_files(values), max_sessions=values.get("max_sessions") or 64, max_queue=values.get("max_queue") or 64,
        http=http_limits(values))


def seed_config(values: Mapping[str, Any]) -> SeedConfig:
    given = _given(values, SeedConfig)
    return SeedConfig(**{**given, "files": tuple(given.get("files", ()))})


def generator_config(values: Mapping[str, Any]) -> GeneratorConfig:
    return GeneratorConfig(verifier_config(values), speculation(values, in_process=True), values.get("cache") or "memory")


# --- the settings each role takes (the Ray application's YAML keys) ----------------------------

_MODEL = frozenset(f.name for f in fields(ModelConfig))
_LIMITS = frozenset(f"limit_{f.name}" for f in fields(Limits))
_TLS = frozenset(f"tls_{f.name}" for f in fields(TlsFiles))
_SPECULATION = frozenset(("drafter", "draft_len", "width", "schedule", "predictor", "hypotheses", "adaptive"))
SETTINGS = {
    "verifier": _MODEL | _LIMITS | {f.name for f in fields(BatchConfig)} | {"max_sessions", "session_ttl"},
    "drafter": _MODEL | _LIMITS | _TLS | {"cache", "session_ttl"},
    "orchestrator": _MODEL | _LIMITS | _TLS | _SPECULATION | {
        "cache", "rpc_timeout", "learn_global", "max_sessions", "max_queue", "http_request_timeout_s"},
}


def check_settings(role: str, values: Mapping[str, Any]) -> None:
    """Refuse settings the role does not take (a typo in a YAML file would otherwise pass silently)."""
    unknown = sorted(set(values) - SETTINGS[role])
    if unknown:
        raise InvalidArgument(f"unknown {role} settings {unknown}; a {role} takes {', '.join(sorted(SETTINGS[role]))}")
