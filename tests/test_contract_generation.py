"""Contract of the public Generation API: the embedded Generator and the orchestrator over gRPC
(itself driving the verifier and drafter over gRPC) stream the same chunks and reject the same bad
requests; cancelling a stream releases its sessions; `specpipe up` runs and stops cleanly."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from specpipe.core.errors import DeadlineExceeded, InvalidArgument
from specpipe.core.types import GREEDY, GenerationRequest, SamplingParams, SpeculationOptions
from specpipe.serving.clients import GenerationClient, VerifierClient, channel
from specpipe.v1 import generation_pb2, generation_pb2_grpc
from tests.golden import reference_greedy
from tests.grpc_harness import assert_serving, shared_tiny_cluster, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=42)


@pytest.fixture(scope="module")
def cluster():
    return shared_tiny_cluster()


def embedded(generator):
    """GenerationClient.generate's signature over the in-process Generator."""

    def generate(prompt=None, messages=None, token_ids=None, max_new_tokens=64, stop=(), sampling=GREEDY,
                 speculation=None, request_id=""):
        prompt_ids = generator.encode(prompt=prompt, messages=messages, token_ids=token_ids)
        return generator.generate(GenerationRequest(prompt_ids, max_new_tokens, request_id, tuple(stop), sampling,
                                                    speculation or generator.defaults))

    return generate


@pytest.fixture(params=["embedded", "grpc"])
def generate(request, cluster):
    yield embedded(cluster.generator) if request.param == "embedded" else cluster.generation_client.generate
    if request.param == "grpc":  # whatever the test sent, the orchestrator still serves
        assert_serving(cluster.generation_client, "specpipe.v1.Generation")
        chunks = list(cluster.generation_client.generate(token_ids=[1, 2, 3], max_new_tokens=3))
        assert sum(len(c.token_ids) for c in chunks) == 3 and chunks[-1].finish_reason == "length"


def comparable(chunks):
    """Everything but timings and the server-made request id."""
    return [(c.token_ids, c.text, c.finish_reason, c.round.drafted, c.round.accepted) for c in chunks]


CALLS = {
    "prompt": dict(prompt="def fibonacci(n):", max_new_tokens=24),
    "messages": dict(messages=[("system", "be brief"), ("user", "hello")], max_new_tokens=12),
    "token_ids": dict(token_ids=[72, 101, 108, 108, 111], max_new_tokens=16),
    # sequential: under the branch schedule a round's draft depends on whether its pre-draft was ready (timing)
    "tree": dict(prompt="Once upon a time", max_new_tokens=16,
                 speculation=SpeculationOptions("model", 3, 2, schedule="sequential", adaptive="off")),
    "no drafter": dict(prompt="SELECT name", max_new_tokens=8, speculation=SpeculationOptions("none", 4, 1)),
    "sampled": dict(prompt="The capital of", max_new_tokens=16, sampling=SAMPLED),
    "stop string": dict(token_ids=[72, 101, 108, 108, 111], max_new_tokens=32, stop=("v",)),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_same_chunks_embedded_and_grpc(cluster, call):
    remote = list(cluster.generation_client.generate(**call))
    local = list(embedded(cluster.generator)(**call))
    assert comparable(remote) == comparable(local)
    assert remote[-1].finish_reason in (("stop",) if call.get("stop") else ("eos", "length"))
    assert len({c.request_id for c in remote}) == 1


def test_greedy_over_grpc_equals_the_verifier_alone(cluster):
    prompt_ids = cluster.generator.encode(prompt="import numpy as np\n\nx = np.")
    tokens = [
        t for c in cluster.generation_client.generate(token_ids=prompt_ids, max_new_tokens=20) for t in c.token_ids
    ]
    assert tokens == reference_greedy(cluster.verifier.model, prompt_ids, 20)


def test_specpipe_generate_addr_equals_the_verifier_alone(cluster, capsys):
    """The CLI's client sets no deadline: the orchestrator must still prefill over gRPC (a call without
    a deadline once reached the verifier as one already passed)."""
    import json

    from specpipe.cli.main import main

    assert main(["generate", "--addr", cluster.generation_server.address, "--prompt", "def fibonacci(n):", "--raw",
                 "--max-new-tokens", "12", "--json", "--drafter", "model"]) == 0
    prompt_ids = cluster.generator.encode(prompt="def fibonacci(n):")
    assert json.loads(capsys.readouterr().out)["token_ids"] == reference_greedy(cluster.verifier.model, prompt_ids, 12)


def test_request_id_is_echoed(generate):
    assert {c.request_id for c in generate(token_ids=[5, 6], max_new_tokens=4, request_id="rid-7")} == {"rid-7"}


BAD = [
    ("empty prompt", dict(prompt=""), InvalidArgument, "prompt is empty"),
    ("empty messages", dict(messages=[]), InvalidArgument, "empty"),
    ("empty token ids", dict(token_ids=[]), InvalidArgument, "prompt is empty"),
    ("token id >= vocab", dict(token_ids=[1, 257]), InvalidArgument, "outside the vocabulary"),
    ("max_new_tokens 0", dict(max_new_tokens=0), InvalidArgument, "max_new_tokens"),
    ("max_new_tokens < 0", dict(max_new_tokens=-5), InvalidArgument, "max_new_tokens"),
    ("beyond the context window", dict(max_new_tokens=4096), InvalidArgument, "context window"),
    ("temperature < 0", dict(sampling=SamplingParams(temperature=-0.1)), InvalidArgument, "temperature"),
    ("top_p > 1", dict(sampling=SamplingParams(temperature=1.0, top_p=1.5)), InvalidArgument, "top_p"),
    ("top_p < 0", dict(sampling=SamplingParams(temperature=1.0, top_p=-0.2)), InvalidArgument, "top_p"),
    (
        "negative draft_len",
        dict(speculation=SpeculationOptions("model", -1, 1, adaptive="off")),
        InvalidArgument,
        "draft_len",
    ),
    ("unknown drafter", dict(speculation=SpeculationOptions("magic", 4, 1)), InvalidArgument, "unknown drafter"),
    ("empty stop string", dict(stop=("",)), InvalidArgument, "stop"),
]


@pytest.mark.parametrize("change, error, message", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_request(generate, change, error, message):
    call = dict(token_ids=[10, 20, 30], max_new_tokens=8) | change
    if {"prompt", "messages"} & change.keys():
        del call["token_ids"]
    with pytest.raises(error, match=message):
        list(generate(**call))


def test_unset_input_is_invalid_argument(cluster):
    stub = generation_pb2_grpc.GenerationStub(channel(cluster.generation_server.address))
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(generation_pb2.GenerateRequest(max_new_tokens=4), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no input" in caught.value.details()
    assert_serving(cluster.generation_client)


def test_cancelled_stream_releases_its_sessions(cluster):
    sessions = cluster.verifier._sessions  # white box: which sessions the verifier still holds
    chunks = cluster.generation_client.generate(prompt="a long one", max_new_tokens=1500, request_id="cancel-me")
    next(chunks)
    assert open_sessions(sessions, "cancel-me")
    chunks.close()  # cancels the RPC
    assert wait_until(lambda: not open_sessions(sessions, "cancel-me"), timeout_s=10), "verifier session not released"
    assert_serving(cluster.generation_client)


def test_deadline_exceeded_releases_its_sessions(cluster):
    sessions = cluster.verifier._sessions
    with GenerationClient(cluster.generation_server.address, timeout_s=0.3) as client:
        with pytest.raises(DeadlineExceeded):
            list(client.generate(prompt="a long one", max_new_tokens=1500, request_id="too-slow"))
    assert wait_until(lambda: not open_sessions(sessions, "too-slow"), timeout_s=10), "verifier session not released"


def open_sessions(sessions, request_id: str) -> list[str]:
    """Verifier sessions of a request (a session id is the request id plus a unique suffix)."""
    return [s for s in list(sessions) if s.startswith(f"{request_id}-")]


def test_serve_orchestrator_needs_a_verifier_address(capsys, monkeypatch):
    from specpipe.cli.main import main

    monkeypatch.delenv("SPECPIPE_VERIFIER_ADDR", raising=False)
    assert main(["serve", "orchestrator", "--preset", "tiny"]) == 2
    assert "--verifier-addr is required" in capsys.readouterr().err
    assert main(["serve", "orchestrator", "--preset", "tiny", "--verifier-addr", "127.0.0.1:1",
                 "--drafter", "model"]) == 2  # the default n-gram drafter runs in the orchestrator itself
    assert "--drafter-addr is required" in capsys.readouterr().err


def read_until(proc, pattern: str, timeout_s: float) -> list[str]:
    """stdout lines of proc up to and including the first that matches pattern."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)  # EOF

    threading.Thread(target=pump, daemon=True).start()
    seen, deadline = [], time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"no {pattern!r} from `specpipe up` (rc {proc.poll()}); stdout so far: {seen}")


@contextlib.contextmanager
def specpipe_up(tmp_path, *flags: str):
    """`specpipe up --preset tiny` on free ports in a child process; yields (process, its output up to
    the "ready" line); kills it if the test left it running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specpipe.cli.main", "up", "--preset", "tiny", "--base-port", "0",
         "--log-dir", str(tmp_path), "--log-level", "WARNING", *flags],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        yield proc, read_until(proc, r"specpipe up: ready", timeout_s=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow  # three subprocesses
def test_specpipe_up_serves_and_stops_on_sigint(tmp_path):
    with specpipe_up(tmp_path, "--verifier-flags", "--max-sessions 3 --gather-grace 0.2") as (proc, lines):
        table = {line.split()[0]: line.split()[1] for line in lines if line.split()[:1] and
                 line.split()[0] in ("orchestrator", "verifier", "drafter")}
        assert set(table) == {"orchestrator", "verifier", "drafter"}
        with VerifierClient(table["verifier"], timeout_s=10) as verifier:
            assert verifier.load().max_sessions == 3  # --verifier-flags reached the verifier
        with GenerationClient(table["orchestrator"], timeout_s=60) as client:
            assert_serving(client, "specpipe.v1.Generation")
            chunks = list(client.generate(prompt="hello", max_new_tokens=6))
        assert sum(len(c.token_ids) for c in chunks) == 6 and chunks[-1].finish_reason == "length"
        # the OpenAI-compatible API, on by default: the same text as the gRPC API
        (url,) = [line.split()[-3].removesuffix("/v1") for line in lines if line.startswith("OpenAI-compatible API:")]
        import httpx

        answer = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 6,
                                                           "temperature": 0}, timeout=60).json()
        assert answer["choices"][0]["text"] == "".join(c.text for c in chunks)

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0, proc.stderr.read()
    for role in ("verifier", "drafter", "orchestrator"):  # the children are gone too
        assert "listening on" in (tmp_path / f"{role}.out").read_text()


@pytest.mark.slow  # two `specpipe up` runs with a local redis-server
def test_specpipe_up_learns_across_requests_by_default_and_not_with_learning_off(tmp_path):
    """What a user of `specpipe up --cache redis` sees: the same request again drafts from the first's
    output (far fewer rounds, the same tokens); with --learn-global off it does not."""
    from specpipe.engine.models import tiny_model

    prompt = tuple("def tokens_per_round(rounds):".encode())
    expected = reference_greedy(tiny_model(), prompt, 48)
    rounds = {}
    for learn in ("on", "off"):
        with specpipe_up(tmp_path / learn, "--cache", "redis", "--drafter", "ngram", "--learn-global", learn,
                         "--verifier-weights", "fp32") as (  # the eager reference's model
            proc,
            lines,
        ):
            table = {line.split()[0]: line.split()[1] for line in lines if line.split()[:1] == ["orchestrator"]}
            with GenerationClient(table["orchestrator"], timeout_s=60) as client:
                for attempt in range(2):
                    chunks = list(client.generate(token_ids=prompt, max_new_tokens=48))
                    assert [t for c in chunks for t in c.token_ids] == expected, (learn, attempt)
                    rounds[learn, attempt] = sum(c.round is not None for c in chunks)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0
    assert rounds["on", 1] * 3 <= rounds["on", 0], rounds  # the repeat drafts from the store
    assert rounds["off", 1] * 3 > rounds["off", 0], rounds
