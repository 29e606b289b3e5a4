"""Adaptive speculation (docs/design.md, "Adaptive control"): the online cost fit recovers a
known line from noisy timings and follows a change; the choice picks the known optimum on synthetic acceptance curves,
shrinks under load, and gates on the verifier's entropy; a session that stopped drafting probes
again; and with --adaptive on the output is still the verifier's own greedy output, for every
drafter kind and both schedules, embedded and distributed."""

import random

import pytest

from orchestrator.adaptive import (
    PROBE_AFTER,
    PROBE_SHARE,
    STOP_CONFIDENCE,
    AdaptiveController,
    SharedModels,
    entropy_bin,
)
from orchestrator.costs import (
    ALONE,
    Sharing,
    best_budget,
    choose_draft_len,
    expected_tokens,
    hypotheses_that_fit,
    node_acceptance,
    round_ms,
    serial,
)
from orchestrator.generator import Generator
from specpipe.core.fits import LinearFit
from specpipe.core.learned import evidence
from specpipe.core.types import Draft, ProposeRequest, ProposeResult, SpeculationOptions
from tests.golden import GOLDEN_PROMPTS, assert_golden
from tests.redis_harness import redis_server, redis_url  # noqa: F401  (fixture)

# the embedded (memory, Redis) and distributed (gRPC + Redis) generators with every drafter kind
from tests.test_golden_ngram import MAX_NEW_TOKENS, generator, references, store_cases  # noqa: F401  (fixtures)


def test_fit_recovers_a_line_from_noisy_timings():
    rng = random.Random(0)
    fit = LinearFit(decay=0.99)
    for _ in range(400):
        n = rng.randint(1, 9)
        fit.add(n, 200.0 + 15.0 * n + rng.gauss(0, 5))
    a, b = fit.line()
    assert a == pytest.approx(200.0, rel=0.03) and b == pytest.approx(15.0, rel=0.1)


def test_fit_follows_the_recent_samples():
    fit = LinearFit(decay=0.9)
    for n in list(range(1, 9)) * 10:
        fit.add(n, 100.0 + 10.0 * n)
    for n in list(range(1, 9)) * 10:  # the machine became twice as slow
        fit.add(n, 200.0 + 20.0 * n)
    a, b = fit.line()
    assert a == pytest.approx(200.0, rel=0.05) and b == pytest.approx(20.0, rel=0.05)


def test_fit_with_one_x_and_none():
    assert LinearFit().line() is None and LinearFit().predict(3, default=7.0) == 7.0
    level, proportional = LinearFit(), LinearFit(proportional=True)
    for fit in (level, proportional):
        fit.add(4, 100.0)
    assert level.predict(1) == 100.0 and proportional.predict(1) == 25.0


@pytest.mark.parametrize("acceptance, k, expected", [
    ([], 0, 1.0),
    ([0.0, 1.0], 2, 1.0),
    ([1.0, 1.0, 1.0], 3, 4.0),
    ([0.5, 0.5], 2, 1.75),
    ([0.5, 0.5, 0.5], 1, 1.5),
])
def test_expected_tokens(acceptance, k, expected):
    assert expected_tokens(acceptance, k) == pytest.approx(expected)


def brute_force(acceptance, verify, draft, k_max, hit_rate=0.0, sharing=ALONE):
    rates = [(sharing.others_emitted + expected_tokens(acceptance, k)) /
             round_ms(k, verify(sharing.others_fed + k + 1), draft(k), hit_rate, sharing) for k in range(k_max + 1)]
    return rates.index(max(rates))


@pytest.mark.parametrize("a", [0.0, 0.2, 0.5, 0.7, 0.9, 0.99])
@pytest.mark.parametrize("slope", [2.0, 30.0, 150.0])
@pytest.mark.parametrize("draft_per_token", [0.0, 20.0, 80.0])
def test_choice_is_the_optimum_on_synthetic_curves(a, slope, draft_per_token):
    verify = lambda n: 250.0 + slope * n  # noqa: E731
    draft = lambda k: draft_per_token * k  # noqa: E731
    acceptance = [a] * 8
    k = choose_draft_len(acceptance, verify, draft, 8)
    assert k == brute_force(acceptance, verify, draft, 8)
    if a == 0.0:
        assert k == 0  # drafts that never land: plain decoding
    if a == 0.99 and slope == 2.0 and draft_per_token == 0.0:
        assert k == 8  # free, flat and right: the longest draft


def test_choice_on_a_falling_acceptance_curve():
    acceptance = [0.95, 0.9, 0.6, 0.3, 0.1, 0.05, 0.0, 0.0]  # sure first tokens, then a cliff
    k = choose_draft_len(acceptance, lambda n: 250.0 + 20.0 * n, lambda k: 40.0 * k, 8)
    assert k == brute_force(acceptance, lambda n: 250.0 + 20.0 * n, lambda k: 40.0 * k, 8) and 1 <= k <= 4


@pytest.mark.parametrize("a, slope", [(0.5, 60.0), (0.3, 100.0), (0.9, 10.0)])
def test_under_load_the_verifier_time_per_token_decides(a, slope):
    """Sessions sharing the verifier and the drafter: draft time hides behind the others' forwards,
    and a draft is kept only while E(k) / T(k + 1) beats plain decoding's 1 / T(1)."""
    acceptance = [a] * 8
    verify, draft = (lambda n: 200.0 + slope * n), (lambda k: 50.0 * k)
    for load in (1, 2, 4, 16):
        k = choose_draft_len(acceptance, verify, draft, 8, sharing=serial(load))
        assert k == brute_force(acceptance, verify, draft, 8, sharing=serial(load))
        if load >= 4:
            pays = max(expected_tokens(acceptance, j) / verify(j + 1) for j in range(1, 9)) > 1 / verify(1)
            assert (k > 0) == pays


def test_pre_drafts_under_load():
    controller = AdaptiveController(SharedModels(), "model", k_max=4, m_max=3)
    teach(controller, 5, 0.1, 4)  # verify 260 ms, drafts 200 ms
    assert controller.hypotheses(4, load=1) == 1 and controller.hypotheses(1, load=1) == 3
    assert controller.hypotheses(1, load=2) == 1


def test_branch_hits_make_longer_drafts_pay():
    acceptance = [0.8] * 8
    verify, draft = (lambda n: 250.0 + 5.0 * n), (lambda k: 60.0 * k)
    assert choose_draft_len(acceptance, verify, draft, 8, hit_rate=1.0) > choose_draft_len(acceptance, verify, draft, 8)


def test_hypotheses_that_fit():
    assert hypotheses_that_fit(300.0, 100.0, 4) == 3
    assert hypotheses_that_fit(50.0, 100.0, 4) == 1
    assert hypotheses_that_fit(300.0, 0.0, 2) == 2


def teach(controller, rounds, entropy, accepted_of_4):
    for _ in range(rounds):
        controller.observe(4, accepted_of_4, 260.0, 200.0, entropy)


def test_entropy_gate():
    """The first draft token fails where the verifier is unsure and lands where it is sure: the
    controller learns both and drafts only in the sure region."""
    controller = AdaptiveController(SharedModels(), "model", k_max=4, m_max=1)
    for _ in range(30):  # a round counts for the entropy its draft was made after (the previous round's)
        controller.observe(4, 4, 260.0, 200.0, 2.5)   # drafted after a sure position: all 4 accepted
        controller.observe(4, 0, 260.0, 200.0, 0.01)  # drafted after an unsure one: none
    assert entropy_bin(0.01) != entropy_bin(2.5)
    controller.observe(4, 4, 260.0, 200.0, 0.01)  # the last position is sure
    assert controller.draft_len() == 4
    controller.observe(4, 0, 260.0, 200.0, 2.5)   # the last position is unsure
    assert controller.draft_len() == 0


def test_a_session_that_stopped_drafting_probes_again():
    shared = SharedModels()
    controller = AdaptiveController(shared, "model", k_max=4, m_max=1)
    teach(controller, 40, 1.0, 0)  # drafts never land
    ks = []
    for _ in range(3 * PROBE_AFTER):
        k = controller.draft_len()
        ks.append(k)
        controller.observe(k, 0, 250.0 + 10 * k, 50.0 * k, 1.0)
    # a one-token probe after PROBE_AFTER rounds; it fails, so the next one waits twice as long
    assert [i for i, k in enumerate(ks) if k] == [PROBE_AFTER - 1, 3 * PROBE_AFTER - 1] and max(ks) == 1
    assert controller.keep((-1,), ("model",), 50.0) == []  # a token drafted now would be cut ...
    while controller.draft_len() == 0:
        controller.observe(0, 0, 260.0, 0.0, 1.0)
    assert controller.keep((-1,), ("model",), 50.0) == [0]  # ... but not the probe


def chain(n):
    return tuple(range(-1, n - 1))


def test_node_acceptance_of_a_tree():
    # chain 0-2 with alternative 1 beside node 0 (rank 1) and node 3 under alternative 1
    parents = (-1, -1, 0, 1)
    rates = {(1, 0): 0.8, (1, 1): 0.5, (2, 0): 0.6}
    probs = node_acceptance(parents, lambda node, depth, rank: rates[depth, rank])
    assert probs == pytest.approx([0.8, 0.2 * 0.5, 0.8 * 0.6, 0.2 * 0.5 * 0.6])


def test_best_budget_is_the_optimum_with_the_draft_time_spent():
    verify = lambda n: 250.0 + 20.0 * n  # noqa: E731
    acceptance = [0.9, 0.9, 0.1, 0.9]
    probs = node_acceptance(chain(4), lambda node, depth, rank: acceptance[depth - 1])
    rates = [expected_tokens(acceptance, j) / (100.0 + verify(j + 1)) for j in range(5)]
    assert len(best_budget(probs, verify, 100.0)) == max(range(5), key=rates.__getitem__) == 2
    assert best_budget(probs, verify, 100.0) == [0, 1]
    assert best_budget([0.05] * 4, verify, 0.0) == []                   # a poor draft is not worth verifying
    assert best_budget(probs, lambda n: 250.0, 0.0) == [0, 1, 2, 3]     # extra tokens cost nothing: keep all
    # under load the verifier's time decides: verify time per emitted token, not the round's
    assert len(best_budget(probs, verify, 100.0, serial(4))) == \
        max(range(5), key=lambda j: expected_tokens(acceptance, j) / (4 * verify(j + 1)))


@pytest.mark.parametrize("a", [0.3, 0.6, 0.8, 0.95])
def test_in_a_batched_forward_the_batch_goodput_decides(a):
    """B sessions share one forward (T(n) = a + b*n over all their tokens; the others decode plainly):
    a session drafts k where the whole forward's tokens per ms are highest; as B grows the forward's
    fixed cost is shared and a draft token must land more often than a plain token costs, so drafts
    shrink to plain batched decoding; with B = 1 the choice is the one of a session alone."""
    acceptance = [a] * 8
    verify, draft = (lambda n: 200.0 + 25.0 * n), (lambda k: 0.0)
    chosen = []
    for sessions in (1, 2, 4, 8, 16, 64, 256):
        sharing = Sharing(others_fed=sessions - 1, others_emitted=sessions - 1)
        k = choose_draft_len(acceptance, verify, draft, 8, sharing=sharing)
        assert k == brute_force(acceptance, verify, draft, 8, sharing=sharing)
        chosen.append(k)
    assert chosen[0] == choose_draft_len(acceptance, verify, draft, 8) > 0
    assert chosen == sorted(chosen, reverse=True) and chosen[-1] == 0
    # what lands more often keeps drafting at a load where a poor drafter stops
    busy = Sharing(others_fed=15, others_emitted=15)
    assert choose_draft_len([0.95] * 8, verify, draft, 8, sharing=busy) > choose_draft_len([0.3] * 8, verify, draft, 8,
                                                                                           sharing=busy) == 0


def test_controller_learns_the_batch_it_shares():
    """A controller fed rounds of big batched forwards (verify time set by all sessions' tokens)
    drafts less than one fed the same rounds alone."""
    alone, batched = (
        AdaptiveController(SharedModels(), "model", 8, 1),
        AdaptiveController(SharedModels(), "model", 8, 1),
    )
    for i in range(60):
        for controller, sessions in ((alone, 1), (batched, 16)):
            n = 5 + (i % 3)
            tokens = n + 1 + (sessions - 1) * 4
            controller.observe(
                n, n // 2, 100.0 + 10.0 * tokens, 30.0, 1.0, batch_sessions=sessions, batch_tokens=tokens
            )
    assert batched.sharing(16).others_fed == pytest.approx(60.0, rel=0.01)
    assert batched.draft_len(16) < alone.draft_len(1)


def test_acceptance_is_learned_per_source_and_cuts_what_a_poor_source_drafted():
    """A hybrid whose n-gram tails from the global table always fail and whose model tokens land:
    the controller keeps the model's tokens and cuts the global table's, while a source it has not
    seen yet gets the rate of all sources."""
    controller = AdaptiveController(SharedModels(), "hybrid", k_max=6, m_max=1)
    for _ in range(40):
        controller.observe(6, 3, 250.0 + 20.0 * 7, 60.0, 1.0, sources=("model",) * 3 + ("global",) * 3)
        controller.observe(0, 0, 250.0 + 20.0, 0.0, 1.0)  # T(n) = 250 + 20 n
    model, unseen = controller.acceptance(("model",) * 3), controller.acceptance(("context",) * 3)
    assert min(model) > 0.9 and controller.acceptance(("model",) * 3 + ("global",))[3] < 0.1
    assert unseen == pytest.approx(controller.acceptance()[:3])
    assert controller.keep(chain(6), ("model",) * 3 + ("global",) * 3, 60.0) == [0, 1, 2]
    assert controller.keep(chain(3), ("model",) * 3, 60.0) == [0, 1, 2]


def test_tree_budget_keeps_alternatives_only_where_they_pay():
    """Model rank: the runner-up beside the first chain token is right half the times the chain
    token is wrong. Where a fed token costs little it stays in the tree; where it costs much, out."""
    tree, sources = (-1, -1, 0, 2), ("model",) * 4  # chain 0-2-3, alternative 1 beside node 0
    for per_token, kept in ((2.0, [0, 1, 2, 3]), (150.0, [0, 2, 3])):
        controller = AdaptiveController(SharedModels(), "model", k_max=3, m_max=1)
        for i in range(40):
            controller.observe(3, 3 if i % 2 else 0, 250.0 + per_token * 5, 60.0, 1.0, nodes=4,
                               alternatives=[(1, 1, i % 4 == 0)] if i % 2 == 0 else [])
            controller.observe(0, 0, 250.0 + per_token, 0.0, 1.0)
        assert controller.keep(tree, sources, 60.0) == kept


def test_a_chain_sized_by_the_choice_is_not_cut():
    controller = AdaptiveController(SharedModels(), "model", k_max=8, m_max=1)
    rng = random.Random(0)
    for _ in range(60):
        k = controller.draft_len()
        accepted = next((i for i in range(k) if rng.random() > 0.7), k)
        controller.observe(k, accepted, 250.0 + 20.0 * (k + 1), 50.0 * k, 1.0)
    k = controller.draft_len()
    assert 0 < k < 8 and controller.keep(chain(k), ("model",) * k, 50.0 * k) == list(range(k))


def test_costly_probes_wait_longer():
    """A probe's draft includes the drafter's catch-up on every token since its last draft: where
    that costs more than a plain round, probes wait until they take at most PROBE_SHARE of the time."""
    controller = AdaptiveController(SharedModels(), "model", k_max=4, m_max=1)
    teach(controller, 40, 1.0, 0)  # drafts never land; plain rounds would take about 260 ms
    probes = []
    for i in range(200):
        k = controller.draft_len()
        if k:
            probes.append(i)
        controller.observe(k, 0, 250.0 + 10 * k, 300.0 * k, 1.0)
    assert probes[0] == PROBE_AFTER - 1  # the first probe, before its cost is known
    waits = [b - a for a, b in zip(probes, probes[1:])]
    assert waits and min(waits) >= 300.0 / (PROBE_SHARE * 260.0)


def test_a_hybrid_verifies_the_lookup_alone_where_it_beats_a_model_draft():
    """N-gram first: with model drafts that land at 20 ms a token, a long context draft that lands is
    verified without the model, while a one-token lookup is not enough; a round the lookup sufficed
    for does not count toward a probe, nor is its draft verified whole as a probe's would be."""
    controller = AdaptiveController(SharedModels(), "hybrid", k_max=4, m_max=1)
    assert not controller.free_suffices(chain(8), ("context",) * 8, None, 0.5, 4)  # nothing measured yet
    for _ in range(40):  # T(n) = 250 + 5 n
        controller.observe(4, 4, 250.0 + 5.0 * 5, 80.0, 1.0, sources=("model",) * 4)
        controller.observe(8, 8, 250.0 + 5.0 * 9, 0.5, 1.0, sources=("context",) * 8, free=True)
    k = controller.draft_len()
    assert k == 4
    assert not controller.free_suffices(chain(1), ("context",), None, 0.5, k)  # 2 tokens in 255 ms < 5 in 355
    lookup = chain(8)
    assert controller.free_suffices(lookup, ("context",) * 8, None, 0.5, k)  # 9 tokens in 295 ms
    assert controller.keep(lookup, ("context",) * 8, 0.5) == list(range(8))  # the cut it made
    for _ in range(3 * PROBE_AFTER):  # rounds the lookup suffices for, in a row
        assert controller.free_suffices(chain(8), ("context",) * 8, None, 0.5, k)
        assert len(controller.keep(chain(32), ("global",) * 32, 0.5, confidence=(0.3,) * 32)) <= 4
        controller.observe(8, 8, 250.0 + 5.0 * 9, 0.5, 1.0, sources=("context",) * 8, free=True)
    assert len(controller.keep(chain(32), ("global",) * 32, 0.5, confidence=(0.3,) * 32)) <= 4  # no probe due


class Scripted:
    """A drafter that returns one draft and records the draft lengths it was asked for."""

    def __init__(self, draft: Draft):
        self.draft, self.asked = draft, []

    def propose(self, request: ProposeRequest) -> ProposeResult:
        self.asked.append(request.draft_len)
        return ProposeResult(self.draft if request.draft_len else Draft(), 1.0)


@pytest.mark.parametrize("suffices", [True, False])
def test_n_gram_first_runs_the_model_only_where_the_lookup_does_not_suffice(suffices):
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.schedules import Proposer, Warmer

    model = Scripted(Draft.chain([5, 6, 7, 8]))
    lookup = Scripted(Draft.chain([1, 2, 3], sources=("context",) * 3))
    proposer = Proposer(model, "hybrid", ProposeRequest("s", (), 0), lookup, 16, lambda free, k: suffices)
    with ThreadPoolExecutor(1) as pool:
        warmer = Warmer(pool, proposer)
        proposal = warmer.next_draft((9,) * 40, 4, 0, room=16)
        warmer.close()
    assert lookup.asked == [16]
    assert proposal.draft.tokens == ((1, 2, 3) if suffices else (5, 6, 7, 8))
    assert model.asked == ([0] if suffices else [4])  # sitting out, the model is only warmed


def test_in_one_process_a_model_drafter_drafts_sequentially(tiny_tokenizer, tiny_verifier, tiny_drafter, references):
    """Where the drafter shares the verifier's cores, adaptive control issues no pre-drafts (they would
    slow the forward beside them about as much as they hide); apart, the branch schedule issues them.
    The output is the verifier's either way."""
    from specpipe.core.types import GenerationRequest
    from tests.golden import run

    prompt_ids, reference = references[GOLDEN_PROMPTS[0]]
    spec = SpeculationOptions(drafter="model", schedule="branch", adaptive="on", draft_len=4)
    for shared_cores in (True, False):
        gen = Generator(tiny_tokenizer, tiny_verifier, {"model": tiny_drafter}, shared_cores=shared_cores)
        tokens, chunks = run(gen, GenerationRequest(prompt_ids, MAX_NEW_TOKENS, speculation=spec))
        assert tokens == reference
        assert any(chunk.round.hypotheses for chunk in chunks) is not shared_cores


def test_adaptive_control_ends_a_model_chain_at_low_confidence(tiny_tokenizer, tiny_verifier, tiny_drafter, references):
    """Under adaptive control the draft length is a cap and the model's confidence ends a chain
    (STOP_CONFIDENCE); a fixed draft length asks for every level."""
    from specpipe.core.types import GenerationRequest
    from tests.golden import run

    class Recording:
        def __init__(self, drafter):
            self.drafter, self.stops = drafter, set()

        def propose(self, request: ProposeRequest) -> ProposeResult:
            self.stops.add(request.stop_confidence)
            return self.drafter.propose(request)

        def __getattr__(self, name):
            return getattr(self.drafter, name)

    prompt_ids, reference = references[GOLDEN_PROMPTS[0]]
    for adaptive, stop in (("on", STOP_CONFIDENCE), ("off", 0.0)):
        drafter = Recording(tiny_drafter)
        gen = Generator(tiny_tokenizer, tiny_verifier, {"model": drafter})
        spec = SpeculationOptions(drafter="model", adaptive=adaptive, draft_len=4)
        assert run(gen, GenerationRequest(prompt_ids, MAX_NEW_TOKENS, speculation=spec))[0] == reference
        assert drafter.stops == {stop}


ADAPTIVE = {
    "model sequential": SpeculationOptions(drafter="model", draft_len=6, adaptive="on"),
    "model branch": SpeculationOptions(drafter="model", draft_len=6, schedule="branch", hypotheses=3, adaptive="on"),
    "model tree branch": SpeculationOptions(drafter="model", width=2, schedule="branch", adaptive="on", draft_len=4),
    "ngram sequential": SpeculationOptions(drafter="ngram", draft_len=6, adaptive="on"),
    "ngram branch": SpeculationOptions(drafter="ngram", schedule="branch", adaptive="on", draft_len=4),
    "hybrid sequential": SpeculationOptions(drafter="hybrid", adaptive="on", draft_len=4),
    "hybrid branch": SpeculationOptions(drafter="hybrid", schedule="branch", hypotheses=2, adaptive="on", draft_len=4),
}


@pytest.mark.parametrize("generator, speculation", store_cases(ADAPTIVE, {"ngram branch", "hybrid branch"}),
                         indirect=["generator"])
def test_adaptive_equals_verifier_greedy(generator, references, speculation):
    # a generator that has learned nothing yet (the same services): its first round drafts k_max
    fresh = Generator(generator.tokenizer, generator.verifier, generator.drafters, generator.defaults, generator.cache)
    drafted, accepted = assert_golden(fresh, references, MAX_NEW_TOKENS, speculation)
    # drafts were verified; the tiny random models' drafts may fail so often that adaptive stops
    # drafting (and probes rarely) before any lands, so acceptance is not asserted here
    assert drafted > 0


@pytest.mark.slow  # a bench run per swept k (the sweep table itself: tests/test_bench.py)
def test_bench_sweep_reports_the_best_fixed_setting_against_adaptive(tmp_path):
    import json
    import subprocess
    import sys

    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"id": "a", "prompt": "1, 2, 3, 4, 5,"}\n{"messages": [{"role": "user", "content": "Hi"}]}\n')
    out = tmp_path / "sweep.json"
    proc = subprocess.run([sys.executable, "-m", "specpipe.cli.main", "bench", "--preset", "tiny", "--prompts",
                           str(prompts), "--max-new-tokens", "12", "--no-pin", "--methods", "model:branch,ngram/2",
                           "--sweep", "4,1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| method | best fixed k | its tokens/s | adaptive tokens/s | adaptive / best fixed |" in proc.stdout
    result = json.loads(out.read_text())
    names = [
        m["method"] for m in result["methods"] if m["method"].startswith("specpipe ") and "alone" not in m["method"]
    ]
    assert names == [
        "specpipe model k=1 width=1 branch calibrated M=1",
        "specpipe model k=4 width=1 branch calibrated M=1",
        "specpipe model adaptive k<=4 width=1 branch calibrated M<=1",
        "specpipe ngram k=2 width=1 branch calibrated M=1 learning",
    ]  # ngram/2: a fixed k, kept out of the sweep
    alone = ("verifier-only generate(), ", "specpipe verifier alone")  # yardsticks: other models than eager's (W4A8)
    assert all(m["identical"] == 2 for m in result["methods"] if not m["method"].startswith(alone))
    assert result["meta"]["suite"] == str(prompts)


@pytest.mark.parametrize("argv, message", [
    (["bench", "--sweep", "0,2"], "--sweep takes draft lengths >= 1"),
    (["bench", "--sweep", "x"], "--sweep takes draft lengths >= 1"),
    (["generate", "--prompt", "x", "--adaptive", "maybe"], "invalid choice: 'maybe'"),
])
def test_cli_rejects_bad_adaptive_flags(cli, argv, message):
    code, stderr = cli(*argv, "--preset", "tiny")
    assert code != 0 and message in stderr, stderr


@pytest.mark.parametrize("argv, adaptive, draft_len", [
    ([], "on", 8),                                   # adaptive by default, up to 8 tokens a round
    (["--draft-len", "3"], "off", 3),                # a draft length alone fixes it
    (["--adaptive", "on", "--draft-len", "6"], "on", 6),
    (["--adaptive", "off"], "off", 4),
])
def test_adaptive_is_the_default_unless_a_draft_length_is_fixed(argv, adaptive, draft_len):
    import argparse

    from specpipe.cli import options
    from specpipe.config.services import speculation

    parser = argparse.ArgumentParser()
    options.add_speculation_args(parser)
    spec = speculation(vars(parser.parse_args(argv)))
    assert (spec.adaptive, spec.draft_len) == (adaptive, draft_len)
    flags = options.speculation_flags(spec)  # what `up` passes on resolves the same way
    again = speculation(vars(parser.parse_args(list(flags))))
    assert again == spec


@pytest.mark.parametrize("argv, drafter_service, drafter", [
    (["generate", "--prompt", "x"], False, "hybrid"),                 # qwen-coder: a 0.5B drafter of its own
    (["generate", "--prompt", "x", "--preset", "smollm2"], False, "ngram"),  # its drafter: its own first layers
    (["generate", "--prompt", "x", "--preset", "tiny", "--draft-model", "d"], False, "hybrid"),
    (["bench"], False, "hybrid"),
    (["bench", "--preset", "tiny"], False, "ngram"),
    (["up"], False, "hybrid"),                                         # a drafter service on a core of its own
    (["serve", "orchestrator", "--verifier-addr", "v:1", "--drafter-addr", "d:2"], False, "hybrid"),
    (["serve", "orchestrator", "--verifier-addr", "v:1"], False, "ngram"),  # no drafter service to draft with
    (["serve", "orchestrator"], True, "hybrid"),                       # Ray: the drafter deployment
    (["up", "--drafter", "model"], False, "model"),                    # a drafter given is the drafter
    (["generate", "--prompt", "x", "--drafter", "ngram"], False, "ngram"),
])
def test_the_default_drafter_is_the_hybrid_where_a_small_model_of_its_own_drafts(argv, drafter_service, drafter):
    """The hybrid where a drafter service drafts, or in one process where the preset's drafter is a
    separate small model; the n-gram drafter where it would be the verifier's own first layers (a large
    share of a verify) or no model is there to draft."""
    from specpipe.cli import options
    from specpipe.cli.main import build_parser
    from specpipe.config.services import generator_config, orchestrator_config, speculation

    values = vars(build_parser().parse_args(argv))
    in_process = argv[0] in ("generate", "bench")
    spec = (generator_config(values).speculation if in_process else
            orchestrator_config(values, drafter_service).speculation)
    assert spec.drafter == drafter
    flags = options.speculation_flags(spec)  # what `up` passes to its orchestrator
    assert speculation(vars(build_parser().parse_args([*argv, *flags])), drafter_service,
                       in_process) == spec


def test_free_drafts_are_sized_by_their_evidence():
    """The n-gram drafter is asked for four times the cap; what is verified of a learned-store draft
    follows its nodes' confidences at first (a long strong match is kept whole in a session's first
    round), then the acceptance learned for that confidence."""
    from specpipe.core.types import FREE_DRAFT_FACTOR

    shared = SharedModels()
    controller = AdaptiveController(shared, "ngram", k_max=8, m_max=1)
    for i in range(24):  # context drafts that accept 1: the all-source rates are poor; T(n) = 50 + 5 n
        k = 2 + i % 6
        controller.observe(k, 1, 50.0 + 5.0 * (k + 1), 0.1, 1.0, sources=("context",) * k)
    assert controller.draft_len() == 8 * FREE_DRAFT_FACTOR
    fresh = AdaptiveController(shared, "ngram", k_max=8, m_max=1)
    strong, weak = (0.97,) * 24, (0.3,) * 24
    assert len(fresh.keep(chain(24), ("global",) * 24, 0.1, confidence=strong)) >= 16  # 0.97 ** 16 = 0.61
    assert len(fresh.keep(chain(24), ("global",) * 24, 0.1, confidence=weak)) <= 2
    assert len(fresh.keep(chain(24), ("verifier",) * 24, 0.1, confidence=strong)) < 24  # no evidence: by its rates
    for _ in range(40):  # confident learned drafts that always fail at once
        fresh.observe(8, 0, 50.0 + 5.0 * 9, 0.1, 1.0, sources=("global",) * 8, confidence=strong[:8])
    assert fresh.keep(chain(24), ("global",) * 24, 0.1, confidence=strong) == []


def test_a_short_context_match_is_not_sized_by_a_long_copy():
    """Context drafts are learned by their match's length (ngram.context_lookup's confidence), not by
    depth alone: after a long copy, whose nodes (matches of 9 and more tokens) were all accepted, a
    draft from a 4-token match that has been failing is cut short, while a long match is kept whole."""
    controller = AdaptiveController(SharedModels(), "ngram", k_max=8, m_max=1)
    long, short = evidence(20, 1.0), evidence(4, 1.0)
    for i in range(30):  # the copy: every token accepted; T(n) = 50 + 5 n
        k = 8 + i % 9
        controller.observe(k, k, 50.0 + 5.0 * (k + 1), 0.1, 1.0, sources=("context",) * k, confidence=(long,) * k)
    for i in range(10):  # after it: short matches land one token
        k = 8 + i % 9
        controller.observe(k, 1, 50.0 + 5.0 * (k + 1), 0.1, 1.0, sources=("context",) * k, confidence=(short,) * k)
    assert len(controller.keep(chain(24), ("context",) * 24, 0.1, confidence=(long,) * 24)) == 24
    assert len(controller.keep(chain(24), ("context",) * 24, 0.1, confidence=(short,) * 24)) <= 2
