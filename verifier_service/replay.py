"""A verifier that answers from a recorded transcript of a model's greedy decoding (docs/pipeline.md,
"Replay"): the real presets at another device's speed in a load test, with the real model's acceptance.

A transcript (specpipe.core.transcript) holds, for each recorded prompt (its token ids), the model's greedy
continuation and the entropy of its distribution at each position (`specpipe transcript record`).
A session opened with a recorded prompt is a TokenSlot: the tokens a KV cache would hold. A round's
rows are answered from the transcript: a row whose path (the context, then the draft nodes up to it)
is the recorded sequence gets the recorded next token as its argmax and the recorded entropy, so a
verification accepts exactly the draft tokens the model's greedy decoding would and emits its next
token. A row off the transcript (after a rejected draft node) has no recorded answer: its argmax is
-1, which no draft token equals, and which the store's verifier table skips. No forward computes
anything, so held to a cost model (specpipe.engine.costmodel) every forward takes the curve's time.

Greedy rounds only (sampling needs the model's whole distribution); a prompt that was not recorded,
or a position past the recorded continuation, is FAILED_PRECONDITION.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from specpipe.config.limits import DEFAULT_LIMITS, Limits
from specpipe.config.services import BatchConfig
from specpipe.core.errors import FailedPrecondition
from specpipe.core.transcript import Entry, Transcript, replayed
from specpipe.core.types import Draft, SamplingParams
from specpipe.engine.costmodel import ClockedForward, ForwardCurve
from specpipe.engine.scheduler import Scheduler
from verifier_service.verifier import PendingRound, Scores, SessionVerifier

UNKNOWN = -1  # the argmax of a row off the transcript


class TokenSlot:
    """A replayed session's cache: the tokens a KV cache would hold, and how many of them follow the
    recorded sequence (agree)."""

    def __init__(self, entry: Entry, eos: int = UNKNOWN):
        self.sequence = entry.prompt_ids + entry.output_ids          # [prompt + output]
        self.entropy = (math.nan,) * len(entry.prompt_ids) + entry.entropy  # of the distribution choosing each
        # After an EOS the generation has ended: any answer serves the rows past it (the EOS again);
        # after a continuation cut at its length nothing is known.
        self.after_end = eos if entry.finish == "eos" else UNKNOWN
        self.tokens: list[int] = []
        self.agree = 0

    def recorded(self, position: int) -> int:
        return self.sequence[position] if position < len(self.sequence) else self.after_end

    @property
    def length(self) -> int:
        return len(self.tokens)

    def extend(self, token_ids: Sequence[int]) -> None:
        self.tokens.extend(token_ids)
        self._advance()

    def keep_tree_path(self, prefix_len: int, nodes: Sequence[int]) -> None:
        """Keep the first prefix_len tokens and, of those fed after them, the given nodes only."""
        tail = self.tokens[prefix_len:]
        del self.tokens[prefix_len:]
        self.tokens.extend(tail[i] for i in nodes)
        self.agree = min(self.agree, prefix_len)
        self._advance()

    def _advance(self) -> None:
        tokens, sequence = self.tokens, self.sequence
        while self.agree < len(tokens) and self.agree < len(sequence) and tokens[self.agree] == sequence[self.agree]:
            self.agree += 1


def replay_scores(slot: TokenSlot, token_ids: Sequence[int], positions: Sequence[int],
                  ancestors: Sequence[Sequence[int]], rows: int) -> Scores:
    """The last `rows` rows of a step fed after slot's tokens: ancestors[i], the step's tokens row i
    sees (its path, itself included); positions[i], its absolute position. A row on the recorded
    sequence gets the next recorded token and its entropy; any other row UNKNOWN and nan."""
    on_track = slot.agree >= slot.length
    argmax, entropy = [], []
    for i in range(len(token_ids) - rows, len(token_ids)):
        nxt = positions[i] + 1
        on = on_track and all(token_ids[j] == slot.recorded(positions[j]) for j in ancestors[i])
        argmax.append(slot.recorded(nxt) if on else UNKNOWN)
        entropy.append(slot.entropy[nxt] if on and nxt < len(slot.entropy) else math.nan)
    return Scores(argmax, entropy.__getitem__)


def replay_forward(segments: Sequence) -> list[Scores | None]:
    """A batched forward's contract (specpipe.engine.batched.Segment in, rows out) answered from each
    session's transcript; a prompt chunk needs no rows."""
    out: list[Scores | None] = []
    for segment in segments:
        slot: TokenSlot = segment.kv
        ids = segment.token_ids
        scores = None
        if segment.logit_rows:
            positions = segment.positions.tolist()
            ancestors: list[Sequence[int]]
            if positions[-1] - positions[0] == len(ids) - 1:  # a chain: each row sees the rows before it
                ancestors = [range(i + 1) for i in range(len(ids))]
            else:
                allowed = segment.allowed.tolist()
                ancestors = [[j for j in range(i + 1) if allowed[i][j]] for i in range(len(ids))]
            scores = replay_scores(slot, ids, positions, ancestors, segment.logit_rows)
        slot.extend(ids)
        out.append(scores)
    return out


class TranscriptVerifier(SessionVerifier):
    """specpipe.core.protocols.Verifier answering from a transcript, batched by the verifier's scheduler
    (the same gather policy, chunks and queue), each forward held to curve where one is given."""

    def __init__(self, transcript: Transcript, curve: ForwardCurve | None = None, max_sessions: int = 64,
                 session_ttl_s: float = 600.0, batch: BatchConfig | None = None, limits: Limits = DEFAULT_LIMITS):
        self.transcript = transcript
        forward = replay_forward if curve is None else ClockedForward(replay_forward, curve)
        scheduler = Scheduler(None, batch or BatchConfig(), "verifier", forward, attention=transcript.attention,
                              group=curve.group if curve is not None else None)
        super().__init__(replayed(transcript.info), scheduler, max_sessions, session_ttl_s, limits)

    def _new_cache(self, prompt_ids: Sequence[int]) -> TokenSlot:
        return TokenSlot(self.transcript.entry(prompt_ids), self._info.eos_token_ids[0] if self._info.eos_token_ids
                         else UNKNOWN)

    def _scores(self, rows: torch.Tensor | Scores, sampling: SamplingParams) -> Scores:
        assert isinstance(rows, Scores)  # replay_forward's rows
        return rows

    def _keep_path(self, cache: Any, prefix_len: int, nodes: Sequence[int]) -> None:
        cache.keep_tree_path(prefix_len, nodes)

    def _begin(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams,
               wait: bool) -> PendingRound:
        if not sampling.greedy:
            raise FailedPrecondition("the replay verifier answers greedy rounds only (its transcript is the model's "
                                     "greedy decoding); send temperature 0")
        return super()._begin(session_id, context_len, draft, sampling, wait)
