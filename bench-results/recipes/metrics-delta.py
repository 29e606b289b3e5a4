"""What each run changed in the services' counters: DIR/before-TAG.txt and DIR/after-TAG.txt (the
Prometheus scrapes load-lone-ab.sh and load-warm-ab.sh take around each run), one column per tag;
--summary instead prints, per tag, the drafting figures load-warm-ab.sh compares (drafts, the mean
draft time, draft tokens per round, acceptance, sessions per verifier forward).

    python3 bench-results/recipes/metrics-delta.py /tmp/lone off on
"""

import argparse


def load(path: str) -> dict[str, float]:
    """metric{labels} -> value, of a scrape's sample lines."""
    values = {}
    for line in open(path):
        if line.startswith("#") or " " not in line.strip():
            continue
        key, value = line.rsplit(" ", 1)
        try:
            values[key] = float(value)
        except ValueError:
            pass
    return values


def deltas(folder: str, tag: str) -> dict[str, float]:
    before, after = load(f"{folder}/before-{tag}.txt"), load(f"{folder}/after-{tag}.txt")
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def table(folder: str, tags: list[str]) -> None:
    changed = {tag: deltas(folder, tag) for tag in tags}
    for key in sorted(set().union(*changed.values())):
        values = [changed[tag].get(key, 0.0) for tag in tags]
        if any(values) and key.rsplit("{", 1)[0].endswith(("_total", "_sum", "_count")):  # counters
            print(key, *(f"{v:.1f}" for v in values))


def summary(folder: str, tags: list[str]) -> None:
    for tag in tags:
        d = {key.split(":", 1)[-1].replace("specpipe_", ""): value for key, value in deltas(folder, tag).items()}
        drafted, drafts = d.get("drafted_tokens_total", 0.0), d.get("draft_ms_count", 0.0)
        batches = d.get("verify_batch_sessions_count", 0.0)
        print(f"{tag}: drafts {drafts:.0f}, mean draft {d.get('draft_ms_sum', 0.0) / max(drafts, 1):.0f} ms, "
              f"drafted per round {drafted / max(d.get('rounds_total', 0.0), 1):.3f}, "
              f"accepted {d.get('accepted_tokens_total', 0.0) / max(drafted, 1):.2f}, "
              f"sessions per forward {d.get('verify_batch_sessions_sum', 0.0) / max(batches, 1):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where before-TAG.txt and after-TAG.txt are")
    parser.add_argument("tags", nargs="+", help="the runs, e.g. off on")
    parser.add_argument("--summary", action="store_true", help="the drafting figures per tag instead of the table")
    args = parser.parse_args()
    (summary if args.summary else table)(args.folder, args.tags)


if __name__ == "__main__":
    main()
