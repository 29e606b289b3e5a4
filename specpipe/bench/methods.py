"""`specpipe bench` methods: what --methods, --drafters, --sweep and --baselines name, and the
recurring suite's learning on and off."""

from __future__ import annotations

from dataclasses import dataclass, replace

from specpipe.app.wiring import forward_mode
from specpipe.bench.measure import MethodSpec
from specpipe.bench.prompts import RECURRING
from specpipe.config.bench import BenchConfig
from specpipe.config.services import OrchestratorConfig
from specpipe.core.errors import InvalidArgument
from specpipe.core.types import ADAPTIVE_DRAFT_LEN, DRAFTER_KINDS, FIXED_DRAFT_LEN, PREDICTORS, SCHEDULES

STORE_DRAFTERS = ("ngram", "hybrid")  # the drafters that read the n-gram store, and so what it learned
LEARNING = {"learn": True, "no-learn": False}  # +learn / +no-learn: the store learns finished outputs, or not


def default_learning() -> bool:
    """Whether a server's store learns finished outputs unless told (the orchestrator's default)."""
    return OrchestratorConfig.learn_global


@dataclass(frozen=True)
class Method:
    drafter: str
    schedule: str
    predictor: str
    hop_delay_ms: float = 0.0
    draft_len: int | None = None  # None: --draft-len
    adaptive: str | None = None   # None: --adaptive
    learn: bool | None = None     # None: default_learning()

    def resolve(self, config: BenchConfig) -> MethodSpec:
        """The concrete settings: what the method leaves out comes from the flags (learning: from the
        orchestrator's default; a drafter that does not read the store learns nothing)."""
        spec = config.speculation
        adaptive = self.adaptive or ("off" if self.draft_len else spec.adaptive)  # /K alone: a fixed K
        draft_len = self.draft_len or config.draft_len or (ADAPTIVE_DRAFT_LEN if adaptive == "on" else FIXED_DRAFT_LEN)
        learn = default_learning() if self.learn is None else self.learn
        return MethodSpec(self.drafter, self.schedule, self.predictor, draft_len, spec.width,
                          spec.hypotheses, adaptive, self.hop_delay_ms,
                          forward_mode(config.model) != "eager", learn and self.drafter in STORE_DRAFTERS)


def parse_methods(config: BenchConfig) -> list[Method]:
    """--methods, or --drafters with --schedule / --predictor."""
    if not config.methods:
        kinds = config.drafters.split(",") if config.drafters else [config.speculation.drafter]
        spec = config.speculation
        methods = [Method(kind, spec.schedule, spec.predictor, config.hop_delay_ms) for kind in check_kinds(kinds)]
    else:
        methods = [parse_method(item, config) for item in config.methods.split(",")]
    if config.transport == "embedded" and any(m.hop_delay_ms for m in methods):
        raise InvalidArgument("a hop delay delays gRPC calls: use it with --transport grpc")
    methods = sweep(methods, parse_sweep(config.sweep)) if config.sweep else methods
    return learning_on_and_off(methods) if recurring(config) else methods


def recurring(config: BenchConfig) -> bool:
    """Whether the run is of the recurring suite (specpipe.bench.recurring): its prompts' categories
    are their kinds."""
    return config.suite == RECURRING and not config.prompts


def learning_on_and_off(methods: list[Method]) -> list[Method]:
    """The recurring suite's methods: the verifier alone first, then each method that drafts from the
    store and does not name +learn or +no-learn with learning on and with learning off."""
    out = [] if any(m.drafter == "none" for m in methods) else [Method("none", "sequential", methods[0].predictor)]
    for method in methods:
        paired = method.drafter in STORE_DRAFTERS and method.learn is None
        out += [replace(method, learn=True), replace(method, learn=False)] if paired else [method]
    return out


def parse_sweep(value: str) -> list[int]:
    try:
        ks = sorted({int(k) for k in value.split(",") if k.strip()})
    except ValueError:
        ks = []
    if not ks or ks[0] < 1:
        raise InvalidArgument(f"--sweep takes draft lengths >= 1, e.g. 1,2,4,8; got {value!r}")
    return ks


def sweep(methods: list[Method], ks: list[int]) -> list[Method]:
    """Each method at every fixed k, then adaptive with the largest k as its cap; a method whose name
    sets /K or +adaptive, and the verifier alone, run as named."""
    out = []
    for method in methods:
        if method.drafter == "none" or method.draft_len or method.adaptive:
            out.append(method)
            continue
        out += [replace(method, draft_len=k, adaptive="off") for k in ks]
        out.append(replace(method, draft_len=ks[-1], adaptive="on"))
    return out


METHOD_SYNTAX = "DRAFTER[:SCHEDULE[:PREDICTOR]][/K][+adaptive][+learn|+no-learn][@HOP_MS]"


def parse_method(item: str, config: BenchConfig) -> Method:
    """DRAFTER[:SCHEDULE[:PREDICTOR]][/K][+adaptive][+learn|+no-learn][@HOP_MS]: K is the draft
    length (adaptive: its cap); +learn / +no-learn: the store learns finished outputs or not; what is
    left out comes from the flags."""
    spec, _, hop = item.partition("@")
    spec, *plus = spec.split("+")
    spec, slash, k = spec.partition("/")
    parts = spec.split(":")
    learn = [LEARNING[p] for p in plus if p in LEARNING]
    if (len(parts) > 3 or len(set(plus)) < len(plus) or len(learn) > 1 or set(plus) - {"adaptive", *LEARNING}
            or (slash and not (k.isdigit() and int(k) >= 1))):
        raise InvalidArgument(f"bad method {item!r}: expected {METHOD_SYNTAX}")
    drafter, schedule, predictor = parts + [config.speculation.schedule, config.speculation.predictor][len(parts) - 1:]
    check_kinds([drafter])
    if schedule not in SCHEDULES or predictor not in PREDICTORS:
        raise InvalidArgument(f"bad method {item!r}: schedule is one of {', '.join(SCHEDULES)}, predictor one of "
                              f"{', '.join(PREDICTORS)}")
    try:
        hop_ms = float(hop) if hop else config.hop_delay_ms
    except ValueError:
        raise InvalidArgument(f"bad method {item!r}: @HOP_MS must be a number of milliseconds") from None
    return Method(drafter, schedule, predictor, hop_ms, draft_len=int(k) if slash else None,
                  adaptive="on" if "adaptive" in plus else None, learn=learn[0] if learn else None)


def check_kinds(kinds: list[str]) -> list[str]:
    unknown = [k for k in kinds if k not in DRAFTER_KINDS]
    if unknown:
        raise InvalidArgument(f"unknown drafters {unknown}; choose from {', '.join(DRAFTER_KINDS)}")
    return kinds


BASELINES = ("generate", "generate-threads", "assisted", "prompt-lookup", "llama-cpp")


def parse_baselines(value: str) -> list[str]:
    names = [b for b in value.split(",") if b]
    unknown = [b for b in names if b not in BASELINES]
    if unknown:
        raise InvalidArgument(f"unknown baselines {unknown}; choose from {', '.join(BASELINES)}")
    return ["generate", *[b for b in BASELINES[1:] if b in names]]
