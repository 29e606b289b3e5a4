"""llama.cpp baselines of `specpipe bench` (--baselines llama-cpp): llama-cpp-python's plain greedy
decoding and its prompt-lookup speculation on the verifier's own GGUF file (the one specpipe reads),
with a thread per core the pipeline uses, on the same prompt token ids.

llama.cpp computes on the GGUF's quantized blocks, a different computation from specpipe's, so its
output need not equal the verifier alone's: the run reports how often it does (the "identical to"
column), and the lossless check leaves these rows out. Each prompt starts from an empty KV cache (no
prefix reuse from the prompt before, as specpipe's sessions have none).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from specpipe.bench.measure import MethodRun, PromptRun
from specpipe.config.presets import ModelSpec
from specpipe.core.errors import FailedPrecondition

LLAMA_CPP = "llama.cpp"  # the baselines' names start with it
CONTEXT = 4096           # tokens of context: the longest bench prompt and its new tokens


def gguf_of(source: str) -> Path:
    """The GGUF file of a packaged, prepared model (`specpipe models prepare`)."""
    from specpipe.engine.models import packaged_gguf
    from specpipe.models import packaged

    if source not in packaged.PACKAGED:
        raise FailedPrecondition(f"the llama-cpp baseline reads a packaged model's GGUF file; {source!r} is not one "
                                 f"(choose a preset whose verifier is: {', '.join(sorted(packaged.PACKAGED))})")
    gguf = packaged_gguf(source)
    if gguf is None:
        raise FailedPrecondition(f"{source} is not prepared: run `specpipe models prepare` first")
    return gguf


def baseline_gguf(verifier: ModelSpec) -> Path:
    """The GGUF file the llama-cpp baselines read for the verifier, checked before any model loads: a
    packaged, prepared model, whole (llama.cpp runs every layer of the file), and llama-cpp-python installed."""
    gguf = gguf_of(verifier.source)
    if verifier.num_layers is not None:
        raise FailedPrecondition(f"the llama-cpp baseline runs the whole GGUF, not {verifier.label}")
    try:
        import llama_cpp  # noqa: F401
    except ImportError as err:
        raise FailedPrecondition("the llama-cpp baselines need llama-cpp-python: pip install -e \".[llama]\" "
                                 "(builds llama.cpp from source: docs/design.md)") from err
    return gguf


def load_llama(gguf: Path, threads: int, lookup_tokens: int | None = None) -> Any:
    """llama_cpp.Llama over gguf (prompt lookup drafting lookup_tokens a round, where given)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
    llama = Llama(model_path=str(gguf), n_ctx=CONTEXT, n_batch=512, n_threads=threads, n_threads_batch=threads,
                  draft_model=draft, verbose=False)
    llama.eval([llama.token_bos() if llama.token_bos() >= 0 else 0])  # warm up: the first forward allocates
    return llama


def llama_cpp_method(llama: Any, max_new_tokens: int, eos_token_ids: Sequence[int],
                     pinned: Callable[[], AbstractContextManager[Any]], lookup: bool = False) -> MethodRun:
    """Greedy decoding of prompt token ids on llama (load_llama), under the pinned context; output cut
    after the first EOS, as the transformers baselines'. Plain decoding feeds a token a forward, so
    rounds = tokens; prompt lookup's rounds are not known. The prefill is the time to the first token."""

    def run(prompt_id: str, prompt_ids: Sequence[int]) -> PromptRun:
        tokens: list[int] = []
        first = 0.0
        with pinned():
            llama.reset()  # an empty cache: no prefix of the last prompt reused
            start = time.perf_counter()
            for token in llama.generate(list(prompt_ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                        repeat_penalty=1.0, reset=True):
                first = first or time.perf_counter()
                tokens.append(int(token))
                if token in eos_token_ids or len(tokens) >= max_new_tokens:
                    break
            seconds = time.perf_counter() - start
        prefill_ms = (first - start) * 1e3 if first else seconds * 1e3
        return PromptRun(prompt_id, len(prompt_ids), tuple(tokens), seconds, rounds=0 if lookup else len(tokens),
                         prefill_ms=prefill_ms, prefill_tokens=1 if tokens else 0)

    return run


def llama_cpp_runs(gguf: Path, lookup_tokens: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int],
                   cores: list[int], pinned: Callable[[], AbstractContextManager[Any]]) -> dict[str, MethodRun]:
    """llama.cpp's plain decoding, then its prompt lookup at each of lookup_tokens, on gguf
    (baseline_gguf), a thread per core of cores (pinned: the context that runs on them)."""
    threads = max(1, len(cores))
    where = f"{threads} threads, {gguf.parent.name} GGUF"
    runs = {f"{LLAMA_CPP} plain, {where}": llama_cpp_method(load_llama(gguf, threads), max_new_tokens,
                                                             eos_token_ids, pinned)}
    for n in lookup_tokens:
        runs[f"{LLAMA_CPP} prompt lookup ({n} tokens), {where}"] = llama_cpp_method(
            load_llama(gguf, threads, n), max_new_tokens, eos_token_ids, pinned, lookup=True)
    return runs


def llama_cpp_references(methods: Sequence[str], verifier_alone: str) -> dict[str, str]:
    """What each llama.cpp run's output is compared with: plain decoding with the verifier alone's
    (how often llama.cpp gives specpipe's tokens), prompt lookup with llama.cpp's plain decoding."""
    plain = next((m for m in methods if m.startswith(f"{LLAMA_CPP} plain")), None)
    return {m: verifier_alone if m == plain or plain is None else plain for m in methods if m.startswith(LLAMA_CPP)}
