"""Per prompt, from lone-trace.py's files: rounds, tokens, plain rounds (and at which round), draft
tokens verified and accepted, pre-draft hits, mean verify and draft time, verifier idle, time.

    python3 bench-results/recipes/lone-trace-summary.py /tmp/lone/trace-off.jsonl /tmp/lone/trace-on.jsonl
"""

import argparse
import collections
import json


def summarize(path: str) -> None:
    by_prompt = collections.defaultdict(list)
    for line in open(path):
        row = json.loads(line)
        by_prompt[row["prompt"]].append(row)
    print("==", path)
    for prompt, chunks in by_prompt.items():
        rounds = [r for r in chunks if "drafted" in r]
        drafting = [r for r in rounds if r["drafted"]]
        plain = [i for i, r in enumerate(rounds) if not r["drafted"]]
        print(
            f"{prompt:18s} rounds {len(rounds):4d} tokens {sum(r['tokens'] for r in chunks):4d} plain {len(plain):3d} "
            f"drafted {sum(r['drafted'] for r in rounds):5d} accepted {sum(r['accepted'] for r in rounds):4d} "
            f"hits {sum(r['hit'] for r in rounds):3d}/{sum(1 for r in rounds if r['hypotheses']):3d} "
            f"verify_ms {sum(r['verify_ms'] for r in rounds) / max(1, len(rounds)):6.1f} "
            f"draft_ms {sum(r['draft_ms'] for r in drafting) / max(1, len(drafting)):6.1f} "
            f"idle {sum(r['idle_ms'] for r in rounds) / 1e3:5.1f}s time {chunks[-1]['t_ms'] / 1e3:6.1f}s"
        )
        print("   plain rounds:", plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="lone-trace.py's JSONL files")
    for path in parser.parse_args().traces:
        summarize(path)


if __name__ == "__main__":
    main()
