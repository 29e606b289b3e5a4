"""The record of a scripts/gpu_check.py run as a markdown page, with what its costs imply: the speed-up
bound that the CPU runs' measured acceptance would give on that GPU, and how it falls with load,
side by side with the CPU's (docs/gpu.md).

    python3 scripts/gpu_report.py bench-results/2026-11-26-gpu-nvidia-h200/gpu-check-nvidia-h200-2026-11-26.json \
        --out docs/results/2026-11-26-gpu-nvidia-h200.md

The bound is the bench's (specpipe.bench.measure.speedup_bound: Leviathan et al.'s expected tokens per round
with a measured acceptance rate per draft position), with each draft length's verification read off
the measured T(k) curve instead of one mean. Under load it is the same bound per session, where a
forward carries every session's draft: E(k) T_B(1) / (T_B(k + 1) + k d_B), with T_B the batched
forward of B sessions and d_B the drafter's batched step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specpipe.bench.measure import best_draft_len

DEFAULT_48 = "2026-11-24-default-48-tokens"
NGRAM, MODEL = "adaptive k<=8 width=1 branch calibrated M<=1", "k=8 width=1 branch calibrated M=1"
# What the CPU runs measured (bench-results/), per suite: the default n-gram drafter's acceptance by
# draft position, and the model drafter's at k = 8 (qwen-coder).
ACCEPTANCE = {
    "n-gram": {"HumanEval": (f"{DEFAULT_48}/default-humaneval.json", f"specpipe ngram {NGRAM}"),
               "GSM8K": (f"{DEFAULT_48}/default-gsm8k.json", f"specpipe ngram {NGRAM}"),
               "MT-Bench": (f"{DEFAULT_48}/default-mtbench.json", f"specpipe ngram {NGRAM}")},
    "model": {"HumanEval": ("2026-11-23-alternatives/report-humaneval.json", f"specpipe model {MODEL}"),
              "GSM8K": ("2026-11-23-adaptive/sweep-gsm8k.json", f"specpipe model {MODEL}"),
              "MT-Bench": ("2026-11-23-adaptive/sweep-mtbench.json", f"specpipe model {MODEL}")},
}
CPU_CURVE = ("2026-11-25-load-curve-256-tokens/forward-curve-qwen-coder-epyc512.json", "verifier packed",
             "drafter packed")  # one core, seconds
LOADS = (1, 2, 4, 8, 16, 32)


def at_least(curve: dict[int, float], n: int) -> float | None:
    """The curve at the smallest measured size >= n (a forward of n tokens runs padded to a bucket)."""
    sizes = [k for k in sorted(curve) if k >= n]
    return curve[sizes[0]] if sizes else None


def rates_of(results: Path, drafter: str) -> dict[str, list[float]]:
    out = {}
    for suite, (name, method) in ACCEPTANCE[drafter].items():
        methods = {m["method"]: m for m in json.loads((results / name).read_text())["methods"]}
        out[suite] = methods[method]["acceptance_by_position"]
    return out


def lone_bound(rates, verify: dict[int, float], draft_ms: float, overlapped: bool) -> tuple[float, int] | None:
    """One session: the bench's bound with T(k + 1) per draft length (draft lengths with a measured T)."""
    usable = [r for k, r in enumerate(rates, 1) if at_least(verify, k + 1) is not None]
    if not usable:  # no draft length's verification was measured
        return None
    return best_draft_len(usable, verify[1], draft_ms, lambda k: at_least(verify, k + 1), overlapped)


def loaded_bound(
    rates, batched: dict[tuple[int, int], float], sessions: int, draft_ms: float
) -> tuple[float, int] | None:
    """B sessions in one forward: the bound per session, sequential, from the batched forward's times."""
    curve = {n: ms for (b, n), ms in batched.items() if b == sessions}
    if 1 not in curve:
        return None
    return lone_bound(rates, curve, draft_ms, overlapped=False)


def parse_batched(table: dict[str, float]) -> dict[tuple[int, int], float]:
    return {tuple(int(x) for x in key.split("x")): ms for key, ms in table.items()}


def cpu_batched(curve: dict[int, float]) -> dict[tuple[int, int], float]:
    """The CPU's batched forward estimated from its one-session curve: the packed GEMM's cost follows the
    rows it multiplies, so B sessions of n tokens cost about T(B n) (measured up to 32 rows)."""
    return {(b, n): curve[b * n] for b in LOADS for n in (1, 2, 4, 8) if b * n in curve}


def fmt_bound(bound) -> str:
    return "-" if bound is None else f"{bound[0]:.2f}x (k={bound[1]})"


def report(gpu: dict, results: Path, command: str, note: str = "", folder: str = "bench-results/") -> str:
    env, verifier, drafter = gpu["environment"], gpu["cost"]["verifier"], gpu["cost"]["drafter"]
    lines = [f"# {env['gpu']}: a scripts/gpu_check.py run", "", f"Made by `{command}`.", *([note] if note else []), "",
             f"{env['gpu']} (compute capability {env['capability']}, {env['memory_gib']} GiB), torch {env['torch']}, "
             f"CUDA {env['cuda']}, transformers {env['transformers']}, Python {env['python']}. Record: "
             f"`{folder}`. The cost figures are of the qwen-coder architectures with generated "
             "weights in bfloat16 (docs/gpu.md).", "", "## Golden cases on the GPU", "",
             "| dtype, forward setup | outputs equal to generate() | equal to the verifier alone | sampling: same "
             "tokens under both schedules | capture, s |", "| --- | ---: | ---: | --- | ---: |"]
    for name, setup in gpu["golden"].items():
        if setup is None:
            lines.append(f"| {name} | failed (see the record's errors) | | | |")
            continue
        cases = setup["cases"].values()
        total = sum(c["prompts"] for c in cases)
        lines.append(f"| {name} | {sum(c['equal_generate'] for c in cases)} / {total} | "
                     f"{sum(c['equal_alone'] for c in cases)} / {total} | "
                     f"{'yes' if setup['sampling_same_across_schedules'] else 'NO'} | {setup['warm_up_s']} |")
    lines += ["", f"Each row: {len(next(iter(gpu['golden'].values()))['cases'])} speculation cases (the verifier "
              "alone; model, n-gram and hybrid drafters, each sequential and branch, adaptive on and off; a "
              "tree of width 2) on 8 prompts, 32 new tokens, tiny preset.", "",
              "## One session: T(k), milliseconds", "",
              "| k | verifier eager | verifier graphs | graphs T(k)/T(1) | drafter eager | drafter graphs |",
              "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    v_graphs = {int(k): ms for k, ms in verifier["graphs_ms"].items()}
    d_graphs = {int(k): ms for k, ms in drafter["graphs_ms"].items()}
    for k in sorted(v_graphs):
        lines.append(
            f"| {k} | {verifier['eager_ms'][str(k)]:.2f} | {v_graphs[k]:.2f} | {v_graphs[k] / v_graphs[1]:.2f} "
            f"| {drafter['eager_ms'][str(k)]:.2f} | {d_graphs[k]:.2f} |"
        )
    v_eager_b, v_graph_b = parse_batched(verifier["batched_ms"]), parse_batched(verifier["batched_graphs_ms"])
    d_graph_b = parse_batched(drafter["batched_graphs_ms"])
    lines += ["", f"CUDA graphs captured in {verifier['graphs_capture_s']} s (verifier, 7 sizes) and "
              f"{verifier['batched_graphs_capture_s']} s (its batched forward, "
              f"{len(v_graph_b) + 4} shapes).", "",
              "## Batched forward: B sessions of n tokens each, milliseconds", "",
              "| B | " + " | ".join(f"n={n} eager | n={n} graphs" for n in (1, 2, 4, 8)) + " | drafter step, graphs |",
              "| ---: |" + " ---: | ---: |" * 4 + " ---: |"]
    for b in LOADS:
        cells = [
            f"{v_eager_b.get((b, n), float('nan')):.1f} | {v_graph_b.get((b, n), float('nan')):.1f}"
            for n in (1, 2, 4, 8)
        ]
        lines.append(f"| {b} | " + " | ".join(cells) + f" | {d_graph_b.get((b, 1), float('nan')):.1f} |")
    plain, served = verifier["plain_decode_tokens_per_s"], verifier["served_tokens_per_s"]
    lines += ["", "## Decoding without drafts, tokens/s", "",
              "One session, 64 new tokens after 300 prompt tokens: " + ", ".join(f"{k} {v}" for k, v in plain.items())
              + ".", "", "Sessions at once (aggregate tokens/s, 64 new tokens each, prompts of 145 to 300 tokens): ",
              "", "| setup | " + " | ".join(f"{n} at once" for n in next(iter(served.values()))) + " |",
              "| --- |" + " ---: |" * len(next(iter(served.values())))]
    lines += [f"| {setup} | " + " | ".join(str(v) for v in row.values()) + " |" for setup, row in served.items()]

    curve_file, v_label, d_label = CPU_CURVE
    cpu = json.loads((results / curve_file).read_text())["curves"]
    cpu_v = {int(k): s * 1e3 for k, s in cpu[v_label].items()}
    cpu_d = {int(k): s * 1e3 for k, s in cpu[d_label].items()}
    lines += ["", "## What the measured acceptance would give", "",
              f"The bound from the CPU runs' acceptance by position (bench-results/: the default n-gram drafter, "
              f"and the model drafter at k = 8), with this GPU's graphs T(k) against the CPU's packed one-core "
              f"T(k) ({curve_file}). n-gram drafts cost nothing; a model draft token costs the drafter's T(1) "
              "(GPU graphs {:.2f} ms, CPU {:.1f} ms), overlapped with verification as the branch schedule does "
              "at best.".format(d_graphs[1], cpu_d[1]), "",
              "| drafter | suite | GPU bound (best k) | CPU bound (best k) |", "| --- | --- | ---: | ---: |"]
    for drafter_kind in ACCEPTANCE:
        draft = {"n-gram": (0.0, 0.0), "model": (d_graphs[1], cpu_d[1])}[drafter_kind]
        overlapped = drafter_kind == "model"
        for suite, rates in rates_of(results, drafter_kind).items():
            lines.append(
                f"| {drafter_kind} | {suite} | {fmt_bound(lone_bound(rates, v_graphs, draft[0], overlapped))} | "
                f"{fmt_bound(lone_bound(rates, cpu_v, draft[1], overlapped))} |"
            )
    lines += [
        "",
        "Under load (per session, B sessions per forward, sequential; GPU: the batched forward with "
        "graphs; CPU: T(B n) of its one-session curve, measured to 32 rows):",
        "",
        "| drafter, suite | " + " | ".join(f"B={b} GPU / CPU" for b in LOADS) + " |",
        "| --- |" + " ---: |" * len(LOADS),
    ]
    cpu_b = cpu_batched(cpu_v)
    for drafter_kind in ACCEPTANCE:
        for suite, rates in rates_of(results, drafter_kind).items():
            cells = []
            for b in LOADS:
                gpu_draft = d_graph_b.get((b, 1), 0.0) if drafter_kind == "model" else 0.0
                cpu_draft = cpu_d.get(b, float("inf")) if drafter_kind == "model" else 0.0
                g, c = loaded_bound(rates, v_graph_b, b, gpu_draft), loaded_bound(rates, cpu_b, b, cpu_draft)
                cells.append(f"{'-' if g is None else f'{g[0]:.2f}x'} / {'-' if c is None else f'{c[0]:.2f}x'}")
            lines.append(f"| {drafter_kind}, {suite} | " + " | ".join(cells) + " |")
    if gpu["errors"]:
        lines += ["", "## Errors", ""] + [
            f"- {e['section']}: `{e['error'].strip().splitlines()[-1]}`" for e in gpu["errors"]
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", help="a scripts/gpu_check.py JSON")
    parser.add_argument("--results", default="bench-results", help="the CPU runs' JSON (default: %(default)s)")
    parser.add_argument("--out", help="markdown page to write (default: print)")
    parser.add_argument("--note", default="", help="a paragraph under the title: what the run's code was")
    args = parser.parse_args()
    command = f"python3 scripts/gpu_report.py {args.record}" + (f" --out {args.out}" if args.out else "")
    page = report(json.loads(Path(args.record).read_text()), Path(args.results), command, args.note,
                  f"{Path(args.record).parent}/")
    if args.out:
        Path(args.out).write_text(page)
    else:
        print(page)


if __name__ == "__main__":
    main()
