"""llama.cpp baselines of `specpipe bench` (--baselines llama-cpp): llama-cpp-python's plain greedy
decoding and its prompt-lookup speculation on the verifier's own GGUF file (the one specpipe reads),
with a thread per core the pipeline uses, on the same prompt token ids, each in a process of its own
(specpipe/bench/llamacpp_worker.py run as a script: llama.cpp as its users run it, beside nothing of specpipe's,
with the caller's environment).

llama.cpp computes on the GGUF's quantized blocks, a different computation from specpipe's, so its
output need not equal the verifier alone's: the run reports how often it does (the "identical to"
column), and the lossless check leaves these rows out. Each prompt starts from an empty KV cache (no
prefix reuse from the prompt before, as specpipe's sessions have none).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import specpipe
from specpipe.bench import llamacpp_worker
from specpipe.bench.measure import MethodRun, PromptRun
from specpipe.config.presets import ModelSpec
from specpipe.core.errors import FailedPrecondition

LLAMA_CPP = "llama.cpp"  # the baselines' names start with it


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
    if importlib.util.find_spec("llama_cpp") is None:  # found, not loaded: it runs in workers of its own
        raise FailedPrecondition("the llama-cpp baselines need llama-cpp-python: pip install -e \".[llama]\" "
                                 "(builds llama.cpp from source: docs/design.md)")
    return gguf


def worker_environment() -> dict[str, str]:
    """The environment of a llama.cpp worker: this process's, with the caller's own OpenMP wait policy
    (specpipe sets its own before torch loads: specpipe/__init__.py), as a llama.cpp user runs it."""
    environment = dict(os.environ)
    if specpipe.CALLER_OMP_WAIT_POLICY is None:
        environment.pop("OMP_WAIT_POLICY", None)
    else:
        environment["OMP_WAIT_POLICY"] = specpipe.CALLER_OMP_WAIT_POLICY
    return environment


class LlamaWorker:
    """One llama.cpp baseline's process (specpipe.bench.llamacpp_worker) and the MethodRun that feeds it
    a prompt at a time. Plain decoding feeds a token a forward, so rounds = tokens; prompt lookup's
    rounds are not known. The prefill is the time to the first token. A worker that dies (llama.cpp
    crashed) fails the run with what it printed, never a silent row."""

    def __init__(self, gguf: Path, threads: int, max_new_tokens: int, eos_token_ids: Sequence[int],
                 cores: Sequence[int], lookup_tokens: int = 0) -> None:
        self.lookup = lookup_tokens > 0
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, llamacpp_worker.__file__, "--gguf", str(gguf), "--threads", str(threads),
             "--lookup-tokens", str(lookup_tokens), "--max-new-tokens", str(max_new_tokens),
             "--eos", ",".join(map(str, eos_token_ids)), "--cores", ",".join(map(str, cores))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=worker_environment())
        self._answer("loading the GGUF")

    def __call__(self, prompt_id: str, prompt_ids: Sequence[int]) -> PromptRun:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(list(prompt_ids)) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the worker is gone: _answer says why
        answer = self._answer(f"prompt {prompt_id}")
        tokens = tuple(answer["tokens"])
        return PromptRun(prompt_id, len(prompt_ids), tokens, answer["seconds"],
                         rounds=0 if self.lookup else len(tokens), prefill_ms=answer["prefill_ms"],
                         prefill_tokens=1 if tokens else 0)

    def _answer(self, doing: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line:
            return dict(json.loads(line))
        code = self.process.wait()
        self.stderr.seek(0)
        said = self.stderr.read()[-2000:]
        self.stderr.close()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        raise RuntimeError(f"llama.cpp's worker died ({how}) while {doing}: {said}")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


@contextlib.contextmanager
def llama_cpp_runs(gguf: Path, lookup_tokens: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int],
                   cores: list[int]) -> Iterator[dict[str, MethodRun]]:
    """llama.cpp's plain decoding, then its prompt lookup at each of lookup_tokens, on gguf
    (baseline_gguf), each in a worker process of its own pinned to cores, a thread per core."""
    threads = max(1, len(cores))
    where = f"{threads} threads, {gguf.parent.name} GGUF"
    with contextlib.ExitStack() as stack:
        def worker(lookup: int = 0) -> LlamaWorker:
            started = LlamaWorker(gguf, threads, max_new_tokens, eos_token_ids, cores, lookup)
            stack.callback(started.close)
            return started

        runs: dict[str, MethodRun] = {f"{LLAMA_CPP} plain, {where}": worker()}
        for n in lookup_tokens:
            runs[f"{LLAMA_CPP} prompt lookup ({n} tokens), {where}"] = worker(n)
        yield runs


def llama_cpp_references(methods: Sequence[str], verifier_alone: str) -> dict[str, str]:
    """What each llama.cpp run's output is compared with: plain decoding with the verifier alone's
    (how often llama.cpp gives specpipe's tokens), prompt lookup with llama.cpp's plain decoding."""
    plain = next((m for m in methods if m.startswith(f"{LLAMA_CPP} plain")), None)
    return {m: verifier_alone if m == plain or plain is None else plain for m in methods if m.startswith(LLAMA_CPP)}
