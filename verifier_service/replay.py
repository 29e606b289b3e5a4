"""A verifier that answers from a recorded transcript of a model's greedy decoding (docs/pipeline.md,
"Replay"): the real presets at another device's speed in a load test, with the real model's acceptance.

A transcript holds, for each recorded prompt (its token ids), the model's greedy continuation and the
entropy of its distribution at each position (`specpipe transcript record`, specpipe.bench.transcript).
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

import gzip
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specpipe.config.limits import DEFAULT_LIMITS, Limits
from specpipe.config.services import BatchConfig
from specpipe.core.errors import FailedPrecondition, InvalidArgument
from specpipe.core.types import Draft, ModelInfo, SamplingParams
from specpipe.engine.costmodel import ClockedForward, ForwardCurve
from specpipe.engine.scheduler import Scheduler
from verifier_service.verifier import PendingRound, Scores, SessionVerifier

FORMAT = 1
UNKNOWN = -1  # the argmax of a row off the transcript


@dataclass(frozen=True)
class Entry:
    """One recorded prompt: its ids, the greedy continuation (EOS included when it ended there) and the
    entropy (nats) of the distribution that chose each continuation token."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    entropy: tuple[float, ...]   # [len(output_ids)]
    finish: str                  # eos | length
    prompt_id: str = ""

    def __post_init__(self) -> None:
        if len(self.entropy) != len(self.output_ids):
            raise InvalidArgument(f"transcript entry {self.prompt_id!r}: {len(self.output_ids)} tokens but "
                                  f"{len(self.entropy)} entropies")


@dataclass(frozen=True)
class Transcript:
    info: ModelInfo              # the recorded verifier's, as it served them
    attention: float             # the model's attention weight (specpipe.engine.planner.attention_weight)
    entries: tuple[Entry, ...]
    source: str = ""             # the command that recorded it

    def entry(self, prompt_ids: Sequence[int]) -> Entry:
        found = self._index().get(tuple(prompt_ids))
        if found is None:
            raise FailedPrecondition(f"this prompt ({len(prompt_ids)} tokens) is not in the replay transcript, which "
                                     f"holds {len(self.entries)} prompts: replay serves the prompts it was recorded on "
                                     "(specpipe transcript record)")
        return found

    def _index(self) -> dict[tuple[int, ...], Entry]:
        index = self.__dict__.get("_by_prompt")
        if index is None:
            index = {e.prompt_ids: e for e in self.entries}
            object.__setattr__(self, "_by_prompt", index)
        return index


def save(transcript: Transcript, path: str | Path) -> None:
    data = {"format": FORMAT, "info": asdict(transcript.info), "attention": transcript.attention,
            "source": transcript.source, "entries": [asdict(e) for e in transcript.entries]}
    with gzip.open(path, "wt") as out:
        json.dump(data, out)


def load(path: str | Path) -> Transcript:
    try:
        with gzip.open(path, "rt") as file:
            data = json.load(file)
    except (OSError, ValueError, EOFError) as err:
        raise InvalidArgument(f"replay transcript {path}: not a readable transcript file: {err}") from None
    if data.get("format") != FORMAT:
        raise InvalidArgument(f"replay transcript {path}: format {data.get('format')!r}, this version reads {FORMAT}")
    info = data["info"]
    info = ModelInfo(**{**info, "eos_token_ids": tuple(info["eos_token_ids"]), "methods": tuple(info["methods"])})
    entries = tuple(Entry(tuple(e["prompt_ids"]), tuple(e["output_ids"]), tuple(e["entropy"]), e["finish"],
                          e.get("prompt_id", "")) for e in data["entries"])
    return Transcript(info, float(data["attention"]), entries, data.get("source", ""))


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
        info = ModelInfo(f"{transcript.info.model_name} (replayed)", transcript.info.vocab_size,
                         transcript.info.eos_token_ids, transcript.info.max_context, transcript.info.vocab_fingerprint)
        super().__init__(info, scheduler, max_sessions, session_ttl_s, limits)

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
