"""Fuzz every field of every RPC of every service (hypothesis; requests built from the proto
descriptors, tests/fuzz_harness.py): the servicers in this process, a few thousand cases, then
fewer over real gRPC servers. Each case ends with an allowed status (never INTERNAL or UNKNOWN),
within its deadline over gRPC (no hang), and every server answers a valid request and its health
check afterwards."""

from __future__ import annotations

import contextlib

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specpipe.config.limits import Limits
from specpipe.core.types import SpeculationOptions
from specpipe.v1 import cache_pb2, common_pb2, drafter_pb2, generation_pb2, verifier_pb2
from tests.fuzz_harness import ALLOWED, call, http_bodies, messages

LIMITS = Limits(max_prompt_tokens=64, max_new_tokens=12, max_draft_len=8, max_width=3, max_hypotheses=4,
                max_prompt_chars=512)  # small caps: a valid case stays cheap
PROMPT = (10, 20, 30)
SERVICES = {"Generation": generation_pb2, "Verifier": verifier_pb2, "Drafter": drafter_pb2, "Cache": cache_pb2}
RPCS = [(name, method.name) for name, module in SERVICES.items()
        for method in module.DESCRIPTOR.services_by_name[name].methods]
EXAMPLES = {"Generate": 500, "Verify": 450, "VerifyStream": 200, "Prefill": 250, "Propose": 450, "Lookup": 250,
            "RecordBranches": 200, "UpdateGlobal": 150, "Release": 60}
# (in-process cases per RPC; others, with no fields (Info, Load): 10)
SESSION_RPCS = ("Verify", "VerifyStream")  # cases that start from a fresh session "fz"
GRPC_EXAMPLES = 80  # per RPC over real gRPC


# Valid-looking requests next to the generic ones, so that cases reach past the first check.
TOKENS = st.lists(st.integers(0, 260), max_size=10)
SAMPLING = st.builds(common_pb2.SamplingParams, temperature=st.sampled_from([0.0, 0.7, 1.0]),
                     top_p=st.sampled_from([0.0, 0.9]), top_k=st.integers(0, 5), seed=st.integers(0, 9))
CHAIN = TOKENS.map(lambda t: common_pb2.DraftTree(tokens=t, parents=range(-1, len(t) - 1)))
SPECULATION = st.builds(
    generation_pb2.SpeculationOptions, drafter=st.sampled_from(["", "model", "ngram", "hybrid", "none"]),
    draft_len=st.integers(0, 9), width=st.integers(0, 4), schedule=st.sampled_from(["", "sequential", "branch"]),
    hypotheses=st.integers(-1, 5), adaptive=st.sampled_from(["", "on", "off"]))
OVERRIDES = {
    "specpipe.v1.VerifyRequest": st.builds(verifier_pb2.VerifyRequest, session_id=st.just("fz"),
                                           context_len=st.sampled_from([3, 3, 4]), draft=CHAIN, sampling=SAMPLING),
    "specpipe.v1.ProposeRequest": st.builds(drafter_pb2.ProposeRequest, session_id=st.just("fz"), context=TOKENS,
                                            draft_len=st.integers(-1, 9), width=st.integers(0, 4), sampling=SAMPLING,
                                            method=st.sampled_from(["", "model", "ngram", "hybrid", "x"])),
    "specpipe.v1.GenerateRequest": st.builds(generation_pb2.GenerateRequest,
                                             token_ids=TOKENS.map(lambda t: generation_pb2.TokenIds(ids=t)),
                                             max_new_tokens=st.integers(-1, 13), sampling=SAMPLING,
                                             speculation=SPECULATION, stop=st.lists(st.text(max_size=3), max_size=3)),
    "specpipe.v1.LookupRequest": st.builds(cache_pb2.LookupRequest, session_id=st.just("fz"), context_suffix=TOKENS,
                                           k=st.integers(-1, 9), width=st.integers(0, 4)),
}
TENANTS = ["acme", "b", "no/slash", "x" * 65]
METADATA = st.one_of(st.just(()), st.tuples(st.tuples(st.just("x-specpipe-tenant"), st.sampled_from(TENANTS + ["é"]))))
WIRE_METADATA = st.one_of(st.just(()), st.tuples(st.tuples(st.just("x-specpipe-tenant"), st.sampled_from(TENANTS))))
# (a gRPC client cannot send a non-ASCII metadata value at all)


@pytest.fixture(scope="module")
def fuzz_services(tiny_tokenizer):
    """The four servicers over tiny models with small caps (the gRPC services are these objects)."""
    from cache_service import servicer as cache_servicer
    from cache_service.memory import InMemoryNgramCache
    from drafter_service import servicer as drafter_servicer
    from drafter_service.model_drafter import ModelDrafter
    from orchestrator import servicer as generation_servicer
    from orchestrator.generator import Generator
    from specpipe.app.wiring import build_drafters
    from specpipe.config.presets import ModelSpec
    from specpipe.engine.models import model_info, tiny_model
    from verifier_service import servicer as verifier_servicer
    from verifier_service.verifier import ModelVerifier

    verifier_model, drafter_model = tiny_model(), tiny_model(2)
    verifier = ModelVerifier(verifier_model, model_info(ModelSpec("tiny"), verifier_model), limits=LIMITS)
    model = ModelDrafter(drafter_model, model_info(ModelSpec("tiny", 2), drafter_model))
    store = InMemoryNgramCache()
    drafters = build_drafters(("model", "ngram", "hybrid"), store, model, verifier.info())
    defaults = SpeculationOptions(draft_len=4)
    generator = Generator(tiny_tokenizer, verifier, drafters, defaults, store, limits=LIMITS)
    return {"Generation": generation_servicer.service(generator), "Verifier": verifier_servicer.service(verifier, ),
            "Drafter": drafter_servicer.service(drafters, LIMITS), "Cache": cache_servicer.service(store, LIMITS)}


def input_class(service: str, rpc: str):
    method = SERVICES[service].DESCRIPTOR.services_by_name[service].methods_by_name[rpc]
    return method.input_type._concrete_class


def reset_session(services) -> None:
    """Each Verify case starts from a fresh 3-token session "fz" (so a case may get past the session checks)."""
    verifier = services["Verifier"].servicer
    call(verifier.Release, common_pb2.ReleaseRequest(session_id="fz"))
    code, details = call(verifier.Prefill, verifier_pb2.PrefillRequest(session_id="fz", prompt_ids=PROMPT))
    assert code == grpc.StatusCode.OK, details


def assert_healthy(services) -> None:
    """Every servicer still serves a valid request."""
    valid = {
        "Generation": ("Generate", generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=PROMPT), max_new_tokens=4)),
        "Verifier": ("Prefill", verifier_pb2.PrefillRequest(session_id="healthy", prompt_ids=PROMPT)),
        "Drafter": ("Propose", drafter_pb2.ProposeRequest(session_id="healthy", context=PROMPT, draft_len=3, width=1)),
        "Cache": ("Lookup", cache_pb2.LookupRequest(session_id="healthy", context_suffix=PROMPT, k=3, width=1)),
    }
    for service, (rpc, request) in valid.items():
        servicer = services[service].servicer
        code, details = call(getattr(servicer, rpc), request)
        assert code == grpc.StatusCode.OK, f"{service}.{rpc} after fuzzing: {code} {details}"
    call(services["Verifier"].servicer.Release, common_pb2.ReleaseRequest(session_id="healthy"))


def client_streaming(service: str, rpc: str) -> bool:
    return SERVICES[service].DESCRIPTOR.services_by_name[service].methods_by_name[rpc].client_streaming


def round_codes(replies) -> list[grpc.StatusCode]:
    """The rounds' own statuses in a stream of VerifyBatchReply (a round fails alone, not its stream)."""
    return [next(c for c in grpc.StatusCode if c.value[0] == r.code) for batch in replies for r in batch.replies]


@pytest.mark.parametrize("service,rpc", RPCS, ids=[f"{s}.{r}" for s, r in RPCS])
def test_fuzz_in_process(fuzz_services, service, rpc):
    method = getattr(fuzz_services[service].servicer, rpc)
    requests = messages(input_class(service, rpc), overrides=OVERRIDES)
    streaming = client_streaming(service, rpc)

    @settings(max_examples=EXAMPLES.get(rpc, 10), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(request=requests, metadata=METADATA)
    def case(request, metadata):
        if rpc in SESSION_RPCS:
            reset_session(fuzz_services)
        replies = []
        code, details = call(method, iter([request]) if streaming else request, metadata, replies)
        assert code in ALLOWED, f"{service}.{rpc}({request!r:.300}) -> {code}: {details}"
        seen.add(code)
        for round_code in round_codes(replies) if streaming else ():
            assert round_code in ALLOWED, f"{service}.{rpc}({request!r:.300}) -> a round's {round_code}"
            seen.add(round_code)

    seen: set[grpc.StatusCode] = set()
    case()
    assert grpc.StatusCode.OK in seen  # the cases reach the work, not only the checks
    if rpc != "Release" and input_class(service, rpc).DESCRIPTOR.fields:  # a request that can be wrong
        assert grpc.StatusCode.INVALID_ARGUMENT in seen, seen
    assert_healthy(fuzz_services)


@pytest.mark.parametrize("service,rpc", RPCS, ids=[f"{s}.{r}" for s, r in RPCS])
def test_fuzz_over_grpc(fuzz_services, service, rpc):
    """The same cases (fewer) through a real server: the wire adds its own codes for nothing else."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from specpipe.serving.clients import channel
    from specpipe.serving.server import ServerConfig, serve

    module = SERVICES[service]
    requests = messages(input_class(service, rpc), overrides=OVERRIDES)
    with contextlib.ExitStack() as stack:
        handle = stack.enter_context(serve([fuzz_services[service]], ServerConfig(port=0, grace_s=0.5)))
        chan = stack.enter_context(channel(handle.address))
        stub = getattr(module, f"{service}Stub", None) or getattr(_grpc_module(module), f"{service}Stub")
        method = getattr(stub(chan), rpc)

        @settings(max_examples=GRPC_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(request=requests, metadata=WIRE_METADATA)
        def case(request, metadata):
            if rpc in SESSION_RPCS:
                reset_session(fuzz_services)
            streaming = client_streaming(service, rpc)
            try:
                reply = method(iter([request]) if streaming else request, timeout=30.0, metadata=metadata or None)
                if hasattr(reply, "__next__"):
                    replies = list(reply)
                    for round_code in round_codes(replies) if streaming else ():
                        assert round_code in ALLOWED, f"{service}.{rpc}({request!r:.300}) -> a round's {round_code}"
            except grpc.RpcError as err:  # DEADLINE_EXCEEDED (a hang) is not allowed
                assert err.code() in ALLOWED, f"{service}.{rpc}({request!r:.300}) -> {err.code()}: {err.details()}"

        case()
        health = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=10.0)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert_healthy(fuzz_services)


def _grpc_module(module):
    import importlib

    return importlib.import_module(module.__name__ + "_grpc")


# --- the HTTP API: schemathesis on its OpenAPI schema, and raw JSON from hypothesis -------------------

HTTP_OPERATIONS = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                   ("GET", "/health")]
HTTP_EXAMPLES = {"POST": 40, "GET": 5}  # per operation and generation mode; the slow suite: SLOW_FACTOR times
SLOW_FACTOR = 15


@pytest.fixture(scope="module")
def http_api(fuzz_services):
    """The OpenAI-compatible API over the fuzzed generator, and its schema as schemathesis reads it."""
    import schemathesis

    from specpipe.config.limits import HttpLimits
    from tests.http_harness import api

    generator = fuzz_services["Generation"].servicer._path.generator
    with api(generator, limits=HttpLimits(header_timeout_s=5, body_timeout_s=5, request_timeout_s=30),
             max_request_bytes=1 << 16) as server:
        yield server, schemathesis.openapi.from_url(f"{server.url}/openapi.json")


def fuzz_http(http_api, method: str, path: str, examples: int) -> None:
    """Schema-based cases, valid and invalid: never a 5xx, the status, headers and body as the schema
    says, within the request's timeout; the server healthy afterwards. A share of the valid ones keep
    two of their fields beside the served model and a short answer, so they reach the generator."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    from tests.http_harness import MODEL, assert_healthy

    server, schema = http_api
    operation = schema[path][method]
    statuses: set[int] = set()

    def run(mode: GenerationMode) -> None:
        @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(mode), data=st.data())
        def case(case, data):
            if mode == GenerationMode.POSITIVE and isinstance(case.body, dict) and data.draw(st.booleans()):
                keep = data.draw(st.sets(st.sampled_from(sorted(case.body)), max_size=2))
                short = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
                case.body = {**short, "max_tokens": 4, **{k: case.body[k] for k in keep}, "model": MODEL}
            response = case.call(base_url=server.url, timeout=30)
            case.validate_response(response, checks=[not_a_server_error, status_code_conformance,
                                                      content_type_conformance, response_schema_conformance])
            statuses.add(response.status_code)

        case()

    run(GenerationMode.POSITIVE)
    if method == "POST":  # a GET takes no input to get wrong
        run(GenerationMode.NEGATIVE)
    assert 200 in statuses and (method == "GET" or 400 in statuses), statuses
    assert_healthy(server, {"model": MODEL, "prompt": "hi", "max_tokens": 4})


@pytest.mark.parametrize("method, path", HTTP_OPERATIONS, ids=[f"{m} {p}" for m, p in HTTP_OPERATIONS])
def test_fuzz_http(http_api, method, path):
    fuzz_http(http_api, method, path, HTTP_EXAMPLES[method])


@pytest.mark.slow
@pytest.mark.parametrize("method, path", HTTP_OPERATIONS, ids=[f"{m} {p}" for m, p in HTTP_OPERATIONS])
def test_fuzz_http_longer(http_api, method, path):
    fuzz_http(http_api, method, path, HTTP_EXAMPLES[method] * SLOW_FACTOR)


@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(raw=http_bodies())
def test_fuzz_http_raw_bodies(http_api, raw):
    """Bytes no schema describes (lone surrogates anywhere, deep nesting, NaN, invalid UTF-8, huge
    numbers, duplicate keys): a 4xx in the OpenAI shape, never a 5xx."""
    import httpx

    server, _ = http_api
    for path in ("/v1/completions", "/v1/chat/completions"):
        answer = httpx.post(f"{server.url}{path}", content=raw, timeout=30)
        assert answer.status_code < 500, (raw[:200], answer.text)
        if answer.status_code != 200:
            assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
