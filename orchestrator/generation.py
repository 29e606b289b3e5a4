"""One generation's state (Generation) and what a verified round adds to it: the tokens emitted,
cut at EOS, max_new_tokens or a stop string, and the text that is safe to stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from orchestrator.detokenize import Detokenizer
from orchestrator.stops import FINISH_STOP, find_stop, first_finish, streamable
from specpipe.core.types import GenerationRequest, VerifyResult


@dataclass
class Generation:
    request: GenerationRequest
    session_id: str                 # this generation's sessions on the verifier, drafters and store
    context: list[int]              # prompt + confirmed tokens
    output: list[int] = field(default_factory=list)  # the tokens emitted so far
    sent_text: str = ""             # the text streamed so far
    finish: str = ""                # "" while running, else eos | stop | length
    detokenizer: Detokenizer | None = None  # the output's text as it comes

    @staticmethod
    def open(request: GenerationRequest, session_id: str, detokenizer: Detokenizer) -> Generation:
        return Generation(request, session_id, list(request.prompt_ids), detokenizer=detokenizer)

    def room(self, emitted: int | None = None) -> int:
        """Draft tokens that can still be emitted after `emitted` output tokens (default: those so
        far); the round's correction takes one."""
        return self.request.max_new_tokens - (len(self.output) if emitted is None else emitted) - 1

    def window_room(self, max_context: int) -> int:
        """Draft nodes the verifier can still take: its window holds the context, the nodes and one
        position for the round's correction."""
        return max_context - len(self.context) - 1

    def emit(self, result: VerifyResult, detokenizer: Detokenizer, eos: Sequence[int]) -> tuple[list[int], str]:
        """Take a round's verified tokens: the ones emitted (up to the first finish) and the new text
        that is safe to stream (decoded incrementally; a stop string, and the end, from the whole output)."""
        count, self.finish = first_finish(result.emitted, len(self.output), self.request.max_new_tokens, eos,
                                          self.request.min_new_tokens)
        new_tokens = list(result.emitted[:count])
        text, stopped = detokenizer.extend(self.output, new_tokens), False
        if self.request.stop and find_stop(text, self.request.stop, len(self.sent_text)) >= 0:
            text, new_tokens, stopped = cut_at_stop(detokenizer.decode, self.output, new_tokens, self.request.stop,
                                                    len(self.sent_text))
        elif self.finish:
            text = detokenizer.decode(self.output + new_tokens)  # the final text, as decoding the output whole gives it
        self.finish = FINISH_STOP if stopped else self.finish
        self.output.extend(new_tokens)
        delta = text[len(self.sent_text):] if self.finish else streamable(text, self.request.stop)[len(self.sent_text):]
        self.sent_text += delta
        return new_tokens, delta

    def confirm(self, result: VerifyResult) -> None:
        """The round's tokens join the context (all of them: the verifier's session has them)."""
        self.context.extend(result.emitted)


def cut_at_stop(decode: Callable[[list[int]], str], output: list[int], new_tokens: list[int], stop: Sequence[str],
                sent: int) -> tuple[str, list[int], bool]:
    """The full output text after the new tokens; with a stop string in the text past `sent`, the
    text and the new tokens cut at the first token that completes it."""
    text = decode(output + new_tokens)
    if not stop or find_stop(text, stop, sent) < 0:
        return text, new_tokens, False
    for n in range(1, len(new_tokens) + 1):
        text = decode(output + new_tokens[:n])
        at = find_stop(text, stop, sent)
        if at >= 0:
            return text[:at], new_tokens[:n], True
    raise AssertionError("unreachable: the stop string was in the full text")
