"""The Ray Serve application (deploy/ray) on a local Ray with the tiny preset, through Serve's gRPC
proxy with the public GenerationClient: speculative output == the verifier's own greedy output for
the model and n-gram drafters with the branch schedule; two concurrent sessions on two verifier
replicas, both lossless; health and error statuses as against `specpipe up`. Tracing is on in every
deployment (to a file): all of that holds with it, and a generation is one trace across them."""

from __future__ import annotations

import os
import pathlib
import socket
import threading

import pytest

from specpipe.core import errors
from specpipe.core.types import SpeculationOptions
from specpipe.engine.models import tiny_model, tiny_tokenizer
from specpipe.serving.clients import GenerationClient
from tests.golden import GOLDEN_PROMPTS, reference_greedy

ray = pytest.importorskip("ray", reason="the ray extra (pip install -e '.[ray]') runs the Ray Serve tests")

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
MAX_NEW_TOKENS = 32
SPANS = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"specpipe-ray-spans-{os.getpid()}.jsonl"
SETTINGS = {"preset": "tiny", "threads": 1, "tracing": "on", "trace_file": str(SPANS),
            "verifier_weights": "fp32"}  # the eager reference's model
BRANCH = {drafter: SpeculationOptions(drafter=drafter, draft_len=4, schedule="branch", adaptive="off")
          for drafter in ("model", "ngram")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_config(verifier_replicas: int) -> dict:
    """deploy/ray/serve.yaml on free ports, fixed replica counts, small CPU shares."""
    from specpipe.rayserve import launch

    config = launch.load_config()
    config["http_options"]["port"] = free_port()
    config["grpc_options"]["port"] = free_port()
    app = config["applications"][0]
    app["args"] = {"verifier": SETTINGS, "drafter": SETTINGS, "orchestrator": {**SETTINGS, "rpc_timeout": 60}}
    for deployment in app["deployments"]:
        deployment.pop("autoscaling_config")
        deployment["num_replicas"] = verifier_replicas if deployment["name"] == "Verifier" else 1
        deployment["ray_actor_options"]["num_cpus"] = 0.25
    return config


def start_local_ray(**kwargs) -> None:
    """ray.init, once more if the start timed out: Ray gives a new raylet a fixed 30 s to register with
    its GCS (ray/_private/node.py), which a loaded 2-core CI machine has missed."""
    try:
        ray.init(**kwargs)
    except Exception as err:
        if "timed out during startup" not in str(err):
            raise
        import psutil

        for child in psutil.Process().children(recursive=True):  # that start's GCS, raylet and helpers
            try:
                if child.name().startswith(("gcs_server", "raylet", "ray::")) or "site-packages/ray/" in " ".join(
                    child.cmdline()
                ):
                    child.kill()
            except psutil.Error:  # gone already
                pass
        ray.shutdown()
        ray.init(**kwargs)


@pytest.fixture(scope="module")
def app():
    """The application on a fresh local Ray (2 CPUs), shut down after the module."""
    from specpipe.rayserve import launch

    config = tiny_config(verifier_replicas=2)
    # Ray's workers import specpipe from this checkout, whatever is installed
    start_local_ray(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))}},
    )
    try:
        launch.start(config, timeout_s=180)
        HTTP["url"] = f"http://127.0.0.1:{config['http_options']['port']}"  # Serve's HTTP proxy
        with GenerationClient(f"127.0.0.1:{config['grpc_options']['port']}", timeout_s=120) as client:
            yield client
    finally:  # the whole local Ray goes (serve.shutdown() would first wait for a replica being replaced)
        ray.shutdown()
        SPANS.unlink(missing_ok=True)


HTTP: dict[str, str] = {}


@pytest.fixture(scope="module")
def references():
    model, tokenizer = tiny_model(), tiny_tokenizer()
    out = {}
    for prompt in GOLDEN_PROMPTS[:3]:
        ids = tuple(tokenizer(prompt)["input_ids"])
        out[prompt] = (ids, reference_greedy(model, ids, MAX_NEW_TOKENS))
    return out


def generate(client, ids, speculation, max_new_tokens=MAX_NEW_TOKENS):
    chunks = list(client.generate(token_ids=ids, max_new_tokens=max_new_tokens, speculation=speculation))
    return [t for c in chunks for t in c.token_ids], chunks


@pytest.mark.slow  # a local Ray cluster: about a minute on 2 cores
@pytest.mark.parametrize("drafter", BRANCH)
def test_ray_branch_schedule_equals_verifier_greedy(app, references, drafter):
    accepted = 0
    for prompt, (ids, expected) in references.items():
        tokens, chunks = generate(app, ids, BRANCH[drafter])
        assert tokens == expected, prompt
        accepted += sum(c.round.accepted for c in chunks)
    assert accepted > 0  # the drafts were verified, not skipped


@pytest.mark.slow
def test_ray_serves_the_openai_api_through_its_http_proxy(app, references):
    """The OpenAI-compatible API on Serve's HTTP proxy: the same tokens as the gRPC proxy's."""
    import httpx

    ids, expected = next(iter(references.values()))
    tokens, chunks = generate(app, ids, BRANCH["ngram"])
    answer = httpx.post(f"{HTTP['url']}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": list(ids), "max_tokens": MAX_NEW_TOKENS, "temperature": 0, "drafter": "ngram"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == "".join(c.text for c in chunks)
    assert answer.json()["usage"]["completion_tokens"] == len(expected)
    assert httpx.get(f"{HTTP['url']}/v1/models").json()["data"][0]["id"] == "tiny"
    refused = httpx.post(f"{HTTP['url']}/v1/completions", json={"model": "tiny", "prompt": "hi", "n": 2})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"  # the same app as `specpipe up`'s
    assert httpx.put(f"{HTTP['url']}/v1/models").json()["error"]["type"] == "invalid_request_error"


@pytest.mark.slow
def test_ray_concurrent_sessions_pinned_apart_and_a_lost_replica(app, references):
    """Session 2 starts while session 1 runs: the router puts it on the other (least loaded) verifier
    replica, and both are lossless. Then session 1's replica dies mid-generation: session 1 is
    prefilled again on the other replica from the context the orchestrator recorded, and not a
    token is lost, repeated or changed."""
    from ray import serve

    (ids1, _), (ids2, expected2) = list(references.values())[:2]
    long_tokens = 400  # session 1 outlives session 2 and the kill by far
    expected1 = reference_greedy(tiny_model(), ids1, long_tokens)
    placements = serve.get_app_handle("specpipe").placements
    tokens1: list[int] = []
    first_chunk = threading.Event()

    def session1():
        for chunk in app.generate(token_ids=ids1, max_new_tokens=long_tokens, speculation=BRANCH["model"],
                                  request_id="one"):
            tokens1.extend(chunk.token_ids)
            first_chunk.set()

    thread = threading.Thread(target=session1)
    thread.start()
    assert first_chunk.wait(120)
    tokens2, _ = generate(app, ids2, BRANCH["ngram"])
    assert tokens2 == expected2

    recorded = placements.remote().result(timeout_s=30)
    one = next(p for p in recorded if p.session_id.startswith("one-"))
    two = next(p for p in recorded if p.session_id.startswith("req-") and p.opened_s > one.opened_s)
    assert one.released_s is None and two.released_s is not None  # session 1 still runs: they overlapped
    assert one.replica != two.replica

    ray.kill(ray.get_actor(one.replica, namespace="serve"), no_restart=True)
    thread.join(120)
    assert tokens1 == expected1
    history = [p.replica for p in placements.remote().result(timeout_s=30) if p.session_id == one.session_id]
    assert history[0] == one.replica and history[-1] == two.replica  # re-prefilled on the live replica


# The local Ray cluster alone takes 40 s to start (the router and manifests: test_ray_router.py, test_k8s_ray.py).
@pytest.mark.slow
def test_ray_health_and_errors(app):
    from ray.serve.generated import serve_pb2, serve_pb2_grpc

    assert app.health() == "SERVING"  # grpc.health.v1, answered by the orchestrator deployment
    stub = serve_pb2_grpc.RayServeAPIServiceStub(app._channel)
    assert stub.Healthz(serve_pb2.HealthzRequest(), timeout=30).message  # Serve's own health
    with pytest.raises(errors.InvalidArgument, match="max_new_tokens"):
        generate(app, (1, 2, 3), BRANCH["model"], max_new_tokens=0)
    with pytest.raises(errors.InvalidArgument, match="unknown drafter"):
        generate(app, (1, 2, 3), SpeculationOptions(drafter="bogus", schedule="branch"))


@pytest.mark.slow
def test_ray_a_generation_is_one_trace_across_the_deployments(app):
    """A gRPC client's traceparent reaches the orchestrator through Serve's proxy, and the handles carry
    each call's trace context: the orchestrator's generation, the verifier's and the
    drafter's deployment calls (and their forwards) in one trace, each span's parent in it."""
    import json
    import time

    generate(app, tuple(b"def f(x):"), BRANCH["model"], max_new_tokens=8)
    trace_id, parent_id = "%032x" % 0x5EC1A1, "%016x" % 0x9A2E47
    list(app.generate(token_ids=tuple(b"print(1)"), max_new_tokens=8, speculation=BRANCH["model"],
                      request_id="ray-traced", traceparent=f"00-{trace_id}-{parent_id}-01"))
    expected = {("specpipe-orchestrator", "round"), ("specpipe-verifier", "Verifier.verify"),
                ("specpipe-verifier", "forward"), ("specpipe-drafter", "Drafter.propose")}
    deadline = time.monotonic() + 60
    while True:  # the replicas export in batches (every few seconds), a parent after its children
        spans = [json.loads(line) for line in SPANS.read_text().splitlines()] if SPANS.exists() else []
        roots = [s for s in spans
                 if s["name"] == "generation" and s["attributes"]["specpipe.request_id"] == "ray-traced"]
        trace = [s for s in spans if roots and s["context"]["trace_id"] == roots[0]["context"]["trace_id"]]
        names = {(s["resource"]["attributes"]["service.name"], s["name"]) for s in trace}
        ids = {s["context"]["span_id"] for s in trace}
        orphans = [s["name"] for s in trace if s["name"] != "generation" and s["parent_id"] not in ids]
        if (expected <= names and not orphans) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert expected <= names, names
    assert not orphans
    assert roots[0]["context"]["trace_id"] == f"0x{trace_id}" and roots[0]["parent_id"] == f"0x{parent_id}"
