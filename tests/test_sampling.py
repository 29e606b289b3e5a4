"""Sampling math: counter-based randomness, warping, and that rejection sampling is lossless."""

import math

import pytest
import torch

from specpipe.core.errors import InvalidArgument
from specpipe.core.sampling import check_sampling, rejection_sample_chain, sample, truncate, uniform, warp
from specpipe.core.types import SamplingParams, SparseDist


def test_uniform_is_a_pure_function_of_seed_position_stream():
    assert uniform(7, 100, 1) == uniform(7, 100, 1)
    values = {uniform(7, p, s) for p in range(50) for s in (1, 2, 3)}
    assert len(values) == 150 and all(0 <= v < 1 for v in values)
    assert uniform(8, 100, 1) != uniform(7, 100, 1)


def test_warp_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(warp(logits, SamplingParams(temperature=1.0)), torch.tensor([0.5, 0.3, 0.15, 0.05]))
    top_k = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(top_k, torch.tensor([0.625, 0.375, 0, 0]))
    top_p = warp(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5 + 0.3 reaches 0.8
    assert torch.allclose(top_p, torch.tensor([0.625, 0.375, 0, 0]))
    cold = warp(logits, SamplingParams(temperature=0.01))
    assert cold.argmax() == 0 and cold[0] > 0.999


def test_sample_inverse_cdf():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.75])
    assert sample(probs, 0.0) == 1
    assert sample(probs, 0.2499) == 1
    assert sample(probs, 0.26) == 3
    assert sample(probs, 0.9999999) == 3


def test_truncate_keeps_top_entries_renormalised():
    q = truncate(torch.tensor([0.1, 0.6, 0.3, 0.0]), 2)
    assert q.token_ids == (1, 2)
    assert math.isclose(sum(q.probs), 1.0, rel_tol=1e-6) and math.isclose(q.probs[0], 2 / 3, rel_tol=1e-6)


@pytest.mark.parametrize("params,message", [
    (SamplingParams(temperature=-0.1), "temperature"),
    (SamplingParams(temperature=1, top_p=0.0), "top_p"),
    (SamplingParams(temperature=1, top_p=1.5), "top_p"),
    (SamplingParams(temperature=1, top_k=-1), "top_k"),
])
def test_check_sampling(params, message):
    with pytest.raises(InvalidArgument, match=message):
        check_sampling(params)


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


# chi-square critical values at p = 0.001 (false alarm once in a thousand runs; the seeds are fixed anyway)
CHI2_999 = {4: 18.47, 5: 20.52}


@pytest.mark.parametrize("q_kind", ["model", "one-hot"])
def test_rejection_sampling_reproduces_target_distribution(q_kind):
    """The first emitted token (accepted draft or correction) is distributed as p, whatever q is."""
    p = torch.tensor([[0.1, 0.4, 0.2, 0.25, 0.05], [0.3, 0.3, 0.2, 0.1, 0.1]])
    q_full = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.2])
    q = truncate(q_full, 5) if q_kind == "model" else None
    counts = torch.zeros(5)
    trials = 20000
    for seed in range(trials):
        draft_token = sample(q_full, uniform(seed, 0, 99)) if q_kind == "model" else 0
        accepted, correction = rejection_sample_chain([draft_token], [q] if q else None, p, seed, first_position=10)
        counts[draft_token if accepted == 1 else correction] += 1
    assert _chi_square(counts, p[0]) < CHI2_999[4]


def test_rejection_sampling_identical_distributions_accept_everything():
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    q = SparseDist((0, 1), (0.2, 0.8))
    for seed in range(200):
        token = sample(p[0], uniform(seed, 0, 5))
        assert rejection_sample_chain([token], [q], p, seed, 0)[0] == 1
