"""Distributed traces (specpipe.runtime.tracing, docs/observability.md), in one process over real gRPC
servers: off, nothing of OpenTelemetry is touched; on, a generation is one trace whose spans cover every
hop, each parented where it ran, the context carried in gRPC metadata and inside each round of the
stream of rounds; its log lines and its latency exemplars name the same trace. The multi-process trace
through `specpipe up` is in tests/test_observability_up.py."""

from __future__ import annotations

import io
import json
import logging
import secrets

import pytest

from specpipe.config.services import TracingConfig
from specpipe.core.types import SpeculationOptions
from specpipe.runtime import logs, tracing

SPEC = SpeculationOptions(drafter="model", draft_len=3, width=1, adaptive="off", schedule="sequential")


class Untouchable:
    def __getattr__(self, name):
        raise AssertionError(f"tracing is off, yet specpipe.runtime.otel.{name} was used")


def test_tracing_off_touches_nothing_and_changes_no_token(monkeypatch, tiny_generator):
    from tests.golden import run

    monkeypatch.setattr(tracing, "ACTIVE", False)
    monkeypatch.setattr(tracing, "_otel", Untouchable())
    from specpipe.core.types import GenerationRequest

    request = GenerationRequest((1, 2, 3, 4), 12, speculation=SPEC)
    tokens, chunks = run(tiny_generator, request)
    assert len(tokens) == 12 and all(chunk.trace_id == "" for chunk in chunks)


def spans_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def traced(tmp_path):
    """Tracing on in this process, every span to a file; off again after the test."""
    path = tmp_path / "spans.jsonl"
    tracing.configure(TracingConfig(enabled=True, trace_ratio=0.0, trace_file=str(path)), "test")
    try:
        yield path
    finally:
        tracing.shutdown()
        tracing.configure(TracingConfig(), "test")


def test_a_generation_over_grpc_is_one_trace_of_every_hop(traced):
    """The client's traceparent is sampled, so the generation is traced although --trace-ratio is 0:
    generation -> round -> draft / verify / detokenize, and through the servers the drafter's and the
    verifier's spans down to their forwards, each a child of the span that asked for it."""
    from tests.grpc_harness import tiny_cluster

    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    stream = io.StringIO()
    logs.configure("INFO", stream=stream)
    try:
        with tiny_cluster() as cluster:  # built with tracing on: its channels and servers carry it
            chunks = list(cluster.generation_client.generate(
                token_ids=[1, 2, 3, 4, 5], max_new_tokens=10, request_id="req-traced", speculation=SPEC,
                traceparent=f"00-{trace_id}-{parent_id}-01"))
            untraced = list(cluster.generation_client.generate(token_ids=[1, 2, 3], max_new_tokens=4,
                                                               speculation=SPEC))
    finally:
        logging.getLogger().handlers.clear()
    tracing.shutdown()
    spans = spans_of(traced)
    assert sum(len(c.token_ids) for c in chunks) == 10 and untraced
    assert {s["context"]["trace_id"] for s in spans} == {f"0x{trace_id}"}  # the untraced one made none
    by_id = {s["context"]["span_id"]: s for s in spans}
    names = [s["name"] for s in spans]

    def parent(span: dict) -> dict:
        return by_id[span["parent_id"]]

    generation = next(s for s in spans if s["name"] == "generation")
    assert generation["parent_id"] == f"0x{parent_id}"
    assert generation["attributes"]["specpipe.request_id"] == "req-traced"
    rounds = [s for s in spans if s["name"] == "round"]
    assert rounds and all(parent(r) is generation for r in rounds)
    assert sum(r["attributes"]["specpipe.emitted"] for r in rounds) == 10
    for name in ("draft", "verify", "detokenize"):
        assert any(s["name"] == name and parent(s)["name"] == "round" for s in spans), name
    assert parent(next(s for s in spans if s["name"] == "prefill")) is generation
    # the verifier's side of a round on the stream of rounds: its own span, queue, forward, verdict
    served = [s for s in spans if s["name"] == "verify" and s["kind"] == "SpanKind.SERVER"]
    assert served and all(parent(s)["name"] == "verify" and parent(s)["kind"] == "SpanKind.CLIENT" for s in served)
    for name in ("queue", "forward", "verdict"):
        assert any(s["name"] == name and parent(s) in served for s in spans), name
    forward = next(s for s in spans if s["name"] == "forward" and parent(s) in served)
    assert forward["attributes"]["specpipe.batch.sessions"] >= 1
    assert forward["attributes"]["specpipe.role"] == "verifier"
    # the drafter's, through gRPC metadata: the Propose call's client and server spans, its forwards
    propose = next(s for s in spans if s["name"] == "/specpipe.v1.Drafter/Propose" and s["kind"] == "SpanKind.SERVER")
    assert parent(parent(propose))["name"] == "draft"
    assert any(s["name"] == "forward" and s["attributes"]["specpipe.role"] == "drafter" and parent(s) is propose
               for s in spans)
    assert "/specpipe.v1.Verifier/VerifyStream" not in names  # the stream itself is no span
    # the log line of the generation names its request and its trace
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    finished = [line for line in lines if line["msg"] == "generation finished"]
    assert any(line["request_id"] == "req-traced" and line["trace_id"] == trace_id for line in finished)
    assert any("trace_id" not in line for line in finished)  # the untraced generation's line has none


def test_latency_histograms_carry_the_trace_as_an_exemplar(traced):
    from prometheus_client import REGISTRY
    from prometheus_client.openmetrics.exposition import generate_latest

    from tests.grpc_harness import tiny_cluster

    trace_id = secrets.token_hex(16)
    with tiny_cluster() as cluster:
        list(cluster.generation_client.generate(token_ids=[5, 6, 7], max_new_tokens=6, speculation=SPEC,
                                                traceparent=f"00-{trace_id}-{secrets.token_hex(8)}-01"))
    text = generate_latest(REGISTRY).decode()
    for family in ("specpipe_ttft_ms", "specpipe_round_ms", "specpipe_verify_forward_ms"):
        assert any(line.startswith(f"{family}_bucket") and f'trace_id="{trace_id}"' in line
                   for line in text.splitlines()), family


def test_a_root_span_is_sampled_only_where_a_generation_enters():
    from opentelemetry.sdk.trace.sampling import Decision

    from specpipe.runtime.otel import EntrySampler, exporter_names, traced_method

    sampler = EntrySampler(1.0)
    assert sampler.should_sample(None, 1, "generation").decision == Decision.RECORD_AND_SAMPLE
    assert sampler.should_sample(None, 1, "/specpipe.v1.Drafter/Propose").decision == Decision.DROP
    assert EntrySampler(0.0).should_sample(None, 1, "generation").decision == Decision.DROP

    class Call:
        def __init__(self, method):
            self.method = method

    assert traced_method(Call("/specpipe.v1.Drafter/Propose"))
    untraced = ("/specpipe.v1.Verifier/VerifyStream", "/grpc.health.v1.Health/Check",
                "/specpipe.v1.Generation/Generate", "/specpipe.v1.Verifier/Load")
    assert not any(traced_method(Call(m)) for m in untraced)
    assert exporter_names({}, None) == ["otlp_proto_grpc"]
    assert exporter_names({}, "spans.jsonl") == []
    assert exporter_names({"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
                          None) == ["otlp_proto_http", "console"]
    assert exporter_names({"OTEL_TRACES_EXPORTER": "none"}, None) == []


def test_an_http_clients_traceparent_is_the_parent_of_its_generation(traced, tiny_generator):
    """The one place an HTTP request enters takes its `traceparent` header into the request's context;
    the streamed answer is the one the untraced API gives."""
    import httpx

    from tests.http_harness import MODEL, api

    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 6, "temperature": 0}
    with api(tiny_generator) as server:
        traced_answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60,
                                   headers={"traceparent": f"00-{trace_id}-{parent_id}-01"}).json()
    tracing.shutdown()
    spans = spans_of(traced)
    (generation,) = [s for s in spans if s["name"] == "generation"]
    assert generation["context"]["trace_id"] == f"0x{trace_id}" and generation["parent_id"] == f"0x{parent_id}"
    assert {s["context"]["trace_id"] for s in spans} == {f"0x{trace_id}"}
    tracing.configure(TracingConfig(), "test")
    with api(tiny_generator) as server:
        plain = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert traced_answer["choices"][0]["text"] == plain["choices"][0]["text"]
