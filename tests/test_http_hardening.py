"""The HTTP API under hostile and careless clients (orchestrator/openai_api.py, specpipe/serving/http.py,
docs/http-api.md, "Overload and slow clients"). Each case a hostile-client review found is a regression
test: lone surrogates, deep nesting, oversized and never-finished bodies, slow headers, a connection
flood, a disconnect storm, a full queue over HTTP. Every case ends with the invariants: never a 500,
an answer within the timeouts, no session left open, the server healthy (and gRPC served beside it)."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time

import httpx
import pytest

from orchestrator.admission import Admission, AdmissionConfig
from specpipe.config.limits import HttpLimits
from tests.grpc_harness import wait_until
from tests.http_harness import (
    MODEL,
    api,
    assert_healthy,
    connect,
    error_of,
    exchange,
    post,
    read_all,
    status_of,
)

LIMITS = HttpLimits(header_timeout_s=0.5, body_timeout_s=0.5, request_timeout_s=60.0, max_connections=1024)
MAX_BODY = 1 << 16  # the body cap of these servers (64 KiB), so an oversized body is quick to send
MEMORY_BOUND_MB = 64  # what a 400 MB body or a disconnect storm may add to the server's resident memory
COMPLETION = "/v1/completions"


@pytest.fixture(scope="module")
def generator(tiny_tokenizer, tiny_verifier):
    """The tiny verifier alone (no drafter): every case is about the front door, not speculation."""
    from orchestrator.generator import Generator
    from specpipe.core.types import SpeculationOptions

    return Generator(tiny_tokenizer, tiny_verifier, {}, SpeculationOptions(drafter="none"))


@pytest.fixture(scope="module")
def server(generator):
    with api(generator, limits=LIMITS, max_request_bytes=MAX_BODY) as started:
        yield started


@pytest.fixture(autouse=True)
def invariants(request, generator):
    """After each case: no session left open, and the module's server still serves."""
    yield
    assert wait_until(lambda: not generator.verifier._sessions, 30), "a session outlived its request"
    if "server" in request.fixturenames:
        assert_healthy(request.getfixturevalue("server"))


def body(**fields) -> dict:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 4, "temperature": 0, **fields}


@pytest.mark.parametrize("raw", [
    rb'{"model": "tiny", "prompt": "a\ud800b", "max_tokens": 2}',                              # in a prompt
    rb'{"model": "tiny", "messages": [{"role": "user", "content": "\udc00"}]}',                # in chat content
    rb'{"model": "tiny", "prompt": "hi", "\ud800": 1}',                                        # in a field name
    rb'{"model": "tiny", "prompt": "hi", "cache_salt": "\ud800"}',                             # in cache_salt
    rb'{"model": "tiny", "prompt": "\udc00\ud800"}',                                           # a reversed pair
    b'{"model": "tiny", "prompt": "\xed\xa0\x80"}',                                          # one, UTF-8-encoded
], ids=["prompt", "chat", "field-name", "cache_salt", "reversed-pair", "utf8-encoded"])
def test_a_lone_surrogate_is_a_400(server, raw):
    path = "/v1/chat/completions" if b"messages" in raw else COMPLETION
    answer = httpx.post(f"{server.url}{path}", content=raw, timeout=10)
    assert answer.status_code == 400, answer.text
    assert "not valid JSON" in answer.json()["error"]["message"]


def test_a_surrogate_pair_is_text(server):
    answer = httpx.post(f"{server.url}{COMPLETION}", content=rb'{"model": "tiny", "prompt": "\ud83d\ude00", '
                        rb'"max_tokens": 2}', timeout=30)
    assert answer.status_code == 200 and answer.json()["usage"]["prompt_tokens"] == 4  # the emoji's UTF-8 bytes


@pytest.mark.parametrize("depth", [960, 1000, 5000])
def test_deep_nesting_is_a_400(server, depth):
    for raw in (b"[" * depth + b"]" * depth, b'{"model": "tiny", "prompt": "hi", "logit_bias": ' + b'{"a": ' * depth
                + b"1" + b"}" * depth + b"}"):
        answer = httpx.post(f"{server.url}{COMPLETION}", content=raw, timeout=10)
        assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]["message"], answer.text


def test_a_content_length_over_the_cap_is_refused_before_any_byte_is_read(server):
    """10 GB announced, nothing sent: a 413 at once, and the connection closed."""
    start = time.monotonic()
    answer = exchange(server, post(COMPLETION, b"", {"content-length": "10000000000"}), timeout_s=5)
    assert status_of(answer) == 413 and time.monotonic() - start < 2
    assert "larger than" in error_of(answer)["message"]


def test_a_body_without_length_is_cut_at_the_cap(server):
    """Chunked, four times the cap: a 413 once the cap is passed, the rest never read."""
    head = (f"POST {COMPLETION} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            "transfer-encoding: chunked\r\n\r\n").encode()
    chunk = b"%x\r\n%s\r\n" % (8192, b" " * 8192)
    answer = exchange(server, head + chunk * (4 * MAX_BODY // 8192) + b"0\r\n\r\n", timeout_s=5)
    assert status_of(answer) == 413


def test_a_body_that_never_ends_is_a_408_after_the_body_timeout(server):
    start = time.monotonic()
    answer = exchange(server, post(COMPLETION, b'{"model": "tiny"', {"content-length": "100"}), timeout_s=10)
    assert status_of(answer) == 408 and LIMITS.body_timeout_s <= time.monotonic() - start < LIMITS.body_timeout_s + 3
    assert "body" in error_of(answer)["message"]


def test_slow_headers_are_cut_at_the_header_timeout_while_grpc_serves(server, generator):
    """A slowloris: 60 connections that send headers a byte at a time. Each is answered 408 and closed
    by the header timeout (they are all gone soon after it); meanwhile HTTP and gRPC requests are served."""
    from orchestrator import servicer
    from specpipe.serving.clients import GenerationClient
    from specpipe.serving.server import ServerConfig, serve

    socks = [connect(server) for _ in range(60)]
    start = time.monotonic()
    for sock in socks:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: t\r\nx-slow: ")
    with serve([servicer.service(generator)], ServerConfig(port=0)) as grpc_server, \
            GenerationClient(grpc_server.address, timeout_s=30) as client:
        assert len(list(client.generate(token_ids=[1, 2, 3], max_new_tokens=4))) >= 1
        assert_healthy(server)
        for sock in socks[:5]:  # still trickling: it makes no difference
            with contextlib.suppress(OSError):
                sock.sendall(b"a")
        answers = [read_all(sock, LIMITS.header_timeout_s + 5) for sock in socks]
    assert all(status_of(answer) == 408 for answer in answers), {status_of(a) for a in answers}
    assert time.monotonic() - start < LIMITS.header_timeout_s + 5
    assert wait_until(lambda: server.connections == 0, 5)
    for sock in socks:
        sock.close()


def test_a_connection_flood_is_capped_and_grpc_keeps_serving(generator):
    """Beyond max_connections a connection is answered 503 and closed at once; the connections below the
    cap, the gRPC server beside it and the HTTP API once the flood ends all serve."""
    from orchestrator import servicer
    from specpipe.serving.clients import GenerationClient
    from specpipe.serving.server import ServerConfig, serve

    limits = HttpLimits(header_timeout_s=30.0, max_connections=16)
    with api(generator, limits=limits) as server, contextlib.ExitStack() as flood:
        socks = [flood.enter_context(connect(server)) for _ in range(16)]
        assert wait_until(lambda: server.connections == 16, 5)
        over = [exchange(server, b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n", timeout_s=5) for _ in range(20)]
        assert all(status_of(answer) == 503 for answer in over)
        assert "connections" in error_of(over[0])["message"]
        with serve([servicer.service(generator)], ServerConfig(port=0)) as grpc_server, \
                GenerationClient(grpc_server.address, timeout_s=30) as client:
            assert len(list(client.generate(token_ids=[1, 2, 3], max_new_tokens=4))) >= 1
        socks[0].sendall(b"GET /health HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")  # below the cap: served
        assert status_of(read_all(socks[0], 2)) == 200
        flood.close()
        assert wait_until(lambda: server.connections == 0, 5)
        assert_healthy(server)


def disconnect_storm(server, clients: int, max_tokens: int) -> None:
    """clients that each send a request and vanish: streamed ones after the first bytes of the answer
    or at once, non-streamed ones once their generation runs or at once."""
    def vanish(i: int) -> None:
        with connect(server) as sock:
            sock.sendall(post(COMPLETION, json.dumps(body(max_tokens=max_tokens, stream=bool(i % 2))).encode()))
            if i % 4 == 1:
                sock.settimeout(30)
                with contextlib.suppress(OSError):
                    sock.recv(1)
            elif i % 4 == 2:
                time.sleep(0.2)

    threads = [threading.Thread(target=vanish, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def test_a_disconnect_storm_releases_everything_quietly(server, generator, caplog):
    """Clients that send a request and vanish (streamed or not, some before any token): every generation
    ends after its current round and releases its sessions; each is one structured log line (no
    traceback, no warning); the server is healthy afterwards."""
    caplog.set_level(logging.INFO)
    disconnect_storm(server, 32, max_tokens=1500)
    assert wait_until(lambda: not generator.verifier._sessions, 30)
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not problems, [(r.name, r.getMessage()) for r in problems[:3]]
    gone = [r for r in caplog.records if r.getMessage() == "client went away"]
    assert len(gone) >= 24 and all(r.phase in ("queued", "generating", "streaming") for r in gone)


@pytest.mark.slow
def test_memory_stays_bounded_under_a_400_mb_body_and_a_disconnect_storm(generator):
    """With the default body cap (8 MiB), resident memory grows by less than MEMORY_BOUND_MB while a
    400 MB body is sent, announced or not (chunked: cut at the cap), and while 400 clients vanish
    mid-request."""
    import psutil

    process = psutil.Process()
    with api(generator) as server:
        start_rss = process.memory_info().rss
        for length in ("content-length: 400000000", "transfer-encoding: chunked"):
            with connect(server, 60) as sock:
                sock.sendall((f"POST {COMPLETION} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
                              f"{length}\r\n\r\n").encode())
                chunk, sent = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20)), 0
                with contextlib.suppress(OSError):  # the server answers 413 and closes long before the end
                    for sent in range(400):
                        sock.sendall(chunk)
                assert status_of(read_all(sock, 10)) == 413 and sent < 400
        after_body = process.memory_info().rss
        disconnect_storm(server, 400, max_tokens=300)
        assert wait_until(lambda: not generator.verifier._sessions, 120)
        after_storm = process.memory_info().rss
        assert_healthy(server)
    grown_mb = (max(after_body, after_storm) - start_rss) / 2**20
    print(f"resident memory: {start_rss / 2**20:.0f} MB at the start, {after_body / 2**20:.0f} MB after the bodies, "
          f"{after_storm / 2**20:.0f} MB after the storm")
    assert grown_mb < MEMORY_BOUND_MB, f"resident memory grew {grown_mb:.0f} MB"


def test_an_abandoned_non_streamed_request_is_cancelled(server, generator):
    """A chat with no max_tokens runs to the end of the window (ignore_eos: whatever the model ends
    with, here about 2,000 tokens): its client leaving ends it within a few rounds."""
    from specpipe.runtime import metrics

    emitted = metrics.EMITTED_TOKENS.labels(drafter="none")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "temperature": 0, "ignore_eos": True}
    with connect(server) as sock:
        sock.sendall(post("/v1/chat/completions", json.dumps(chat).encode()))
        assert wait_until(lambda: len(generator.verifier._sessions) == 1, 10)
        before = emitted._value.get()
    assert wait_until(lambda: not generator.verifier._sessions, 10)
    assert emitted._value.get() - before < 500


def test_a_full_queue_over_http_is_a_429_exactly_when_grpc_gets_resource_exhausted(generator):
    """max_sessions 1, max_queue 2: HTTP and gRPC requests wait in one queue, which the queue depth
    metric counts; a request beyond it is refused at once on either API (429 with Retry-After,
    RESOURCE_EXHAUSTED); a queued HTTP client that leaves frees its place; the queued run in turn."""
    from orchestrator import servicer
    from specpipe.core.errors import ResourceExhausted
    from specpipe.runtime import metrics
    from specpipe.serving.clients import GenerationClient
    from specpipe.serving.server import ServerConfig, serve

    admission = Admission(AdmissionConfig(max_sessions=1, max_queue=2))
    depth = metrics.QUEUE_DEPTH.labels(role="orchestrator")
    with api(generator, admission) as server, \
            serve([servicer.service(generator, admission)], ServerConfig(port=0, max_workers=8)) as grpc_server, \
            GenerationClient(grpc_server.address, timeout_s=60) as client:
        with admission.admit():  # the one slot is taken
            queued_grpc: list = []
            grpc_waiter = threading.Thread(target=lambda: queued_grpc.extend(
                client.generate(token_ids=[1, 2], max_new_tokens=3)))
            grpc_waiter.start()
            leaver = connect(server)  # an HTTP client queued second, who leaves
            leaver.sendall(post(COMPLETION, json.dumps(body()).encode()))
            assert wait_until(lambda: admission.waiting == 2, 10) and depth._value.get() == 2
            refused = httpx.post(f"{server.url}{COMPLETION}", json=body(), timeout=10)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["type"] == "rate_limit_exceeded"
            with pytest.raises(ResourceExhausted):
                list(client.generate(token_ids=[1, 2], max_new_tokens=3))
            leaver.close()
            assert wait_until(lambda: admission.waiting == 1, 10)
            queued_http = threading.Thread(target=lambda: queued_grpc.append(
                httpx.post(f"{server.url}{COMPLETION}", json=body(), timeout=60).status_code))
            queued_http.start()
            assert wait_until(lambda: admission.waiting == 2, 10)
        grpc_waiter.join(60)
        queued_http.join(60)
        assert sum(len(c.token_ids) for c in queued_grpc[:-1]) == 3 and queued_grpc[-1] == 200
        assert admission.running == 0 and admission.waiting == 0 and depth._value.get() == 0
