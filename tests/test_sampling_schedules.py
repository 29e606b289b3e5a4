"""Sampling stays exact with adaptive control and the branch schedule together: the joint law of the
first 3 tokens of specpipe's output (tiny preset, several rounds each: pre-drafts, trims and draft
lengths chosen online) equals the verifier's own sampling, by a chi-square test over 8 cells
(docs/design.md, "Verification": distributed as the verifier's own sampling). The same test rejects
samplers with a known bias, so it can fail."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chi2

from specpipe.core.sampling import warp
from specpipe.core.types import GenerationRequest, SamplingParams, SpeculationOptions
from specpipe.engine import runner

CONTEXT = (72, 101, 108, 108, 111, 44, 32)
TOKENS = 3       # the joint law of the first 3 output tokens
MAX_NEW = 6      # generated, so that pre-drafts have room to be used (hits)
TOP_K = 2        # 2 ** 3 = 8 cells: enough samples per cell for the chi-square approximation
TRIALS = 600     # ~60 ms each: 30-40 s on a shared 2-core machine, so marked slow
P_MIN = 1e-3     # reject below this p-value (the seeds are fixed, so the verdict is too)
SAMPLING = SamplingParams(temperature=1.0, top_k=TOP_K)


def joint_law(model, context, sampling: SamplingParams, n: int) -> dict[tuple[int, ...], float]:
    """P(first n tokens) of plain sampling from model: the product of its warped next-token laws."""
    law = {(): 1.0}
    for _ in range(n):
        longer = {}
        for prefix, p_prefix in law.items():
            probs = warp(runner.forward(model, runner.new_cache(model), [*context, *prefix])[-1], sampling)
            for token in probs.nonzero().flatten().tolist():
                longer[(*prefix, token)] = p_prefix * float(probs[token])
        law = longer
    return law


def p_value(counts: dict[tuple[int, ...], int], law: dict[tuple[int, ...], float]) -> float:
    """Pearson's chi-square goodness of fit; 0 when a sample falls outside the law's support."""
    if set(counts) - set(law):
        return 0.0
    total = sum(counts.values())
    stat = sum((counts.get(cell, 0) - total * p) ** 2 / (total * p) for cell, p in law.items())
    return float(chi2.sf(stat, df=len(law) - 1))


@pytest.fixture(scope="module")
def verifier_law(tiny_verifier):
    return joint_law(tiny_verifier.model, CONTEXT, SAMPLING, TOKENS)


@pytest.mark.slow  # TRIALS generations; the tests below (the test's power) run in the default suite
def test_adaptive_branch_sampling_follows_the_verifiers_law(tiny_tokenizer, tiny_verifier, tiny_drafter, verifier_law):
    from orchestrator.generator import Generator

    spec = SpeculationOptions(drafter="model", draft_len=2, adaptive="on", schedule="branch")
    counts: dict[tuple[int, ...], int] = {}
    rounds = []
    for seed in range(1, TRIALS + 1):
        # a fresh orchestrator per seed: adaptive control starts from its prior and adapts within the generation,
        # rather than settling on k = 0 for good from the tiny drafter's CPU timings
        generator = Generator(tiny_tokenizer, tiny_verifier, {"model": tiny_drafter})
        sampling = SamplingParams(temperature=1.0, top_k=TOP_K, seed=seed)
        chunks = list(generator.generate(GenerationRequest(CONTEXT, MAX_NEW, sampling=sampling, speculation=spec)))
        tokens = tuple(t for c in chunks for t in c.token_ids)[:TOKENS]
        counts[tokens] = counts.get(tokens, 0) + 1
        rounds += [c.round for c in chunks]
    assert len(rounds) >= 2 * TRIALS  # every generation took several rounds
    assert sum(r.drafted > 0 for r in rounds) > len(rounds) // 4  # drafts, accepted or rejected
    assert any(r.hypotheses for r in rounds) and any(r.hit for r in rounds)  # pre-drafts were issued and used
    assert p_value(counts, verifier_law) > P_MIN, counts


@pytest.mark.parametrize("bias", ["drafter's law", "temperature 1.6"])
def test_the_chi_square_test_rejects_a_biased_sampler(tiny_verifier, tiny_drafter, verifier_law, bias):
    """As many samples as above, from a wrong law: emitting the drafter's tokens unchecked, or a
    verifier sampling at the wrong temperature. Both must be rejected."""
    if bias == "drafter's law":
        law = joint_law(tiny_drafter._model, CONTEXT, SAMPLING, TOKENS)
    else:
        law = joint_law(tiny_verifier.model, CONTEXT, SamplingParams(temperature=1.6, top_k=TOP_K), TOKENS)
    cells = list(law)
    draws = torch.multinomial(torch.tensor([law[c] for c in cells]), TRIALS, replacement=True,
                              generator=torch.Generator().manual_seed(0))
    counts: dict[tuple[int, ...], int] = {}
    for i in draws.tolist():
        counts[cells[i]] = counts.get(cells[i], 0) + 1
    assert p_value(counts, verifier_law) < P_MIN


def test_p_value_of_exact_counts_is_high():
    law = {cell: 1 / 8 for cell in itertools.product((0, 1), repeat=3)}
    assert p_value({cell: 100 for cell in law}, law) > 0.99
    assert p_value({(0, 0, 2): 1, **{cell: 100 for cell in law}}, law) == 0.0
