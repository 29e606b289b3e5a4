"""The branch schedule (docs/design.md, "Branch-prediction scheduling"): golden tests for every
drafter kind, embedded and over gRPC; sequential and branch give the same sample for the same seed;
forced misses and stale epochs change nothing; the drafter's branches never disturb each other."""

import threading

import pytest

from orchestrator import generator as generator_module
from orchestrator.branch import BranchScheduler, usable_draft
from orchestrator.predictors import BONUS, Hypothesis, fit_phi
from specpipe.core.errors import Aborted
from specpipe.core.types import (
    ALL_HYPOTHESES,
    GREEDY,
    Draft,
    GenerationRequest,
    ProposeRequest,
    ProposeResult,
    SamplingParams,
    SpeculationOptions,
    VerifyResult,
)
from tests.golden import GOLDEN_PROMPTS, assert_golden, run
from tests.redis_harness import redis_server, redis_url  # noqa: F401  (fixture)

# the embedded (memory, Redis) and distributed (gRPC + Redis) generators with every drafter kind
from tests.test_golden_ngram import MAX_NEW_TOKENS, generator, references, store_cases  # noqa: F401  (fixtures)

BRANCH = {
    "model calibrated M=1": SpeculationOptions(drafter="model", schedule="branch", adaptive="off", draft_len=4),
    "model paper M=2": SpeculationOptions(
        drafter="model", schedule="branch", predictor="paper", hypotheses=2, adaptive="off", draft_len=4
    ),
    "model tree all": SpeculationOptions(
        drafter="model", schedule="branch", width=3, hypotheses=ALL_HYPOTHESES, adaptive="off", draft_len=4
    ),
    "ngram all": SpeculationOptions(
        drafter="ngram", schedule="branch", draft_len=5, hypotheses=ALL_HYPOTHESES, adaptive="off"
    ),
    "hybrid M=2": SpeculationOptions(drafter="hybrid", schedule="branch", hypotheses=2, adaptive="off", draft_len=4),
}


@pytest.mark.parametrize("generator, speculation", store_cases(BRANCH, {"model paper M=2", "model tree all"}),
                         indirect=["generator"])
def test_branch_schedule_equals_verifier_greedy(generator, references, speculation):
    drafted, accepted = assert_golden(generator, references, MAX_NEW_TOKENS, speculation)
    assert 0 < accepted < drafted


def test_branch_schedule_hits_and_hides_draft_time(tiny_generator, references):
    chunks = [
        c
        for prompt in GOLDEN_PROMPTS
        for c in run(
            tiny_generator,
            GenerationRequest(
                references[prompt][0],
                MAX_NEW_TOKENS,
                speculation=SpeculationOptions(
                    drafter="model", schedule="branch", hypotheses=2, adaptive="off", draft_len=4
                ),
            ),
        )[1]
    ]
    predicted = [c.round for c in chunks if c.round.hypotheses]
    hits = [r for r in predicted if r.hit]
    assert predicted and hits and len(hits) < len(predicted)  # the tiny pair: some hits, some misses
    assert any(r.hidden_ms > 0 for r in hits)
    assert all(r.hidden_ms == 0 for r in predicted if not r.hit)


def test_same_seed_same_sample_for_both_schedules(tiny_generator, references):
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    for prompt in GOLDEN_PROMPTS[:4]:
        ids = references[prompt][0]
        outputs = [
            run(
                tiny_generator,
                GenerationRequest(
                    ids,
                    MAX_NEW_TOKENS,
                    sampling=sampling,
                    speculation=SpeculationOptions(drafter="model", schedule=schedule, adaptive="off", draft_len=4),
                ),
            )[0]
            for schedule in ("sequential", "branch", "branch")
        ]
        assert outputs[0] == outputs[1] == outputs[2], prompt


class AlwaysWrong:
    """Predicts more accepted tokens than the chain has: no verdict can ever match."""

    def hypotheses(self, proposal, m):
        return [Hypothesis((*proposal.draft.tokens, 1), 2, 1.0)] if len(proposal.draft) else []

    def observe(self, proposal, result, bonus):
        pass


PRE_DRAFT_START = 0.15  # s: the schedule submits a round's pre-draft right after its verify call


class PreDraftFirst:
    """Verification waits for the round's pre-draft (a proposal that starts after the verification
    did, if one starts within PRE_DRAFT_START s) to answer, so each pre-draft is finished before its
    verdict. Rounds with no pre-draft (the last ones) wait the whole PRE_DRAFT_START."""

    def __init__(self, verifier, drafter):
        self._verifier, self._drafter = verifier, drafter
        self._changed = threading.Condition()
        self._started = self._answered = 0  # proposals so far

    def __getattr__(self, name):
        return getattr(self._verifier, name)

    def propose(self, *args, **kwargs):
        with self._changed:
            self._started += 1
            self._changed.notify_all()
        try:
            return self._drafter.propose(*args, **kwargs)
        finally:
            with self._changed:
                self._answered += 1
                self._changed.notify_all()

    def verify(self, *args, **kwargs):
        with self._changed:
            started = self._started
            if self._changed.wait_for(lambda: self._started > started, timeout=PRE_DRAFT_START):
                self._changed.wait_for(lambda: self._answered == self._started, timeout=10)
        return self._verifier.verify(*args, **kwargs)


def test_forced_misses_change_nothing(monkeypatch, tiny_tokenizer, tiny_verifier, tiny_drafter, references):
    from orchestrator.generator import Generator

    monkeypatch.setattr(generator_module, "new_predictor", lambda kind, shared: AlwaysWrong())
    gate = PreDraftFirst(tiny_verifier, tiny_drafter)
    drafter = type("GatedDrafter", (), {"propose": gate.propose, "info": tiny_drafter.info,
                                        "release": tiny_drafter.release})()
    generator = Generator(tiny_tokenizer, gate, {"model": drafter})
    for prompt in GOLDEN_PROMPTS[:4]:
        ids, expected = references[prompt]
        tokens, chunks = run(
            generator,
            GenerationRequest(
                ids,
                MAX_NEW_TOKENS,
                speculation=SpeculationOptions(drafter="model", schedule="branch", adaptive="off", draft_len=4),
            ),
        )
        assert tokens == expected
        predicted = [c.round for c in chunks if c.round.hypotheses]
        assert predicted and not any(r.hit for r in predicted)
        assert sum(r.wasted for r in predicted) > 0  # the pre-drafts ran, and were dropped


class ScriptedDrafter:
    """Returns a fixed draft; waits for `release` before answering when asked to be slow."""

    def __init__(self, slow: bool = False):
        self.calls: list[tuple[tuple[int, ...], int]] = []
        self.release_event = threading.Event()
        self.slow = slow

    def propose(self, request):
        self.calls.append((tuple(request.context), request.epoch))
        if self.slow:
            self.release_event.wait(5)
        return ProposeResult(Draft.chain([7] * request.draft_len), 1.0)


class FixedPredictor:
    def __init__(self, hypotheses):
        self._hypotheses = hypotheses

    def hypotheses(self, proposal, m):
        return self._hypotheses

    def observe(self, proposal, result, bonus):
        pass


def verdict(accepted, correction):
    return VerifyResult(tuple(accepted), tuple(range(len(accepted))), correction, 0.0, (), 1.0, 0)


def test_stale_pre_drafts_are_dropped():
    from concurrent.futures import ThreadPoolExecutor

    drafter = ScriptedDrafter(slow=True)
    guess = Hypothesis((5, 6), 9, 1.0)  # two of the chain (5, 6, 8) accepted, correction 9
    scheduler = BranchScheduler(
        ThreadPoolExecutor(2), drafter, FixedPredictor([guess]), ProposeRequest("s", (), 0), print
    )
    proposal = ProposeResult(Draft.chain([5, 6, 8]), 1.0)
    scheduler.speculate([1, 2], proposal, 1, lambda h: 3)
    miss = scheduler.resolve(proposal, verdict([5], 4), 0.0, 1.0)  # the verdict differs: a miss, epoch bump
    assert miss.proposal is None and not miss.hit and scheduler.epoch == 1
    drafter.release_event.set()  # the stale pre-draft (epoch 0) answers only now
    scheduler.close()
    assert drafter.calls == [((1, 2, 5, 6, 9), 0)]
    # The next round's hypotheses replace the old: a verdict equal to the stale guess finds nothing.
    scheduler = BranchScheduler(ThreadPoolExecutor(2), drafter, FixedPredictor([]), ProposeRequest("s", (), 0), print)
    scheduler.speculate([1, 2, 5, 4], proposal, 1, lambda h: 3)
    assert scheduler.resolve(proposal, verdict([5, 6], 9), 0.0, 1.0).proposal is None


def test_hit_uses_the_pre_draft_and_keeps_the_epoch():
    from concurrent.futures import ThreadPoolExecutor

    drafter = ScriptedDrafter()
    guesses = [Hypothesis((5, 6, 8), BONUS, 0.6), Hypothesis((5,), 3, 0.3)]
    scheduler = BranchScheduler(
        ThreadPoolExecutor(2), drafter, FixedPredictor(guesses), ProposeRequest("s", (), 0), print
    )
    proposal = ProposeResult(Draft.chain([5, 6, 8]), 1.0)
    scheduler.speculate([1], proposal, 2, lambda h: 2)
    resolution = scheduler.resolve(proposal, verdict([5, 6, 8], 7), 0.0, 1e9)  # the bonus pre-draft starts with 7
    assert resolution.hit and resolution.proposal.draft.tokens == (7, 7) and resolution.bonus == 7
    assert drafter.calls[0] == ((1, 5, 6, 8), 0)  # context + the whole chain; drafts the bonus token first


def test_usable_draft_takes_the_subtree_under_the_bonus_token():
    from orchestrator.branch import PreDraft

    tree = Draft((4, 9, 5, 6), (-1, -1, 0, 2), sources=("model",) * 4, confidence=(0.9, 0.1, 0.8, 0.7),
                 runner_up=(9, -1, 3, 3), runner_up_confidence=(0.1, 0, 0.1, 0.2))  # 4 -> 5 -> 6, and 9 beside 4
    pre = PreDraft(Hypothesis((1, 2), BONUS, 1.0), (0, 1, 2), 3, result=ProposeResult(tree, 1.0))
    used = usable_draft(pre, (1, 2), 4).draft
    assert (used.tokens, used.parents, used.confidence, used.runner_up) == ((5, 6), (-1, 0), (0.8, 0.7), (3, 3))
    assert len(usable_draft(pre, (1, 2), 9).draft) == 0  # a leaf: nothing to verify
    assert usable_draft(pre, (1, 2), 8) is None and usable_draft(pre, (1,), 4) is None


def test_drafter_aborts_an_older_epoch(tiny_drafter):
    context = [1, 2, 3, 4]
    tiny_drafter.propose(ProposeRequest("epochs", context, 3, 1, GREEDY, epoch=5))
    with pytest.raises(Aborted):
        tiny_drafter.propose(ProposeRequest("epochs", context, 3, 1, GREEDY, epoch=4))
    tiny_drafter.propose(ProposeRequest("epochs", context, 3, 1, GREEDY, epoch=5))  # the newest epoch is still served
    tiny_drafter.release("epochs")


def test_concurrent_proposals_on_branches_equal_fresh_ones(tiny_drafter):
    base = [3, 14, 15, 92, 65, 35]
    first = tiny_drafter.propose(ProposeRequest("branches", base, 4, 1, GREEDY, epoch=1)).draft.tokens
    contexts = [base + list(first), base + list(first[:2]) + [11], base + [8], base + list(first[:3]) + [21, 5]]
    results: dict[int, tuple] = {}

    def propose(i):
        results[i] = tiny_drafter.propose(ProposeRequest("branches", contexts[i], 4, 1, GREEDY, epoch=1)).draft.tokens

    threads = [threading.Thread(target=propose, args=(i,)) for i in range(len(contexts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, context in enumerate(contexts):
        fresh = tiny_drafter.propose(ProposeRequest(f"fresh-{i}", context, 4, 1, GREEDY)).draft.tokens
        tiny_drafter.release(f"fresh-{i}")
        assert results[i] == fresh, i
    # the confirmed path is never lost: the base context's own draft is unchanged
    assert tiny_drafter.propose(ProposeRequest("branches", base, 4, 1, GREEDY, epoch=2)).draft.tokens == first
    tiny_drafter.release("branches")


def test_fit_phi_recovers_the_acceptance_rate():
    p, n, rounds = 0.7, 4, 100_000
    counts = [round(rounds * p ** x * (1 - p)) for x in range(n)]
    counts.append(rounds - sum(counts))
    phi = fit_phi(counts)
    assert phi == pytest.approx([c / rounds for c in counts], abs=1e-3)
    assert fit_phi([0] * (n + 1))[n] == max(fit_phi([0] * (n + 1)))  # no data: the prior favours all accepted


def test_calibrated_predictor_learns_the_drafters_calibration():
    from orchestrator.estimates import Rates
    from orchestrator.predictors import CalibratedPredictor

    predictor = CalibratedPredictor(Rates())
    # The drafter claims 0.95 for every node, but only the first two are ever accepted and then its
    # runner-up is right: the predictor must learn to put gamma = 2 first.
    proposal = ProposeResult(Draft.chain([10, 11, 12, 13], confidence=(0.95,) * 4, runner_up=(20, 21, 22, 23),
                                         runner_up_confidence=(0.04,) * 4), 1.0)
    assert predictor.hypotheses(proposal, 1)[0].accepted == (10, 11, 12, 13)
    for _ in range(50):
        predictor.observe(proposal, verdict([10, 11], 22), None)
    best = predictor.hypotheses(proposal, ALL_HYPOTHESES)
    assert (best[0].accepted, best[0].correction) == ((10, 11), 22)
    assert len(best) == 5 and sum(h.probability for h in best) <= 1.0 + 1e-9


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "x", "--hypotheses", "0"], "expected a number >= 1 or 'all'"),
    (["generate", "--prompt", "x", "--schedule", "parallel"], "invalid choice"),
    (["bench", "--methods", "model:fast"], "bad method 'model:fast'"),
    (["bench", "--methods", "model:branch@2"], "use it with --transport grpc"),
    (["bench", "--methods", "model:branch@x", "--transport", "grpc"], "@HOP_MS must be a number"),
    (["bench", "--methods", "magic"], "unknown drafters"),
])
def test_cli_rejects_bad_schedule_flags(cli, argv, message):
    code, stderr = cli(*argv, "--preset", "tiny")
    assert code != 0 and message in stderr, stderr


def test_generation_options_reject_bad_schedule(tiny_generator, references):
    from specpipe.core.errors import InvalidArgument

    ids = references[GOLDEN_PROMPTS[0]][0]
    for bad in (
        SpeculationOptions(drafter="model", schedule="x", adaptive="off", draft_len=4),
        SpeculationOptions(drafter="model", predictor="x", adaptive="off", draft_len=4),
        SpeculationOptions(drafter="model", hypotheses=0, adaptive="off", draft_len=4),
    ):
        with pytest.raises(InvalidArgument):
            tiny_generator.generate(GenerationRequest(ids, 4, speculation=bad))
