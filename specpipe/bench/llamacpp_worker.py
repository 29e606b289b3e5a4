"""A llama.cpp baseline in a process of its own (`python specpipe/bench/llamacpp_worker.py`, a script: not
the specpipe package, whose import sets its own process settings), as its users run it: llama-cpp-python and
nothing of specpipe's (no torch, whose bundled libgomp.so.1 would
otherwise stand in for the system's under llama.cpp's OpenMP threads, nor specpipe's kernel).

It loads the GGUF, pins itself to --cores, says `{"ready": true}` on stdout, then answers each line of
stdin (a JSON list of prompt token ids) with one JSON line: the greedy tokens, cut after the first EOS
or at --max-new-tokens, the seconds they took and the milliseconds to the first. Standard library and
llama_cpp only: specpipe.bench.llamacpp starts it and turns its answers into PromptRuns.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

CONTEXT = 4096  # tokens of context: the longest bench prompt and its new tokens


def load_llama(gguf: str, threads: int, lookup_tokens: int) -> Any:
    """llama_cpp.Llama over gguf (prompt lookup drafting lookup_tokens a round where > 0), warmed up."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
    llama = Llama(model_path=gguf, n_ctx=CONTEXT, n_batch=512, n_threads=threads, n_threads_batch=threads,
                  draft_model=draft, verbose=False)
    llama.eval([llama.token_bos() if llama.token_bos() >= 0 else 0])  # the first forward allocates
    return llama


def decode(llama: Any, prompt_ids: list[int], max_new_tokens: int, eos: set[int]) -> dict[str, Any]:
    """Greedy decoding of prompt_ids from an empty cache (no prefix of the last prompt reused)."""
    tokens: list[int] = []
    first = 0.0
    llama.reset()
    start = time.perf_counter()
    for token in llama.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                reset=True):
        first = first or time.perf_counter()
        tokens.append(int(token))
        if token in eos or len(tokens) >= max_new_tokens:
            break
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "prefill_ms": ((first or start + seconds) - start) * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python specpipe/bench/llamacpp_worker.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", required=True, help="the GGUF file")
    parser.add_argument("--threads", type=int, required=True, help="llama.cpp's threads")
    parser.add_argument("--lookup-tokens", type=int, default=0, help="prompt lookup's tokens a round (0: plain)")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--eos", default="", help="EOS token ids, comma-separated")
    parser.add_argument("--cores", default="", help="the cores to run on, comma-separated (empty: as started)")
    args = parser.parse_args(argv)
    if args.cores:
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
    llama = load_llama(args.gguf, args.threads, args.lookup_tokens)
    eos = {int(t) for t in args.eos.split(",") if t}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps(decode(llama, json.loads(line), args.max_new_tokens, eos)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
