"""The small model's drafting algorithm as a coroutine over forwards (docs/design.md, "Drafting"), so that one
code drafts both alone (each forward run at once) and batched (each forward joins the drafter
scheduler's next batch with the steps of every other pending proposal).

draft_steps yields the token ids to feed next (the context past what the KV cache holds, in chunks,
then one token per draft depth), receives the logits [vocab] after the last token fed, and returns
the Draft: the greedy chain (with the top-(width - 1) alternatives at the first BRANCH_LEVELS levels)
or, when sampling, a chain sampled from the warped distribution q (truncated to max_q_entries), with
randomness a pure function of (seed, absolute position).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

import torch

from specpipe.core.errors import InvalidArgument
from specpipe.core.sampling import STREAM_DRAFT, check_sampling, sample_sparse, truncate, uniform, warp
from specpipe.core.types import ROOT, Draft, ProposeRequest, SamplingParams, SparseDist
from specpipe.core.verification import check_token_ids

BRANCH_LEVELS = 2  # tree drafts add the top-(width - 1) alternatives at this many first levels


def check_proposal(request: ProposeRequest, vocab_size: int) -> None:
    """A proposal's arguments, checked before any work (INVALID_ARGUMENT)."""
    if not request.session_id:
        raise InvalidArgument("session_id is empty")
    check_token_ids(request.context, vocab_size, "context")
    check_sampling(request.sampling)
    if request.draft_len < 0 or request.width < 1:
        raise InvalidArgument(f"draft_len must be >= 0 and width >= 1, got {request.draft_len} and {request.width}")


@dataclass
class Nodes:
    """A draft being built, one column per Draft field."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q: list[SparseDist] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    runner_up: list[int] = field(default_factory=list)
    runner_up_confidence: list[float] = field(default_factory=list)

    def add(self, token: int, parent: int, probs: torch.Tensor, runner_up: int, q: SparseDist | None = None) -> int:
        """Append a node (probs: the drafter's distribution there); returns its index."""
        self.tokens.append(token)
        self.parents.append(parent)
        if q is not None:
            self.q.append(q)
        self.confidence.append(float(probs[token]))
        self.runner_up.append(runner_up)
        self.runner_up_confidence.append(float(probs[runner_up]) if runner_up >= 0 else 0.0)
        return len(self.tokens) - 1

    def draft(self, sampled: bool) -> Draft:
        return Draft(tuple(self.tokens), tuple(self.parents), tuple(self.q) if sampled else None,
                     confidence=tuple(self.confidence), runner_up=tuple(self.runner_up),
                     runner_up_confidence=tuple(self.runner_up_confidence))


def draft_steps(
    context: Sequence[int],
    cached: int,
    draft_len: int,
    width: int,
    sampling: SamplingParams,
    max_q_entries: int,
    chunk: int,
    stop_confidence: float = 0.0,
) -> Generator[list[int], torch.Tensor, Draft]:
    """Draft draft_len levels after context, whose first `cached` tokens (< len(context)) the cache
    holds: yields the tokens to feed (context[cached:] in chunks of at most `chunk`, then each chain
    token but the last), receives the logits [vocab] after them, returns the draft. A greedy chain
    ends early after a token of probability below stop_confidence: what follows it would mostly be
    drafted for nothing."""
    for start in range(cached, len(context), chunk):
        logits = yield list(context[start : start + chunk])
    nodes = Nodes()
    parent = ROOT
    for depth in range(draft_len):
        probs = logits.softmax(-1)
        branches = width if depth < BRANCH_LEVELS else 1
        top = probs.topk(min(max(2, branches), probs.shape[-1])).indices.tolist()
        q = None
        if sampling.greedy:
            token, alternatives = top[0], top[1:branches]
        else:
            q = truncate(warp(logits, sampling), max_q_entries)
            token, alternatives = sample_sparse(q, uniform(sampling.seed, len(context) + depth, STREAM_DRAFT)), []
        other = next((t for t in top if t != token), -1)
        chain_parent, parent = parent, nodes.add(token, parent, probs, other, q)
        for alternative in alternatives:  # siblings of the chain node: leaves of the tree
            nodes.add(alternative, chain_parent, probs, -1)
        if sampling.greedy and nodes.confidence[parent] < stop_confidence:
            break
        if depth + 1 < draft_len:
            logits = yield [token]
    return nodes.draft(sampled=not sampling.greedy)
