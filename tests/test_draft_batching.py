"""Batched drafting (docs/batching.md): the model drafter runs the next step of every pending proposal
as one forward. A drafter only proposes, yet batching must not change its drafts either: a session's
drafts with batch mates equal its drafts alone (in process and over gRPC), the branch schedule's
concurrent proposals of one session equal fresh ones, the one-proposal-per-forward path drafts the
same, and 8 concurrent generations with the model and hybrid drafters equal verifier-only greedy."""

from __future__ import annotations

import itertools
import random
import threading

import pytest
import torch

from cache_service.memory import InMemoryNgramCache
from drafter_service.hybrid import HybridDrafter
from drafter_service.model_drafter import ModelDrafter
from drafter_service.ngram_drafter import NgramDrafter
from orchestrator.generator import Generator
from specpipe.config.presets import ModelSpec
from specpipe.config.services import BatchConfig
from specpipe.core.types import GREEDY, Draft, GenerationRequest, ProposeRequest, SamplingParams, SpeculationOptions
from specpipe.engine.batched import Segment, batched_forward
from specpipe.engine.kv import new_slot
from specpipe.engine.models import model_info, tiny_model
from specpipe.runtime import metrics
from tests.golden import reference_greedy, run
from tests.grpc_harness import shared_tiny_cluster

SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, seed=5)
_ids = itertools.count()


def _drafter(**kwargs) -> ModelDrafter:
    model = tiny_model(2)
    return ModelDrafter(model, model_info(ModelSpec("tiny", 2), model), **kwargs)


def _batch_counts() -> tuple[float, float]:
    """(forwards, proposals over all forwards) so far, from the drafter's batch histogram."""
    samples = {s.name: s.value for s in metrics.DRAFT_BATCH_SESSIONS.collect()[0].samples}
    return samples["specpipe_draft_batch_sessions_count"], samples["specpipe_draft_batch_sessions_sum"]


def _all_at_once(jobs) -> list:
    """Run the callables on their own threads, released together; returns their results."""
    barrier, results, errors = threading.Barrier(len(jobs)), [None] * len(jobs), []

    def run_one(i, job):
        barrier.wait()
        try:
            results[i] = job()
        except BaseException as err:  # noqa: BLE001  (re-raised below)
            errors.append(err)

    threads = [threading.Thread(target=run_one, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def assert_same_draft(got: Draft, expected: Draft, where: str) -> None:
    """Tokens, tree and runner-ups exactly; probabilities within float tolerance (float32 on the wire)."""
    assert (got.tokens, got.parents, got.runner_up) == (expected.tokens, expected.parents, expected.runner_up), where
    assert got.confidence == pytest.approx(expected.confidence, rel=1e-5, abs=1e-7), where
    assert got.runner_up_confidence == pytest.approx(expected.runner_up_confidence, rel=1e-5, abs=1e-7), where
    assert (got.q is None) == (expected.q is None), where
    for got_q, expected_q in zip(got.q or (), expected.q or ()):
        assert got_q.token_ids == expected_q.token_ids, where
        assert got_q.probs == pytest.approx(expected_q.probs, rel=1e-5, abs=1e-7), where


def _scripts(count: int, seed: int = 11) -> list[list[tuple]]:
    """Per session, two proposals: at a context of 3-90 tokens, then after a rollback (the first two
    draft tokens kept, a different third): chains, trees and sampled chains of 3-6 levels."""
    rng = random.Random(seed)
    kinds = [(1, GREEDY), (2, GREEDY), (3, GREEDY), (1, SAMPLED)]
    return [[(tuple(rng.randrange(257) for _ in range(rng.randint(3, 90))), rng.randint(3, 6), *kinds[i % len(kinds)])]
            for i in range(count)]


def _propose_script(drafter, script) -> list[Draft]:
    """The script's proposals on one new session; the second one's context follows the first draft."""
    sid = f"draft-batching-{next(_ids)}"
    (context, draft_len, width, sampling), = script
    first = drafter.propose(ProposeRequest(sid, context, draft_len, width, sampling)).draft
    rollback = (*context, *first.tokens[:2], (first.tokens[0] + 1) % 257)
    second = drafter.propose(ProposeRequest(sid, rollback, draft_len, width, sampling)).draft
    drafter.release(sid)
    return [first, second]


@pytest.mark.parametrize("transport", ["inproc", "grpc"])
def test_concurrent_proposals_equal_each_alone(transport):
    """10 sessions draft at once (catch-ups in several chunks in process): each draft == its draft alone."""
    if transport == "inproc":
        drafter = _drafter(batch=BatchConfig(prefill_chunk=16))
        assert drafter.batched
    else:
        drafter = shared_tiny_cluster().drafter_client
    scripts = _scripts(10)
    alone = [_propose_script(drafter, script) for script in scripts]
    before = _batch_counts()
    together = _all_at_once([lambda s=s: _propose_script(drafter, s) for s in scripts])
    after = _batch_counts()
    for i, (got, expected) in enumerate(zip(together, alone)):
        for j in range(2):
            assert_same_draft(got[j], expected[j], f"session {i} proposal {j}")
    assert after[1] - before[1] > after[0] - before[0], "no drafter forward ran more than one proposal"


def test_unbatched_path_drafts_the_same():
    """One proposal per forward (the path of the CUDA graphs mode and other architectures)."""
    model = tiny_model(2)
    info = model_info(ModelSpec("tiny", 2), model)
    drafters = [ModelDrafter(model, info, batching=False), ModelDrafter(model, info)]
    assert [d.batched for d in drafters] == [False, True]
    for script in _scripts(4, seed=3):
        one, batched = (_propose_script(d, script) for d in drafters)
        for j in range(2):
            assert_same_draft(batched[j], one[j], f"{script} proposal {j}")


def test_branch_proposals_of_one_session_at_once_equal_fresh_ones():
    """The branch schedule's hypotheses: several proposals of one session and epoch at once, on
    forks of one branch (copy-on-write slots), batched together; each == a fresh session's."""
    drafter = _drafter()
    base = [3, 14, 15, 92, 65, 35, 89, 79]
    first = drafter.propose(ProposeRequest("hypotheses", base, 4, 1, GREEDY, epoch=1)).draft.tokens
    contexts = [base + list(first), base + list(first[:2]) + [11], base + [8], base + list(first[:3]) + [21, 5],
                base[:5], base + list(first[:1]) + [200, 201, 202]]
    widths = [1, 2, 3, 1, 2, 1]
    before = _batch_counts()
    drafts = _all_at_once(
        [
            lambda c=c, w=w: drafter.propose(ProposeRequest("hypotheses", c, 4, w, GREEDY, epoch=1)).draft
            for c, w in zip(contexts, widths)
        ]
    )
    after = _batch_counts()
    for i, (context, width) in enumerate(zip(contexts, widths)):
        fresh = drafter.propose(ProposeRequest(f"fresh-{i}", context, 4, width, GREEDY)).draft
        drafter.release(f"fresh-{i}")
        assert_same_draft(drafts[i], fresh, f"hypothesis {i}")
    assert after[1] - before[1] > after[0] - before[0], "the hypotheses never shared a forward"
    # the confirmed path is never lost: the base context's own draft is unchanged
    assert drafter.propose(ProposeRequest("hypotheses", base, 4, 1, GREEDY, epoch=2)).draft.tokens == first


@pytest.mark.parametrize("mode", ["eager", "packed"])
def test_one_token_steps_are_bitwise_batch_invariant(mode):
    """A drafter step is one token per proposal: alone (1 row) == among 19 mates (20 rows), bitwise."""
    model = tiny_model(2)
    if mode == "packed":
        from specpipe.engine import native

        native.pack_linears(model, torch.float32)
    contexts = [list(range(3 + i, 20 + 3 * i)) for i in range(20)]

    def step(kv, ids):
        n = len(ids)
        return Segment(
            kv, tuple(ids), torch.arange(kv.length, kv.length + n), torch.ones(n, n, dtype=torch.bool).tril(), 1
        )

    alone = []
    for context in contexts:
        kv = new_slot(model, 2048)
        batched_forward(model, [step(kv, context[:-1])])
        alone.append(batched_forward(model, [step(kv, context[-1:])])[0])
    slots = [new_slot(model, 2048) for _ in contexts]
    for kv, context in zip(slots, contexts):
        batched_forward(model, [step(kv, context[:-1])])
    together = batched_forward(model, [step(kv, c[-1:]) for kv, c in zip(slots, contexts)])
    assert all(torch.equal(a, b) for a, b in zip(alone, together))


SPECULATIONS = [
    SpeculationOptions(drafter=drafter, draft_len=4, width=width, schedule=schedule, adaptive="off", hypotheses=2)
    for drafter, width, schedule in itertools.product(("model", "hybrid"), (1, 2), ("sequential", "branch"))
]


def test_concurrent_generations_with_batched_drafter_equal_verifier_greedy(tiny_verifier, tiny_drafter, tiny_tokenizer):
    """8 generations at once, model and hybrid drafters, chains and trees, both schedules."""
    assert tiny_verifier.batched and tiny_drafter.batched
    store = InMemoryNgramCache()
    ngram = NgramDrafter(store, tiny_verifier.info())
    generator = Generator(tiny_tokenizer, tiny_verifier, {"model": tiny_drafter,
                                                          "hybrid": HybridDrafter(tiny_drafter, ngram)}, cache=store)
    rng = random.Random(8)
    prompts = [tuple(rng.randrange(256) for _ in range(rng.randint(3, 60))) for _ in SPECULATIONS]
    expected = [reference_greedy(tiny_verifier.model, ids, 32) for ids in prompts]
    before = _batch_counts()
    outputs = _all_at_once([lambda ids=ids, s=s: run(generator, GenerationRequest(ids, 32, speculation=s))[0]
                            for ids, s in zip(prompts, SPECULATIONS)])
    after = _batch_counts()
    for output, reference, speculation in zip(outputs, expected, SPECULATIONS):
        assert output == reference, speculation
    assert after[1] - before[1] > after[0] - before[0], "no drafter forward ran more than one proposal"
