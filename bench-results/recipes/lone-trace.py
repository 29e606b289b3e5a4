"""Per-round trace of a lone session: the loadtest mix suite's first N prompts (its order, seed 0),
one after another, every chunk's RoundStats written as a JSON line (load-lone-ab.sh runs it with
TRACE=1; lone-trace-summary.py sums a trace per prompt).

    PYTHONPATH=. python3 bench-results/recipes/lone-trace.py 127.0.0.1:51000 /tmp/lone/trace-on.jsonl 6
"""

import argparse
import json
import random
import time
from dataclasses import asdict

from specpipe.bench.prompts import load_suite
from specpipe.serving.clients import GenerationClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("addr", help="HOST:PORT of an orchestrator")
    parser.add_argument("out", help="the JSONL trace to write")
    parser.add_argument("n", type=int, help="prompts, one after another")
    args = parser.parse_args()
    prompts = [p for s in ("humaneval", "mtbench", "gsm8k") for p in load_suite(s, limit=20)]
    random.Random(0).shuffle(prompts)
    client = GenerationClient(args.addr)
    with open(args.out, "w") as f:
        for p in prompts[:args.n]:
            t0 = time.perf_counter()
            last = t0
            for chunk in client.generate(messages=p.messages, max_new_tokens=256):
                now = time.perf_counter()
                f.write(json.dumps({"prompt": p.id, "t_ms": (now - t0) * 1e3, "gap_ms": (now - last) * 1e3,
                                    "tokens": len(chunk.token_ids),
                                    **(asdict(chunk.round) if chunk.round else {})}) + "\n")
                last = now
            f.flush()
            print(p.id, round(time.perf_counter() - t0, 1), flush=True)


if __name__ == "__main__":
    main()
