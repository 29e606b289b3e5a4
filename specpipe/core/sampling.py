"""Sampling math: logit warping, counter-based randomness and lossless rejection sampling.

Randomness is a pure function of (seed, absolute position, stream), so a seeded generation gives
the same tokens whatever the scheduling, batch mates or deployment (docs/design.md, "Verification").
"""

from __future__ import annotations

from typing import Sequence

import torch

from specpipe.core.types import SamplingParams, SparseDist

_MASK64 = (1 << 64) - 1

# Independent random streams per position.
STREAM_ACCEPT = 1    # verifier: accept/reject draft token
STREAM_SAMPLE = 2    # verifier: correction / bonus token
STREAM_DRAFT = 3     # drafter: draft token


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int, stream: int) -> float:
    """U[0, 1) as a pure function of (seed, absolute position, stream)."""
    h = _splitmix64(_splitmix64(_splitmix64(seed & _MASK64) ^ position) ^ stream)
    return (h >> 11) * 2.0**-53


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p. logits: [..., vocab] -> [..., vocab] float32."""
    logits = logits.float() / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)  # keep the smallest nucleus
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, u: float) -> int:
    """Inverse-CDF sample of one token from probs: [vocab] with u in [0, 1)."""
    cdf = torch.cumsum(probs.double(), dim=0)
    # right=True: the first index whose cdf exceeds u, so zero-mass tokens are never picked
    index = int(
        torch.searchsorted(
            cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64, device=cdf.device), right=True
        ).item()
    )
    return min(index, probs.shape[0] - 1)


def truncate(probs: torch.Tensor, max_entries: int) -> SparseDist:
    """The max_entries most likely tokens of probs: [vocab], renormalised (the drafter's sparse q)."""
    top = torch.topk(probs, min(max_entries, probs.shape[0]))
    keep = top.values > 0
    values = top.values[keep]
    values = values / values.sum()
    return SparseDist(tuple(top.indices[keep].tolist()), tuple(values.tolist()))


def sample_sparse(q: SparseDist, u: float) -> int:
    return q.token_ids[sample(torch.tensor(q.probs, dtype=torch.float64), u)]


def dense(q: SparseDist, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    out = torch.zeros(vocab_size, dtype=torch.float32, device=device)
    out[list(q.token_ids)] = torch.tensor(q.probs, dtype=torch.float32, device=device)
    return out


def rejection_sample_chain(
    tokens: Sequence[int],
    q: Sequence[SparseDist] | None,
    target_probs: torch.Tensor,
    seed: int,
    first_position: int,
) -> tuple[int, int]:
    """Lossless speculative sampling (Leviathan et al. 2023, eqs. 1-3; Duan et al. 2024, section 3).

    tokens: [n] draft chain; q: [n] drafter distributions (None = one-hot, e.g. n-gram drafts);
    target_probs: [n + 1, vocab] warped verifier distributions after the root and after each
    draft token; first_position: absolute position of tokens[0].
    Token x with drafter probability q(x) is accepted with probability min(1, p(x) / q(x)); on
    rejection the correction is sampled from norm(max(0, p - q)); if all are accepted the bonus
    token is sampled from p. Returns (accepted count, correction token).
    """
    vocab_size = target_probs.shape[-1]
    for i, token in enumerate(tokens):
        position = first_position + i
        p_row = target_probs[i]
        q_token = q[i].prob(token) if q is not None else 1.0
        if q_token > 0 and uniform(seed, position, STREAM_ACCEPT) < float(p_row[token]) / q_token:
            continue
        q_row = dense(q[i], vocab_size, p_row.device) if q is not None else torch.nn.functional.one_hot(
            torch.tensor(token, device=p_row.device), vocab_size).float()
        residual = torch.clamp(p_row - q_row, min=0.0)
        if float(residual.sum()) <= 0:  # p == q: rejection has probability 0, guard rounding
            residual = p_row
        return i, sample(residual, uniform(seed, position, STREAM_SAMPLE))
    position = first_position + len(tokens)
    return len(tokens), sample(target_probs[len(tokens)], uniform(seed, position, STREAM_SAMPLE))


def check_sampling(params: SamplingParams) -> None:
    """Raise InvalidArgument for settings that describe no distribution."""
    from specpipe.core.errors import InvalidArgument

    if not 0 <= params.temperature < float("inf"):
        raise InvalidArgument(f"temperature must be a finite number >= 0 (0 = greedy), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise InvalidArgument(f"top_p must be in (0, 1], got {params.top_p}")
    if not 0 <= params.top_k < 2**31:
        raise InvalidArgument(f"top_k must be in [0, 2**31) (0 = off), got {params.top_k}")
    if not 0 <= params.seed < 2**64:
        raise InvalidArgument(f"seed must be in [0, 2**64), got {params.seed}")
