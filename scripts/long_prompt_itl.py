"""Inter-token latency of decoding sessions while a long prompt is admitted, with the prompt's
chunks bounded by time (--prefill-stall, the default 1.5) against fixed chunks of --prefill-chunk
tokens (stall 0), on one verifier pinned to one core, in one run (docs/batching.md).

    PYTHONPATH=. python scripts/long_prompt_itl.py --preset smollm2 --long-tokens 4096

Embedded (the default): the sessions and the verifier's scheduler run in this process, all on one
core. --served: a `specpipe up --pin` per setting (the verifier on a core of its own), the sessions
streaming from its orchestrator over gRPC, as a user's clients would.

For each setting: D sessions decode; after each has emitted a few tokens a prompt of --long-tokens
tokens is submitted; the decoding sessions' gaps between tokens are recorded without it (the first
phase) and while it is being prefilled (from its submission to its first token). Greedy, plain
batched decoding (drafter none), so the verifier's schedule alone is measured; with two or more
settings, the decoding sessions' outputs are checked equal across them (the golden tests check
batched output against the verifier alone).
A measurement, not a test: compare rows of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from orchestrator.generator import Generator
from specpipe.bench.loadruns import start_up
from specpipe.bench.prompts import load_suite
from specpipe.config.presets import model_specs
from specpipe.config.services import BatchConfig
from specpipe.core.types import GenerationChunk, GenerationRequest, SpeculationOptions
from specpipe.engine.models import load_model, load_tokenizer, model_info
from specpipe.serving.clients import GenerationClient
from verifier_service.verifier import ModelVerifier

NONE = SpeculationOptions(drafter="none", adaptive="off")
Generate = Callable[[dict, int], Iterator[GenerationChunk]]  # ({"messages" or "token_ids": ...}, max new tokens)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def long_prompt(encode: Callable[[str], list[int]], tokens: int) -> tuple[int, ...]:
    """Code prompts of the HumanEval suite, concatenated until `tokens` tokens."""
    ids: list[int] = []
    for prompt in load_suite("humaneval", 164) * 8:
        ids += encode(prompt.messages[-1][1])
        if len(ids) >= tokens:
            return tuple(ids[:tokens])
    return tuple(ids)


def decode(generate: Generate, source: dict, stop: threading.Event, started: threading.Event, out: dict) -> None:
    """Decode until stop is set; out: token times and ids, and the error that ended it early."""
    times, ids = [], []
    try:
        for chunk in generate(source, 4096):
            now = time.perf_counter()
            times += [now] * len(chunk.token_ids)
            ids += chunk.token_ids
            if len(ids) >= 4:
                started.set()
            if stop.is_set():
                break
    except Exception as err:  # reported by run_setting; the other sessions are stopped there
        out["error"] = err
    finally:
        started.set()
        out.update(times=times, ids=ids)


def failed(stop: threading.Event, threads: list[threading.Thread], outs: list[dict]) -> None:
    """Raise the first decoding session's error, once all sessions are stopped."""
    if errors := [o["error"] for o in outs if "error" in o]:
        stop.set()
        for thread in threads:
            thread.join()
        raise errors[0]


def run_setting(generate: Generate, prompts: list[dict], long_ids: tuple[int, ...], warm_s: float) -> dict:
    stop, outs, starts = threading.Event(), [{} for _ in prompts], [threading.Event() for _ in prompts]
    threads = [threading.Thread(target=decode, args=(generate, p, stop, s, o), daemon=True)
               for p, s, o in zip(prompts, starts, outs)]
    for thread in threads:
        thread.start()
    for event in starts:
        event.wait()
    failed(stop, threads, outs)
    time.sleep(warm_s)  # the first phase: decoding alone
    submitted = time.perf_counter()
    first = next(iter(generate({"token_ids": long_ids}, 1)))
    first_token = time.perf_counter()
    time.sleep(warm_s / 2)
    stop.set()
    for thread in threads:
        thread.join()
    failed(stop, threads, outs)

    def gaps(lo: float, hi: float) -> list[float]:
        return [(b - a) * 1e3 for o in outs for a, b in zip(o["times"], o["times"][1:]) if lo <= b <= hi and b > a]

    alone = gaps(0.0, submitted)
    admitting = gaps(submitted, first_token)
    return {"itl_alone_p50": percentile(alone, 50), "itl_alone_p99": percentile(alone, 99),
            "itl_admitting_p50": percentile(admitting, 50), "itl_admitting_p99": percentile(admitting, 99),
            "long_ttft_s": first_token - submitted, "gaps_alone": len(alone), "gaps_admitting": len(admitting),
            "gaps_admitting_ms": [round(g, 1) for g in admitting],
            "outputs": [o["ids"] for o in outs], "long_first_token": first.token_ids}


@contextlib.contextmanager
def embedded(spec, tokenizer, stall: float, prefill_chunk: int) -> Iterator[Generate]:
    """The verifier and the sessions in this process, on its one core."""
    model = load_model(spec)
    verifier = ModelVerifier(model, model_info(spec, model), mode="packed",
                             batch=BatchConfig(prefill_chunk=prefill_chunk, prefill_stall=stall))
    generator = Generator(tokenizer, verifier, {}, NONE)
    yield lambda source, n: generator.generate(GenerationRequest(generator.encode(**source), n, speculation=NONE))


@contextlib.contextmanager
def served(preset: str, stall: float, prefill_chunk: int, log_dir: Path) -> Iterator[Generate]:
    """A `specpipe up --pin` of its own; the sessions stream from its orchestrator over gRPC."""
    stack = start_up(["--preset", preset, "--pin", "--verifier-flags",
                      f"--prefill-stall {stall:g} --prefill-chunk {prefill_chunk}"], log_dir, timeout_s=600)
    try:
        with GenerationClient(stack.addresses["orchestrator"]) as client:
            yield lambda source, n: client.generate(**source, max_new_tokens=n, speculation=NONE)
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2")
    parser.add_argument("--long-tokens", type=int, default=4096)
    parser.add_argument("--sessions", type=int, default=2, help="decoding sessions (default: %(default)s)")
    parser.add_argument("--prefill-chunk", type=int, default=256)
    parser.add_argument("--stalls", default="0,1.5", help="--prefill-stall settings, 0 = fixed chunks")
    parser.add_argument("--warm-s", type=float, default=10.0, help="seconds of decoding alone (default: %(default)s)")
    parser.add_argument("--served", action="store_true", help="over gRPC, a `specpipe up --pin` per setting")
    parser.add_argument("--log-dir", default="long-prompt-itl-logs", help="--served: the services' logs")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    if not args.served and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)

    verifier_spec = model_specs(args.preset)[0]
    tokenizer = load_tokenizer(verifier_spec)
    long_ids = long_prompt(lambda text: tokenizer(text, add_special_tokens=True)["input_ids"], args.long_tokens)
    prompts = [{"messages": p.messages} for p in load_suite("gsm8k", args.sessions)]
    results = {}
    for stall in (float(s) for s in args.stalls.split(",")):
        setting = (served(args.preset, stall, args.prefill_chunk, Path(args.log_dir) / f"stall-{stall:g}")
                   if args.served else embedded(verifier_spec, tokenizer, stall, args.prefill_chunk))
        with setting as generate:
            result = run_setting(generate, prompts, long_ids, args.warm_s)
        results[f"prefill-stall {stall:g}"] = result
        print(f"prefill-stall {stall:g}: ITL p50 / p99 decoding alone {result['itl_alone_p50']:.1f} / "
              f"{result['itl_alone_p99']:.1f} ms; while a {len(long_ids)}-token prompt is admitted "
              f"{result['itl_admitting_p50']:.1f} / {result['itl_admitting_p99']:.1f} ms "
              f"(p99 ratio {result['itl_admitting_p99'] / result['itl_alone_p99']:.2f}x); its time to first "
              f"token {result['long_ttft_s']:.1f} s", flush=True)
    outputs = [r["outputs"] for r in results.values()]
    same = all(min(len(a), len(b)) > 0 and a[:min(len(a), len(b))] == b[:min(len(a), len(b))]
               for run in outputs[1:] for a, b in zip(outputs[0], run))
    print("decoding outputs agree across settings" if same else "DECODING OUTPUTS DIFFER")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "sessions": args.sessions, "prefill_chunk": args.prefill_chunk,
                       "served": args.served,
                       "results": {k: {n: v for n, v in r.items() if n != "outputs"} for k, r in results.items()}},
                      f, indent=1)


if __name__ == "__main__":
    main()
