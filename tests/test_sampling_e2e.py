"""Sampling end to end on the tiny model: with model drafts, emitted tokens follow the verifier's
own (warped) distribution. top_k=4 keeps the effective vocabulary tiny so a chi-square test has power."""

import pytest
import torch

from specpipe.core.sampling import warp
from specpipe.core.types import ProposeRequest, SamplingParams
from specpipe.engine import runner
from tests.test_sampling import CHI2_999, _chi_square

CONTEXT = [72, 101, 108, 108, 111, 44, 32]


@pytest.mark.slow  # 3000 verify rounds; tests/test_sampling.py checks the same math in the default suite
def test_first_and_second_tokens_follow_verifier_distribution(tiny_verifier, tiny_drafter):
    model = tiny_verifier.model
    counts_first = torch.zeros(257)
    pairs: dict[int, torch.Tensor] = {}
    trials = 3000
    for seed in range(trials):
        sampling = SamplingParams(temperature=1.0, top_k=4, seed=seed)
        session = f"stat-{seed}"
        tiny_verifier.prefill(session, CONTEXT)
        draft = tiny_drafter.propose(ProposeRequest(session, CONTEXT, 2, 1, sampling)).draft
        emitted = tiny_verifier.verify(session, len(CONTEXT), draft, sampling).emitted
        tiny_verifier.release(session)
        tiny_drafter.release(session)
        counts_first[emitted[0]] += 1
        if len(emitted) > 1:
            pairs.setdefault(emitted[0], torch.zeros(257))[emitted[1]] += 1

    p_first = warp(
        runner.forward(model, runner.new_cache(model), CONTEXT)[-1], SamplingParams(temperature=1.0, top_k=4)
    )
    assert _chi_square(counts_first, p_first) < CHI2_999[4]
    # The second token, given the first, when drafts were accepted often enough to test it.
    first, counts_second = max(pairs.items(), key=lambda kv: kv[1].sum())
    assert counts_second.sum() > 300
    p_second = warp(runner.forward(model, runner.new_cache(model), CONTEXT + [first])[-1],
                    SamplingParams(temperature=1.0, top_k=4))
    assert _chi_square(counts_second, p_second) < CHI2_999[4]
