"""One drafter service serving several draft methods (model, ngram, hybrid) over one n-gram store:
each method answers over gRPC as it does in process, sources included; an unknown method is
FAILED_PRECONDITION; the orchestrator counts drafted and accepted tokens by source."""

from __future__ import annotations

import pytest

from cache_service.memory import InMemoryNgramCache
from drafter_service import servicer as drafter_servicer
from orchestrator.generator import Generator
from specpipe.app.wiring import build_drafters
from specpipe.core.errors import FailedPrecondition
from specpipe.core.types import DRAFT_SOURCES, GREEDY, GenerationRequest, ProposeRequest, SpeculationOptions
from specpipe.runtime import metrics
from specpipe.serving.clients import DrafterClient
from specpipe.serving.server import ServerConfig, serve
from tests.golden import run

CONTEXT = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3]


@pytest.fixture(scope="module")
def service(tiny_drafter):
    store = InMemoryNgramCache()  # empty: the n-gram drafts below come from CONTEXT itself
    drafters = build_drafters(("model", "ngram", "hybrid"), store, tiny_drafter, tiny_drafter.info())
    with serve([drafter_servicer.service(drafters)], ServerConfig(host="127.0.0.1", port=0, grace_s=1.0)) as server:
        yield drafters, server.address


@pytest.mark.parametrize("method", ["model", "ngram", "hybrid"])
def test_each_method_answers_as_in_process(service, method):
    drafters, address = service
    with DrafterClient(address, timeout_s=30, method=method) as client:
        assert client.info().methods == ("model", "ngram", "hybrid")
        remote = client.propose(ProposeRequest("s", CONTEXT, 4, 1, GREEDY))
    local = drafters[method].propose(ProposeRequest("s", CONTEXT, 4, 1, GREEDY))
    same = ("tokens", "parents", "q", "sources", "runner_up")  # the probabilities are checked in test_contract_drafter
    assert all(getattr(remote.draft, name) == getattr(local.draft, name) for name in same)
    assert len(remote.draft) > 0
    assert set(remote.draft.node_sources()) <= set(DRAFT_SOURCES)
    if method == "ngram":
        assert remote.draft.tokens == (4, 5, 6, 1) and remote.draft.sources == ("context",) * 4


def test_hybrid_extends_the_model_chain_from_the_store(service):
    drafters, _ = service
    model = drafters["model"].propose(ProposeRequest("s", CONTEXT, 2, 1, GREEDY)).draft
    hybrid = drafters["hybrid"].propose(ProposeRequest("s", CONTEXT, 2, 1, GREEDY))
    assert hybrid.draft.tokens[:2] == model.tokens and hybrid.draft.sources[:2] == ("model", "model")
    assert len(hybrid.draft) <= 4  # nodes_per_level * draft_len


def test_unknown_method_is_failed_precondition(service):
    _, address = service
    with (
        DrafterClient(address, timeout_s=30, method="eagle") as client,
        pytest.raises(FailedPrecondition, match="eagle"),
    ):
        client.propose(ProposeRequest("s", CONTEXT, 4, 1, GREEDY))


def test_orchestrator_counts_tokens_by_source(tiny_tokenizer, tiny_verifier, tiny_drafter):
    store = InMemoryNgramCache()
    drafters = build_drafters(("hybrid",), store, tiny_drafter, tiny_verifier.info())
    generator = Generator(tiny_tokenizer, tiny_verifier, drafters, cache=store)

    def counts(counter):
        return {s: counter.labels(drafter="hybrid", source=s)._value.get() for s in DRAFT_SOURCES}

    drafted, accepted = counts(metrics.SOURCE_DRAFTED), counts(metrics.SOURCE_ACCEPTED)
    ids = tuple(tiny_tokenizer("1, 2, 3, 4, 5, 1, 2, 3, 4, 5,")["input_ids"])
    _, chunks = run(generator, GenerationRequest(ids, 40, speculation=SpeculationOptions("hybrid", 4, adaptive="off")))
    new_drafted = {s: v - drafted[s] for s, v in counts(metrics.SOURCE_DRAFTED).items()}
    new_accepted = {s: v - accepted[s] for s, v in counts(metrics.SOURCE_ACCEPTED).items()}
    assert sum(new_drafted.values()) == sum(c.round.drafted for c in chunks)
    assert sum(new_accepted.values()) == sum(c.round.accepted for c in chunks)
    assert new_drafted["model"] > 0 and new_drafted["context"] > 0
    assert all(new_accepted[s] <= new_drafted[s] for s in DRAFT_SOURCES)
