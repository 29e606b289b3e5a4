"""Where a round's wall time goes, hop by hop, from a trace file: the spans that `specpipe up --tracing on
--trace-file FILE` writes while a load runs. For every traced round (its generation's first and last
left out) the orchestrator's round span, its verify call, and the verifier's server span with its
queue, forward and verdict are matched, and the gaps between them reported (mean, p50, p90 in ms):
the way to the verifier, its queue, its forward, the way back.

    specpipe up --preset tiny --pin --cost-model nvidia-h200-qwen-coder --replay T --tracing on \\
      --trace-ratio 0.2 --trace-file spans.jsonl &
    specpipe loadtest --addr 127.0.0.1:50051 --shape constant --users 32 --run-time 30 --drafter none
    python3 bench-results/recipes/round-timeline.py spans.jsonl
"""

import argparse
import collections
import json
import statistics
from datetime import datetime

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("spans", help="a --trace-file: one finished span as JSON a line")
parser.add_argument("--json", default=None, help="also write the table here")
args = parser.parse_args()


def ms(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1e3


spans, children = [], collections.defaultdict(list)
with open(args.spans) as f:
    for line in f:
        span = json.loads(line)
        span["s"], span["e"] = ms(span["start_time"]), ms(span["end_time"])
        span["service"] = span["resource"]["attributes"]["service.name"]
        spans.append(span)
        children[span["parent_id"]].append(span)

rows = collections.defaultdict(list)
for generation in (s for s in spans if s["name"] == "generation"):
    rounds = sorted((c for c in children[generation["context"]["span_id"]] if c["name"] == "round"),
                    key=lambda r: r["s"])
    for r in rounds[1:-1]:
        verify = next((c for c in children[r["context"]["span_id"]] if c["name"] == "verify"), None)
        server = verify and next((c for c in children[verify["context"]["span_id"]]
                                  if c["service"] == "specpipe-verifier"), None)
        if server is None:
            continue
        parts = {c["name"]: c for c in children[server["context"]["span_id"]]}
        rows["round"].append(r["e"] - r["s"])
        rows["orchestrator before the call"].append(verify["s"] - r["s"])
        rows["to the verifier (the stream's way there)"].append(server["s"] - verify["s"])
        for name in ("queue", "forward", "verdict"):
            if name in parts:
                rows[f"verifier {name}"].append(parts[name]["e"] - parts[name]["s"])
        if "forward" in parts:
            rows["sessions a forward"].append(parts["forward"]["attributes"].get("specpipe.batch.sessions", 0))
        rows["back to the orchestrator (the stream's way back)"].append(verify["e"] - server["e"])
        rows["orchestrator after the reply"].append(r["e"] - verify["e"])

table = {}
for name, values in rows.items():
    values.sort()
    table[name] = {"n": len(values), "mean": statistics.mean(values), "p50": values[len(values) // 2],
                   "p90": values[int(len(values) * 0.9)]}
    print(f"{name:50s} mean {table[name]['mean']:7.2f}  p50 {table[name]['p50']:7.2f}  p90 {table[name]['p90']:7.2f}")
if args.json:
    with open(args.json, "w") as f:
        json.dump(table, f, indent=1)
