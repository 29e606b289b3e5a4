"""The pipeline's ceiling in one process (docs/pipeline.md): USERS threads generating through the embedded
generator over a replayed verifier held to the packaged H200 curve, no gRPC and no load generator, so what
is left is the generation loop, the batch scheduler and the GIL. Prints tokens/s, the verifier's busy share,
sessions and tokens per forward, and the process's CPU per token.

    python3 bench-results/recipes/inprocess-ceiling.py --transcript T.json.gz --users 32 [--drafter none]

The transcript: `specpipe transcript record` (its preset's tokenizer is loaded by name, --tokenizer)."""

from __future__ import annotations

import argparse
import json
import resource
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcript", required=True, help="a replay transcript (specpipe transcript record)")
    parser.add_argument("--tokenizer", default="qwen2.5-coder-1.5b", help="the packaged model whose tokenizer")
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--drafter", default="none", help="none or ngram (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prefill-stall", type=float, default=None, help="the verifier's (default: its default)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()

    from cache_service.memory import InMemoryNgramCache
    from orchestrator.generator import Generator
    from specpipe.app.wiring import build_drafters
    from specpipe.config.presets import ModelSpec
    from specpipe.config.services import BatchConfig
    from specpipe.core.transcript import load
    from specpipe.core.types import GenerationRequest, SpeculationOptions
    from specpipe.engine.costmodel import load_curve
    from specpipe.engine.models import load_tokenizer
    from specpipe.runtime import metrics
    from verifier_service import replay

    transcript = load(args.transcript)
    batch = BatchConfig() if args.prefill_stall is None else BatchConfig(prefill_stall=args.prefill_stall)
    verifier = replay.TranscriptVerifier(transcript, load_curve("nvidia-h200-qwen-coder", "verifier"),
                                         max_sessions=4 * args.users, batch=batch)
    store = InMemoryNgramCache()
    spec = SpeculationOptions(drafter=args.drafter)
    generator = Generator(load_tokenizer(ModelSpec(args.tokenizer)), verifier,
                          build_drafters(("ngram",), store, None, verifier.info()), spec, store)
    tokens, stop = [0], time.perf_counter() + args.seconds

    def user(first: int) -> None:
        n = first
        while time.perf_counter() < stop:
            entry = transcript.entries[n % len(transcript.entries)]
            n += args.users
            request = GenerationRequest(entry.prompt_ids, args.max_new_tokens, speculation=spec)
            for chunk in generator.generate(request):
                tokens[0] += len(chunk.token_ids)

    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    threads = [threading.Thread(target=user, args=(i,)) for i in range(args.users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = after.ru_utime + after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime
    forwards = metrics.FORWARDS.labels(role="verifier")._value.get()
    figures = {"users": args.users, "drafter": args.drafter, "tokens_per_s": tokens[0] / elapsed,
               "busy_share": metrics.FORWARD_SECONDS.labels(role="verifier")._value.get() / elapsed,
               "sessions_per_forward": metrics.VERIFY_BATCH_SESSIONS._sum.get() / forwards,
               "tokens_per_forward": metrics.VERIFY_BATCH_TOKENS._sum.get() / forwards,
               "cpu_us_per_token": cpu_s * 1e6 / max(1, tokens[0]), "clock": verifier.info().model_name}
    print(json.dumps(figures))
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps(figures) + "\n")


if __name__ == "__main__":
    main()
