"""The replay transcript (docs/pipeline.md, "Replay"): a preset's greedy decoding of the load test's
prompts, which a replayed verifier (verifier_service/replay.py) and a replayed model drafter
(drafter_service/replay.py) answer from instead of running their models.

Each entry holds a prompt's ids, the verifier's greedy continuation and the entropy at each of its
positions, and, where the drafter was recorded, the small model's two likeliest tokens and their
probabilities at each position of that continuation (teacher-forced: what it would draft there on
the verified context). Written by `specpipe transcript record` (specpipe.bench.transcript)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specpipe.core.errors import FailedPrecondition, InvalidArgument
from specpipe.core.types import ModelInfo

FORMAT = 1
DRAFT_TOP = 2  # the drafter's likeliest tokens recorded at each position


@dataclass(frozen=True)
class Entry:
    """One recorded prompt: its ids, the greedy continuation (EOS included when it ended there), the
    entropy (nats) of the distribution that chose each continuation token, and, where recorded, the
    drafter's DRAFT_TOP likeliest tokens and their probabilities at each continuation position."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    entropy: tuple[float, ...]   # [len(output_ids)]
    finish: str                  # eos | length
    prompt_id: str = ""
    draft_top: tuple[tuple[int, ...], ...] = ()      # [len(output_ids)][DRAFT_TOP]; () not recorded
    draft_p: tuple[tuple[float, ...], ...] = ()      # their probabilities

    def __post_init__(self) -> None:
        if len(self.entropy) != len(self.output_ids):
            raise InvalidArgument(f"transcript entry {self.prompt_id!r}: {len(self.output_ids)} tokens but "
                                  f"{len(self.entropy)} entropies")
        if self.draft_top and not len(self.draft_top) == len(self.draft_p) == len(self.output_ids):
            raise InvalidArgument(f"transcript entry {self.prompt_id!r}: {len(self.output_ids)} tokens but the "
                                  f"drafter's table has {len(self.draft_top)} positions")


@dataclass(frozen=True)
class Transcript:
    info: ModelInfo              # the recorded verifier's, as it served them
    attention: float             # the model's attention weight (specpipe.engine.planner.attention_weight)
    entries: tuple[Entry, ...]
    source: str = ""             # the command that recorded it
    drafter: ModelInfo | None = None  # the recorded drafter's, where its table is recorded

    def entry(self, prompt_ids: Sequence[int]) -> Entry:
        found = self._index().get(tuple(prompt_ids))
        if found is None:
            raise FailedPrecondition(f"this prompt ({len(prompt_ids)} tokens) is not in the replay transcript, which "
                                     f"holds {len(self.entries)} prompts: replay serves the prompts it was recorded on "
                                     "(specpipe transcript record)")
        return found

    def entry_of_context(self, context: Sequence[int]) -> Entry:
        """The entry whose prompt context starts with (of several, the one whose continuation it follows
        longest: a branch schedule's pre-draft may be after a predicted, not a recorded, outcome)."""
        best, agreed = None, -1
        for entry in self.entries:
            n = len(entry.prompt_ids)
            if len(context) >= n and tuple(context[:n]) == entry.prompt_ids:
                tail = context[n:]
                same = next((i for i, (a, b) in enumerate(zip(tail, entry.output_ids)) if a != b),
                            min(len(tail), len(entry.output_ids)))
                if same > agreed:
                    best, agreed = entry, same
        if best is None:
            raise FailedPrecondition(f"this context ({len(context)} tokens) starts with no recorded prompt: replay "
                                     f"serves the {len(self.entries)} prompts it was recorded on (specpipe "
                                     "transcript record)")
        return best

    def _index(self) -> dict[tuple[int, ...], Entry]:
        index = self.__dict__.get("_by_prompt")
        if index is None:
            index = {e.prompt_ids: e for e in self.entries}
            object.__setattr__(self, "_by_prompt", index)
        return index


def replayed(info: ModelInfo) -> ModelInfo:
    """What a replayed role serves as: the recorded model's info, named as replayed (no draft methods)."""
    return ModelInfo(f"{info.model_name} (replayed)", info.vocab_size, info.eos_token_ids, info.max_context,
                     info.vocab_fingerprint)


def save(transcript: Transcript, path: str | Path) -> None:
    data = {"format": FORMAT, "info": _info_data(transcript.info), "attention": transcript.attention,
            "source": transcript.source, "entries": [asdict(e) for e in transcript.entries]}
    if transcript.drafter is not None:
        data["drafter"] = _info_data(transcript.drafter)
    with gzip.open(path, "wt") as out:
        json.dump(data, out)


def _info_data(info: ModelInfo) -> dict[str, Any]:
    """A model's info as recorded: what the model is, not how a server runs it (its captured step)."""
    data = asdict(info)
    del data["max_step_tokens"]
    return data


def _info(data: dict[str, Any]) -> ModelInfo:
    return ModelInfo(**{**data, "eos_token_ids": tuple(data["eos_token_ids"]), "methods": tuple(data["methods"])})


def load(path: str | Path) -> Transcript:
    try:
        with gzip.open(path, "rt") as file:
            data = json.load(file)
    except (OSError, ValueError, EOFError) as err:
        raise InvalidArgument(f"replay transcript {path}: not a readable transcript file: {err}") from None
    if data.get("format") != FORMAT:
        raise InvalidArgument(f"replay transcript {path}: format {data.get('format')!r}, this version reads {FORMAT}")
    entries = tuple(Entry(tuple(e["prompt_ids"]), tuple(e["output_ids"]), tuple(e["entropy"]), e["finish"],
                          e.get("prompt_id", ""), tuple(map(tuple, e.get("draft_top", ()))),
                          tuple(map(tuple, e.get("draft_p", ())))) for e in data["entries"])
    drafter = _info(data["drafter"]) if data.get("drafter") else None
    return Transcript(_info(data["info"]), float(data["attention"]), entries, data.get("source", ""), drafter)
