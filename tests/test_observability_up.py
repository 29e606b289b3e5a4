"""Tracing and metrics across processes: `specpipe up --preset tiny --tracing on --trace-file F --cache
redis` (orchestrator, verifier, drafter and a redis-server, each its own process). A generation is one
trace whose spans come from every service, each span's parent in the trace; its request id is in the
orchestrator's log line and on the trace, with the trace's id; the TTFT histogram's exemplar names the
trace; and every metric the dashboard and the alerts name is in the services' live scrape."""

from __future__ import annotations

import json
import secrets
import signal
import urllib.request

import pytest

from specpipe.core.types import SpeculationOptions
from specpipe.serving.clients import GenerationClient
from tests.test_contract_generation import specpipe_up
from tests.test_observability import all_expressions, exported_names, unexported

SPEC = SpeculationOptions(drafter="hybrid", draft_len=3, width=1, adaptive="off")


def scrape(port: int, openmetrics: bool = False) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if openmetrics:
        request.add_header("Accept", "application/openmetrics-text; version=1.0.0")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.read().decode()


def services(lines: list[str]) -> dict[str, tuple[str, int]]:
    """name -> (address, metrics port) from `specpipe up`'s table."""
    rows = [line.split() for line in lines]
    return {r[0]: (r[1], int(r[2])) for r in rows if len(r) >= 4 and r[2].isdigit()}


@pytest.fixture(scope="module")
def traced_up(tmp_path_factory):
    """One traced `specpipe up`, a generation through it (with a client's traceparent) and one more that
    the orchestrator begins itself (--trace-ratio 1); the processes stopped (their spans flushed)."""
    from specpipe.devtools import local_redis

    if local_redis.find_binary() is None:
        pytest.skip(local_redis.NOT_FOUND)
    tmp_path = tmp_path_factory.mktemp("up")
    spans_path = tmp_path / "spans.jsonl"
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    flags = ("--tracing", "on", "--trace-file", str(spans_path), "--cache", "redis", "--drafter", "hybrid",
             "--log-level", "INFO")
    with specpipe_up(tmp_path, *flags) as (proc, lines):
        table = services(lines)
        with GenerationClient(table["orchestrator"][0], timeout_s=120) as client:
            for _ in range(2):  # the second one drafts from what the first one taught the store
                chunks = list(client.generate(prompt="def add(a, b):\n    return a + b\n", max_new_tokens=24,
                                              speculation=SPEC, request_id="req-up-traced",
                                              traceparent=f"00-{trace_id}-{parent_id}-01"))
            list(client.generate(prompt="hello", max_new_tokens=6, speculation=SPEC, request_id="req-up-own"))
        scrapes = {name: scrape(port) for name, (_, port) in table.items()}
        exemplars = scrape(table["orchestrator"][1], openmetrics=True)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    spans = [json.loads(line) for line in spans_path.read_text().splitlines()]
    return {"spans": spans, "trace_id": trace_id, "parent_id": parent_id, "chunks": chunks, "scrapes": scrapes,
            "exemplars": exemplars, "log_dir": tmp_path}


@pytest.mark.slow  # four processes: about 40 s on two shared cores
def test_a_generation_is_one_trace_over_every_service(traced_up):
    spans = [s for s in traced_up["spans"] if s["context"]["trace_id"] == f"0x{traced_up['trace_id']}"]
    assert sum(len(c.token_ids) for c in traced_up["chunks"]) == 24
    services = {s["resource"]["attributes"]["service.name"] for s in spans}
    assert services == {"specpipe-orchestrator", "specpipe-verifier", "specpipe-drafter"}
    by_id = {s["context"]["span_id"]: s for s in spans}
    roots = [s for s in spans if s["parent_id"] not in by_id]
    assert {s["name"] for s in roots} == {"generation"}  # two generations, each a child of the client's span
    assert all(s["parent_id"] == f"0x{traced_up['parent_id']}" for s in roots)
    for span in spans:  # every other span's parent is in the trace, and started no later than it
        if span not in roots:
            parent = by_id[span["parent_id"]]
            assert parent["start_time"] <= span["start_time"], (parent["name"], span["name"])
    names = {(s["resource"]["attributes"]["service.name"].removeprefix("specpipe-"), s["name"]) for s in spans}
    assert {("orchestrator", n) for n in ("generation", "round", "draft", "verify", "prefill", "detokenize",
                                          "store.record_branches", "store.update_global")} <= names
    served = ("verify", "queue", "forward", "verdict", "/specpipe.v1.Verifier/Prefill")
    assert {("verifier", n) for n in served} <= names
    assert {("drafter", n) for n in ("/specpipe.v1.Drafter/Propose", "propose", "store.lookup")} <= names
    rounds = [s for s in spans if s["name"] == "round"]
    assert all({"specpipe.drafted", "specpipe.accepted", "specpipe.hit", "specpipe.batch.sessions"}
               <= set(r["attributes"]) for r in rounds)
    # the generation the orchestrator began itself is a trace of its own
    own = [s for s in traced_up["spans"] if s["name"] == "generation"
           and s["attributes"]["specpipe.request_id"] == "req-up-own"]
    assert len(own) == 1 and own[0]["parent_id"] is None


@pytest.mark.slow
def test_a_request_id_is_in_the_logs_and_the_trace_and_an_exemplar_names_the_trace(traced_up):
    trace_id = traced_up["trace_id"]
    generations = [s for s in traced_up["spans"] if s["name"] == "generation"
                   and s["attributes"]["specpipe.request_id"] == "req-up-traced"]
    assert generations and all(s["context"]["trace_id"] == f"0x{trace_id}" for s in generations)
    log = (traced_up["log_dir"] / "orchestrator.err").read_text().splitlines()
    lines = [json.loads(line) for line in log if line.startswith("{")]
    found = [line for line in lines if line.get("request_id") == "req-up-traced"]
    assert found and all(line["trace_id"] == trace_id and line["span_id"] for line in found)
    import re  # a bucket's exemplar is its last observation's: one of the traced generations'

    linked = {found for line in traced_up["exemplars"].splitlines() if line.startswith("specpipe_ttft_ms_bucket")
              for found in re.findall(r'trace_id="([0-9a-f]{32})"', line)}
    traced = {s["context"]["trace_id"].removeprefix("0x") for s in traced_up["spans"] if s["name"] == "generation"}
    assert linked and linked <= traced


@pytest.mark.slow
def test_every_metric_the_dashboard_and_the_alerts_name_is_in_the_live_scrape(traced_up):
    from prometheus_client.parser import text_string_to_metric_families

    names: dict[str, set[str]] = {}
    for text in traced_up["scrapes"].values():
        for name, labels in exported_names(text_string_to_metric_families(text)).items():
            names.setdefault(name, set()).update(labels)
    assert unexported(all_expressions(), names) == []
    assert names["specpipe_learned_store_tokens"] == {"tenant"}  # fed by the generations, labelled by a hash
    assert 'specpipe_learned_store_tokens{tenant="default"}' in traced_up["scrapes"]["orchestrator"]
