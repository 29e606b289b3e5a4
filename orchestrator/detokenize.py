"""A generation's output text as its tokens come (docs/pipeline.md, "Where the time goes").

Decoding the whole output again every round costs a round more as the output grows (O(n) a round,
O(n^2) a generation). tokenizers' DecodeStream decodes only the new tokens, holding back a character
split across tokens until it is whole, and gives the text that decoding the whole output gives (a
prefix of it while a character is incomplete), so the streamed text is the same. A tokenizer without
a fast backend decodes the whole output each round, as before."""

from __future__ import annotations

from collections.abc import Sequence

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers before 0.21
    DecodeStream = None


class Detokenizer:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._stream = DecodeStream(skip_special_tokens=True) if self._backend is not None and DecodeStream else None
        self.text = ""  # the output's text so far

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of tokens, decoded whole."""
        return self._tokenizer.decode(list(tokens), skip_special_tokens=True)

    def extend(self, output: Sequence[int], new_tokens: Sequence[int]) -> str:
        """The output's text once new_tokens follow output (the tokens given so far)."""
        if self._stream is None:
            self.text = self.decode([*output, *new_tokens])
        elif new_tokens:
            chunk = self._stream.step(self._backend, list(new_tokens))
            if chunk:
                self.text += chunk
        return self.text
