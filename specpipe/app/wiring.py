"""The composition root: which implementation each role gets (the in-process object or a gRPC client
over replicas) is decided here only, from typed configs (specpipe.config.services)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from specpipe.app import startup
from specpipe.config.limits import DEFAULT_LIMITS, Limits
from specpipe.core.protocols import Drafter, NgramCache, Verifier
from specpipe.core.types import ModelInfo, SpeculationOptions

if TYPE_CHECKING:
    from orchestrator.generator import Generator
from specpipe.config.presets import ModelSpec
from specpipe.config.services import (
    DrafterConfig,
    GeneratorConfig,
    ModelConfig,
    OrchestratorConfig,
    TlsFiles,
    VerifierConfig,
)
from specpipe.core.errors import InvalidArgument, SpecpipeError
from specpipe.engine.models import load_model, load_tokenizer, model_info
from specpipe.engine.runner import packed_on_load
from specpipe.runtime.traced import traced_drafter, traced_store
from specpipe.serving.security import Tls

log = logging.getLogger(__name__)


def forward_mode(model: ModelConfig) -> str:
    """specpipe.engine.runner's forward mode: eager, packed (CPU) or graphs (CUDA)."""
    if model.compile == "off":
        return "eager"
    if not model.on_cpu:
        return "graphs"
    return _cpu_auto_mode() if model.compile == "auto" else "packed"


@functools.lru_cache(maxsize=1)
def _cpu_auto_mode() -> str:
    """compile auto on a CPU: packed where the kernel can be built and cached, else eager (said once)."""
    from specpipe.engine.native import toolchain

    reason = toolchain.unavailable()
    if reason is None:
        return "packed"
    log.warning(f"--compile auto runs eager forwards: the packed GEMM kernel cannot be built here ({reason})")
    return "eager"


def drafter_forward(model: ModelConfig) -> dict:
    """The model drafter's forward options (ModelDrafter keywords)."""
    mode, weights = forward_mode(model), model.draft_weights
    if weights == "auto":
        weights = "int8" if mode == "packed" else "fp32"
    if weights != "fp32" and mode != "packed":
        raise InvalidArgument(f"--draft-weights {weights} packs the drafter's weights: it needs the CPU kernel "
                              "(--compile on, or auto with a C compiler) and a CPU --device")
    return {"mode": mode, "weights": weights, "batching": model.batching}


def verifier_weights(model: ModelConfig) -> str:
    """The verifier's packed weights (fp32, or the others: the CPU kernel only); auto: w4a8 where the
    CPU kernel runs batched forwards (its row-exact attention), else fp32."""
    packed = forward_mode(model) == "packed"
    if model.verifier_weights == "auto":
        return "w4a8" if packed and model.batching else "fp32"
    if model.verifier_weights != "fp32" and not packed:
        raise InvalidArgument(f"--verifier-weights {model.verifier_weights} packs the verifier's weights: it needs the "
                              "CPU kernel (--compile on, or auto with a C compiler) and a CPU --device")
    return model.verifier_weights


def ngram_cache(url: str, tls: TlsFiles | Tls | None = None) -> NgramCache:
    """The n-gram store named by --cache: memory (this process), redis://... (shared) or grpc://...
    (tls: of the channel to a cache service)."""
    from cache_service.stores import open_store

    return traced_store(open_store(url, tls=Tls.of(tls) if isinstance(tls, TlsFiles) else tls))


def build_drafters(kinds: Iterable[str], store: NgramCache | None, model_drafter: Drafter | None,
                   info: ModelInfo) -> dict[str, Drafter]:
    """The drafters of kinds over one n-gram store and one model drafter (either may be None when
    no kind needs it); hybrid = model + n-gram."""
    from drafter_service.hybrid import HybridDrafter
    from drafter_service.ngram_drafter import NgramDrafter

    kinds = set(kinds)
    drafters: dict[str, Drafter] = {}
    if kinds & {"model", "hybrid"}:
        if model_drafter is None:
            raise ValueError(f"drafters {sorted(kinds)} need the model drafter")
        drafters["model"] = model_drafter
    if kinds & {"ngram", "hybrid"}:
        drafters["ngram"] = NgramDrafter(store, info)
    if "hybrid" in kinds:
        drafters["hybrid"] = HybridDrafter(drafters["model"], drafters["ngram"])
    return drafters


def cost_curve(spec: str | None, role: str) -> Any:
    """The forward curve of --cost-model (None: the device's own speed)."""
    from specpipe.engine.costmodel import load_curve

    return load_curve(spec, role) if spec else None


def load_verifier(config: VerifierConfig) -> Any:
    """The ModelVerifier of the config (its model, admission, batching, caps and session TTL), or with
    replay the TranscriptVerifier of a recorded transcript; either held to the cost model if given."""
    from verifier_service.verifier import ModelVerifier

    curve = cost_curve(config.cost_model, "verifier")
    if config.replay:
        from specpipe.core.transcript import load
        from verifier_service import replay

        return replay.TranscriptVerifier(load(config.replay), curve, config.max_sessions,
                                         config.session_ttl_s, config.batch, config.limits)
    model = config.model
    spec, mode = model.specs()[0], forward_mode(model)
    loaded = load_weights("verifier", spec, model, packed_on_load(mode, verifier_weights(model)))
    with startup.step(forward_step("verifier", mode, verifier_weights(model))):
        return ModelVerifier(loaded, model_info(spec, loaded), mode=mode, weights=verifier_weights(model),
                             max_sessions=config.max_sessions, batch=config.batch, batching=model.batching,
                             limits=config.limits, session_ttl_s=config.session_ttl_s, cost_model=curve)


def load_weights(role: str, spec: ModelSpec, model: ModelConfig, packed: str | None = None) -> Any:
    """The role's model, its weights loaded (a start-up step of their own: transformers' bar shows them);
    packed: the weights its linear layers are packed in (a GGUF model is packed as it is read)."""
    how = f"{model.torch_dtype}, linear layers {packed} if read from GGUF" if packed else model.torch_dtype
    with startup.step(f"loading the {role}'s weights ({spec.label}, {how} on {model.device})"):
        return load_model(spec, model.device, model.torch_dtype, packed)


def forward_step(role: str, mode: str, weights: str = "fp32") -> str:
    """The start-up step that makes the role's forward of mode ready."""
    return {"packed": f"packing the {role}'s weights ({weights}) for the CPU kernel (built once for this CPU, "
                      "then cached)",
            "graphs": f"capturing the {role}'s CUDA graphs"}.get(mode, f"the {role}'s eager forward")


def load_drafter(spec: ModelSpec, model: ModelConfig, forward: dict[str, Any], **kwargs: Any) -> Any:
    """The ModelDrafter of spec (forward: drafter_forward's options), in two start-up steps."""
    from drafter_service.model_drafter import ModelDrafter

    loaded = load_weights("drafter", spec, model, packed_on_load(forward["mode"], forward["weights"]))
    with startup.step(forward_step("drafter", forward["mode"], forward["weights"])):
        return ModelDrafter(loaded, model_info(spec, loaded), **forward, **kwargs)


def drafter_methods(config: DrafterConfig) -> dict:
    """What a drafter service serves: the small model alone (or, with replay, its drafter table), or,
    given an n-gram store (cache), the model, ngram and hybrid draft methods over it."""
    drafter = replayed_drafter(config.replay, cost_curve(config.cost_model, "drafter")) if config.replay else None
    if drafter is None:
        model = config.model
        drafter = load_drafter(model.specs()[1], model, drafter_forward(model), session_ttl_s=config.session_ttl_s,
                               cost_model=cost_curve(config.cost_model, "drafter"))
    if not config.cache:
        return {"model": traced_drafter(drafter, "model", "propose")}
    methods = build_drafters(("model", "ngram", "hybrid"), ngram_cache(config.cache, config.tls), drafter,
                             drafter.info())
    return {method: traced_drafter(served, method, "propose") for method, served in methods.items()}


def replayed_drafter(path: str, curve: Any) -> Any:
    """The TranscriptDrafter of the transcript at path held to curve (None: no cost model), or None (the
    model runs) where the transcript holds no drafter table."""
    from drafter_service.replay import TranscriptDrafter
    from specpipe.core.transcript import load

    transcript = load(path)
    if transcript.drafter is None:
        log.warning("the replay transcript holds no drafter table: the small model runs (record the transcript again "
                    "to replay it)", extra={"transcript": path})
        return None
    return TranscriptDrafter(transcript, curve)


def embedded_generator(config: GeneratorConfig, drafter_kinds: tuple[str, ...] | None = None,
                       store: NgramCache | None = None) -> Generator:
    """Everything in this process: the verifier, the n-gram store (config.cache, or store) and the
    drafters that drafter_kinds (default: the one the speculation names) need; the small model is
    loaded only for the model and hybrid drafters."""
    from orchestrator.generator import Generator
    from specpipe.engine.cores import set_threads

    model = config.model
    forward = drafter_forward(model)  # a bad combination fails before anything changes, drafter model or not
    set_threads(model.threads)
    kinds = set(drafter_kinds or (config.speculation.drafter,))
    verifier_spec, drafter_spec = model.specs()
    verifier = load_verifier(config.verifier)
    uses_store = bool(kinds & {"ngram", "hybrid"})
    if uses_store and store is None:
        store = ngram_cache(config.cache)
    drafter = None
    if kinds & {"model", "hybrid"}:
        drafter = load_drafter(drafter_spec, model, forward)
    drafters = build_drafters(kinds, store, drafter, verifier.info())
    return Generator(load_tokenizer(verifier_spec), verifier, drafters, config.speculation,
                     store if uses_store else None,  # the store is fed only if drafted from
                     limits=config.verifier.limits, shared_cores=model.on_cpu)


def orchestrator_generator(config: OrchestratorConfig) -> Generator:
    """The orchestrator of a distributed deployment (specpipe serve orchestrator)."""
    config.check_peers()
    return remote_generator(config)


def remote_generator(config: OrchestratorConfig) -> Generator:
    """The orchestrator of a distributed deployment: verifier and drafter replicas behind gRPC clients.
    verifier_addr / drafter_addr: host:port, a comma list, or dns:///name:port re-resolved as replicas
    come and go (specpipe.serving.replicas); each session is pinned to the least-loaded verifier replica and
    moved with its context when that replica is lost (specpipe.serving.failover). Each draft method the
    drafter service serves (ModelInfo.methods) goes through it; the n-gram and hybrid methods it does
    not serve run here, over the n-gram store config.cache, which this orchestrator feeds with every
    confirmed token (a drafter service drafting n-grams must use the same store). Waits up to
    connect_timeout_s for a verifier replica (it may still be loading its model).
    hop_delay_ms: latency added to each direction of every call to the verifier and the drafter."""
    from specpipe.serving.clients import DrafterClient, VerifierClient
    from specpipe.serving.failover import (
        ReplicatedDrafter,
        ReplicatedVerifier,
        drafter_probe,
        first_answer,
        verifier_probe,
    )
    from specpipe.serving.replicas import ReplicaSet

    tls, rpc_timeout_s, hop_delay_ms = Tls.of(config.tls), config.rpc_timeout_s, config.hop_delay_ms
    verifier_tls = peer_tls(tls, config.verifier_addr)
    verifiers = ReplicaSet(config.verifier_addr, lambda a: VerifierClient(a, rpc_timeout_s, hop_delay_ms=hop_delay_ms,
                                                                          tls=verifier_tls), verifier_probe,
                           role="verifier")
    verifiers.wait_ready(config.connect_timeout_s)
    verifier = ReplicatedVerifier(verifiers)
    store = ngram_cache(config.cache, tls)
    served: dict = {}
    if config.drafter_addr is not None:
        drafter_tls = peer_tls(tls, config.drafter_addr)
        drafters = ReplicaSet(config.drafter_addr, lambda a: DrafterClient(a, rpc_timeout_s, hop_delay_ms=hop_delay_ms,
                                                                           tls=drafter_tls), drafter_probe,
                              role="drafter")
        methods = ("model",)
        try:
            methods = first_answer(drafters, "info").methods or methods
        except SpecpipeError as err:  # not up yet: assume the small model alone
            log.warning("drafter service unreachable at start", extra={"error": str(err)})
        served = {method: ReplicatedDrafter(drafters, method) for method in methods}
    return served_generator(config.model.specs()[0], verifier, served, config.speculation, store, config.limits,
                            config.learn_global)


def peer_tls(tls: Tls | None, target: str) -> Tls | None:
    """The TLS of the channels to target's replicas: those of a DNS name (dns:///name:port) are dialled
    by IP, so their certificates are checked against the name (a headless Service's, in Kubernetes)."""
    from specpipe.serving.replicas import parse_target

    name = parse_target(target)[1]
    return replace(tls, server_name=name.rpartition(":")[0]) if tls is not None and name else tls


def served_generator(tokenizer_spec: ModelSpec, verifier: Verifier, served: Mapping[str, Drafter],
                     defaults: SpeculationOptions, store: NgramCache, limits: Limits = DEFAULT_LIMITS,
                     learn_global: bool = True) -> Generator:
    """The orchestrator over a verifier and the draft methods a drafter service serves (method ->
    Drafter): the n-gram and hybrid methods it does not serve run here, over store, which the
    generator feeds with every confirmed token. Also what the Ray Serve orchestrator runs (deploy/ray)."""
    from orchestrator.generator import Generator

    local = build_drafters(("ngram", "hybrid") if "model" in served else ("ngram",), store, served.get("model"),
                           verifier.info())
    return Generator(load_tokenizer(tokenizer_spec), verifier, {**local, **served}, defaults, store, limits=limits,
                     learn_global=learn_global)
