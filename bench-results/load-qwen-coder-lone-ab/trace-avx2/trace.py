"""Per-round trace of a lone session: the loadtest mix suite's first N prompts (its order, seed 0),
one after another, every chunk's RoundStats written as a JSON line.
Usage: python3 trace.py HOST:PORT OUT.jsonl N (../run.sh runs it with TRACE=1)."""
import json, random, sys, time
from dataclasses import asdict
from specpipe.bench.prompts import load_suite
from specpipe.serving.clients import GenerationClient

addr, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
prompts = [p for s in ("humaneval", "mtbench", "gsm8k") for p in load_suite(s, limit=20)]
random.Random(0).shuffle(prompts)
client = GenerationClient(addr)
with open(out, "w") as f:
    for p in prompts[:n]:
        t0 = time.perf_counter(); last = t0
        for chunk in client.generate(messages=p.messages, max_new_tokens=256):
            now = time.perf_counter()
            f.write(json.dumps({"prompt": p.id, "t_ms": (now - t0) * 1e3, "gap_ms": (now - last) * 1e3,
                                "tokens": len(chunk.token_ids), **(asdict(chunk.round) if chunk.round else {})}) + "\n")
            last = now
        f.flush()
        print(p.id, round(time.perf_counter() - t0, 1), flush=True)
