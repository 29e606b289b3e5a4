"""Adaptive speculation (DESIGN section 6): the online cost fit recovers a known line from noisy
timings and follows a change; the choice picks the known optimum on synthetic acceptance curves,
shrinks under load, and gates on the verifier's entropy; a session that stopped drafting probes
again; and with --adaptive on the output is still the verifier's own greedy output, for every
drafter kind and both schedules, embedded and distributed."""

import random

import pytest

from orchestrator.adaptive import (
    PROBE_AFTER, AdaptiveController, LinearFit, SharedModels, choose_draft_len, entropy_bin, expected_tokens,
    hypotheses_that_fit, round_ms,
)
from specpipe.types import SpeculationOptions
from tests.golden import assert_golden
from tests.redis_harness import redis_server, redis_url  # noqa: F401  (fixture)
# the embedded (memory, Redis) and distributed (gRPC + Redis) generators with every drafter kind
from tests.test_golden_ngram import MAX_NEW_TOKENS, generator, references  # noqa: F401  (fixtures)


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


def brute_force(acceptance, verify, draft, k_max, hit_rate=0.0, load=1):
    rates = [expected_tokens(acceptance, k) / round_ms(k, verify(k + 1), draft(k), hit_rate, load)
             for k in range(k_max + 1)]
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
        k = choose_draft_len(acceptance, verify, draft, 8, load=load)
        assert k == brute_force(acceptance, verify, draft, 8, load=load)
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


ADAPTIVE = {
    "model sequential": SpeculationOptions(drafter="model", draft_len=6, adaptive="on"),
    "model branch": SpeculationOptions(drafter="model", draft_len=6, schedule="branch", hypotheses=3, adaptive="on"),
    "model tree branch": SpeculationOptions(drafter="model", width=2, schedule="branch", adaptive="on"),
    "ngram sequential": SpeculationOptions(drafter="ngram", draft_len=6, adaptive="on"),
    "ngram branch": SpeculationOptions(drafter="ngram", schedule="branch", adaptive="on"),
    "hybrid sequential": SpeculationOptions(drafter="hybrid", adaptive="on"),
    "hybrid branch": SpeculationOptions(drafter="hybrid", schedule="branch", hypotheses=2, adaptive="on"),
}


@pytest.mark.parametrize("speculation", ADAPTIVE.values(), ids=ADAPTIVE.keys())
def test_adaptive_equals_verifier_greedy(generator, references, speculation):
    drafted, accepted = assert_golden(generator, references, MAX_NEW_TOKENS, speculation)
    assert accepted > 0


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
    names = [m["method"] for m in result["methods"]]
    assert names[1:] == ["specpipe model k=1 width=1 branch calibrated M=1", "specpipe model k=4 width=1 branch calibrated M=1",
                         "specpipe model adaptive k<=4 width=1 branch calibrated M<=1",
                         "specpipe ngram k=2 width=1 sequential"]
    assert all(m["identical"] == 2 for m in result["methods"]) and result["meta"]["suite"] == str(prompts)


@pytest.mark.parametrize("argv, message", [
    (["bench", "--sweep", "0,2"], "--sweep takes draft lengths >= 1"),
    (["bench", "--sweep", "x"], "--sweep takes draft lengths >= 1"),
    (["generate", "--prompt", "x", "--adaptive", "maybe"], "invalid choice: 'maybe'"),
])
def test_cli_rejects_bad_adaptive_flags(argv, message):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "specpipe.cli.main", *argv, "--preset", "tiny"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("argv, adaptive, draft_len", [
    ([], "on", 8),                                   # adaptive by default, up to 8 tokens a round
    (["--draft-len", "3"], "off", 3),                # a draft length alone fixes it
    (["--adaptive", "on", "--draft-len", "6"], "on", 6),
    (["--adaptive", "off"], "off", 4),
])
def test_adaptive_is_the_default_unless_a_draft_length_is_fixed(argv, adaptive, draft_len):
    import argparse

    from specpipe.cli import options

    parser = argparse.ArgumentParser()
    options.add_speculation_args(parser)
    args = parser.parse_args(argv)
    spec = options.speculation_options(args)
    assert (spec.adaptive, spec.draft_len) == (adaptive, draft_len)
    flags = options.speculation_flags(args)  # what `up` passes on resolves the same way
    again = options.speculation_options(parser.parse_args(list(flags)))
    assert again == spec
