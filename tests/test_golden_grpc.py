"""Golden tests over real gRPC on loopback: client -> orchestrator server -> verifier and drafter
servers (tiny preset). Same tokens as the verifier's own greedy generate(), and, when sampling,
the same tokens as the embedded deployment for the same seed."""

import pytest

from specpipe.core.types import GenerationRequest, SamplingParams, SpeculationOptions
from tests.golden import GOLDEN_PROMPTS, reference_greedy, run
from tests.grpc_harness import shared_tiny_cluster

MAX_NEW_TOKENS = 40
SHAPES = {
    "verifier only": SpeculationOptions(drafter="none", draft_len=4, width=1),
    "chain k=4": SpeculationOptions(drafter="model", draft_len=4, width=1, adaptive="off"),
    "tree k=3 width=3": SpeculationOptions(drafter="model", draft_len=3, width=3, adaptive="off"),
}


@pytest.fixture(scope="module")
def cluster():
    return shared_tiny_cluster()


def remote_tokens(cluster, ids, max_new_tokens, speculation, sampling=SamplingParams()):
    chunks = list(cluster.generation_client.generate(token_ids=ids, max_new_tokens=max_new_tokens,
                                                     sampling=sampling, speculation=speculation))
    return [t for c in chunks for t in c.token_ids], chunks


@pytest.mark.parametrize("speculation", SHAPES.values(), ids=SHAPES.keys())
def test_grpc_speculative_greedy_equals_verifier_greedy(cluster, speculation):
    accepted = 0
    for prompt in GOLDEN_PROMPTS:
        ids = cluster.generator.encode(prompt=prompt)
        tokens, chunks = remote_tokens(cluster, ids, MAX_NEW_TOKENS, speculation)
        assert tokens == reference_greedy(cluster.verifier.model, ids, MAX_NEW_TOKENS), prompt
        accepted += sum(c.round.accepted for c in chunks)
    assert (accepted > 0) == (speculation.drafter != "none")


def test_grpc_chat_prompt_text_equals_embedded(cluster):
    remote = "".join(c.text for c in cluster.generation_client.generate(messages=[("user", "hello there")],
                                                                       max_new_tokens=24))
    ids = cluster.generator.encode(messages=[("user", "hello there")])
    _, chunks = run(cluster.generator, GenerationRequest(ids, 24, speculation=cluster.generator.defaults))
    assert remote == "".join(c.text for c in chunks)


@pytest.mark.parametrize("seed", [1, 7, 12345])  # seed 0 = none given: a random one (tests/test_lifecycle.py)
def test_grpc_sampling_same_seed_as_embedded(cluster, seed):
    sampling = SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=seed)
    speculation = SpeculationOptions(drafter="model", draft_len=4, width=1, adaptive="off")
    ids = cluster.generator.encode(prompt=GOLDEN_PROMPTS[seed % len(GOLDEN_PROMPTS)])
    embedded, _ = run(
        cluster.generator, GenerationRequest(ids, MAX_NEW_TOKENS, sampling=sampling, speculation=speculation)
    )
    remote, _ = remote_tokens(cluster, ids, MAX_NEW_TOKENS, speculation, sampling)
    assert remote == embedded
