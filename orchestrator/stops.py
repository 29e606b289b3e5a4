"""Where a generation ends and which text is safe to stream (pure functions)."""

from __future__ import annotations

from typing import Sequence

FINISH_EOS = "eos"
FINISH_STOP = "stop"
FINISH_LENGTH = "length"


def find_stop(text: str, stop: Sequence[str], start: int = 0) -> int:
    """Index in text of the earliest stop string that ends at or after `start`, or -1."""
    hits = [i for s in stop if (i := text.find(s, max(0, start - len(s) + 1))) >= 0]
    return min(hits) if hits else -1


def streamable(text: str, stop: Sequence[str]) -> str:
    """The prefix of text that can be sent now: hold back an incomplete UTF-8 character (decoded as
    U+FFFD) and any tail that may still grow into a stop string."""
    end = len(text)
    while end > 0 and text[end - 1] == "\ufffd":
        end -= 1
    for s in stop:
        for n in range(min(len(s) - 1, end), 0, -1):
            if text[:end].endswith(s[:n]):
                end -= n
                break
    return text[:end]


def first_finish(
    new_tokens: Sequence[int], produced: int, max_new_tokens: int, eos_token_ids: Sequence[int],
    min_new_tokens: int = 0,
) -> tuple[int, str]:
    """How many of a round's new tokens to emit and why the generation ends ("" if it goes on). An EOS
    among the first min_new_tokens outputs is emitted like any token and does not end it (the model's
    own tokens all the same: nothing is masked)."""
    for i, token in enumerate(new_tokens):
        if token in eos_token_ids and produced + i >= min_new_tokens:
            return i + 1, FINISH_EOS
        if produced + i + 1 >= max_new_tokens:
            return i + 1, FINISH_LENGTH
    return len(new_tokens), ""
