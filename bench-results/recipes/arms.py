"""The interleaved A/B loop the *-ab.py recipes share: each arm on a generator of its own, the arms in
turn on every prompt (the order alternating), so a host's drift hits all alike; every arm's output
must be the same."""

import argparse
import json
import time

from specpipe.bench.prompts import load_prompts_file, load_suite
from specpipe.core.types import GenerationRequest


def arm_parser(doc: str, limit: int = 8) -> argparse.ArgumentParser:
    """The arguments every A/B recipe takes (the model preset, the prompts, the answers' length, the
    JSON); the recipe adds its arms'."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--preset", default="qwen-coder")
    parser.add_argument("--suite", default="mtbench")
    parser.add_argument("--prompts", default=None, help="a JSONL prompt file instead of --suite")
    parser.add_argument("--limit", type=int, default=limit)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", default=None, help="write the per-prompt results here")
    return parser


def arm_prompts(args):
    return load_prompts_file(args.prompts, args.limit) if args.prompts else load_suite(args.suite, args.limit)


def run_arms(generators: dict, prompts, max_new_tokens: int, speculation, name: str, before=None) -> tuple[list, dict]:
    """generators: arm -> embedded generator; speculation: the requests' options, or arm -> options;
    before(arm), if given, runs ahead of each arm's turn. Returns the per-prompt rows and
    arm -> {tokens, seconds, tokens_per_s}."""
    arms = list(generators)
    rows, totals = [], {arm: [0.0, 0] for arm in arms}
    for i, prompt in enumerate(prompts):
        ids = generators[arms[0]].encode(messages=prompt.messages)
        outputs = set()
        for arm in arms if i % 2 == 0 else arms[::-1]:
            if before is not None:
                before(arm)
            start = time.perf_counter()
            options = speculation[arm] if isinstance(speculation, dict) else speculation
            chunks = list(generators[arm].generate(GenerationRequest(ids, max_new_tokens, speculation=options)))
            seconds = time.perf_counter() - start
            tokens = tuple(t for chunk in chunks for t in chunk.token_ids)
            rounds = [chunk.round for chunk in chunks if chunk.round is not None]
            outputs.add(tokens)
            totals[arm][0] += seconds
            totals[arm][1] += len(tokens)
            rows.append({"prompt": prompt.id, name: arm, "tokens": len(tokens), "seconds": seconds,
                         **{field: sum(getattr(r, field) for r in rounds) for field in ("drafted", "accepted")},
                         "rounds": len(rounds)})
            print(f"{prompt.id} {name} {arm}: {len(tokens) / seconds:.2f} tokens/s", flush=True)
        assert len(outputs) == 1, f"{prompt.id}: the arms' outputs differ"
    summary = {str(arm): {"tokens": n, "seconds": s, "tokens_per_s": n / s} for arm, (s, n) in totals.items()}
    for arm, row in summary.items():
        print(f"{name} {arm}: {row['tokens_per_s']:.3f} tokens/s over {row['tokens']} tokens")
    return rows, summary


def write_json(path: str | None, args, summary: dict, rows: list) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"args": vars(args), "summary": summary, "prompts": rows}, f, indent=1)
