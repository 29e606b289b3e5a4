"""The verify-cost curve T(k) (one forward of k new tokens after a fixed context) and the speed-up
bounds it implies for chains of gamma drafts (Leviathan et al., section 3.4), sequential and
overlapped (the branch schedule hides draft time behind verification at best)."""

from __future__ import annotations

import time
from typing import Sequence

from tqdm import tqdm

from specpipe.engine import runner as runners_module

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)


def forward_curves(runners: dict[str, runners_module.Runner], sizes: Sequence[int] = SIZES, context_len: int = 300,
                   repeats: int = 7, desc: str = "T(k)") -> dict[str, dict[int, float]]:
    """label -> {k: seconds of one forward of k new tokens after context_len cached ones}, best of
    repeats after one warm-up pass over all sizes. The runners take turns at every forward, so a
    change in machine load falls on all alike."""
    caches = {}
    for label, runner in runners.items():
        vocab = runner.model.config.vocab_size
        caches[label] = runner.new_cache()
        runner.forward(caches[label], [(7 * i + 10) % vocab for i in range(context_len)])

    def timed(label: str, k: int) -> float:
        start = time.perf_counter()
        runners[label].forward(caches[label], [11] * k)
        seconds = time.perf_counter() - start
        runners_module.crop(caches[label], context_len)
        return seconds

    for k in sizes:
        for label in runners:
            timed(label, k)
    curves: dict[str, dict[int, float]] = {label: {} for label in runners}
    for k in tqdm(sizes, desc=desc, leave=False):
        for _ in range(repeats):
            for label in runners:
                seconds = timed(label, k)
                curves[label][k] = min(curves[label].get(k, seconds), seconds)
    return curves


def expected_tokens(acceptance: float, gamma: int) -> float:
    """Tokens per round of a chain of gamma drafts, each accepted with probability `acceptance`:
    (1 - a^(gamma+1)) / (1 - a)."""
    if acceptance >= 1.0:
        return gamma + 1.0
    return (1 - acceptance ** (gamma + 1)) / (1 - acceptance)


def speedup_bounds(
    verify: dict[int, float], draft_token_s: float, acceptance: float, gamma: int
) -> tuple[float, float]:
    """(sequential, overlapped) speed-up over plain decoding for chains of gamma drafts: a round yields
    E tokens and costs gamma drafter steps plus T(gamma + 1) (sequential), or the larger of the two
    (overlapped); plain decoding costs T(1) a token."""
    e = expected_tokens(acceptance, gamma)
    draft, check = gamma * draft_token_s, verify[gamma + 1]
    return e * verify[1] / (draft + check), e * verify[1] / max(draft, check)


def bounds_table(verify: dict[int, float], draft_token_s: float, acceptances: Sequence[float]) -> list[dict]:
    """For each acceptance: the best gamma (whose gamma + 1 was measured) and its two bounds."""
    gammas = [k - 1 for k in verify if k > 1]
    rows = []
    for a in acceptances:
        bounds = {g: speedup_bounds(verify, draft_token_s, a, g) for g in gammas}
        sequential = max(gammas, key=lambda g: bounds[g][0])
        overlapped = max(gammas, key=lambda g: bounds[g][1])
        rows.append({"acceptance": a, "sequential_gamma": sequential, "sequential_bound": bounds[sequential][0],
                     "overlapped_gamma": overlapped, "overlapped_bound": bounds[overlapped][1]})
    return rows


def bounds_markdown(bounds: dict[str, list[dict]]) -> str:
    """bounds: forward mode (eager, compiled) -> bounds_table rows."""
    lines = ["| forward | acceptance | sequential bound (best gamma) | overlapped bound (best gamma) |",
             "| --- | ---: | ---: | ---: |"]
    for mode, rows in bounds.items():
        lines += [f"| {mode} | {r['acceptance']:.2f} | {r['sequential_bound']:.2f}x ({r['sequential_gamma']}) | "
                  f"{r['overlapped_bound']:.2f}x ({r['overlapped_gamma']}) |" for r in rows]
    return "\n".join(lines)


def curve_markdown(curves: dict[str, dict[int, float]]) -> str:
    """curves: label -> {k: seconds}; one column per label, T(k) in ms and T(k)/T(1)."""
    labels = list(curves)
    sizes = sorted({k for c in curves.values() for k in c})
    lines = ["| k | " + " | ".join(f"{label} ms | {label} T(k)/T(1)" for label in labels) + " |",
             "| ---: |" + " ---: | ---: |" * len(labels)]
    for k in sizes:
        cells = [f"{c[k] * 1e3:.1f} | {c[k] / c[1]:.2f}" if k in c else "- | -" for c in curves.values()]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(curves: dict[str, dict[int, float]], path: str) -> None:
    from specpipe.bench.plots import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in curves.items():
        ks = sorted(curve)
        ax.plot(ks, [curve[k] * 1e3 for k in ks], marker="o", label=label)
    ax.set_xlabel("new tokens per forward (k)")
    ax.set_ylabel("T(k), ms")
    ax.set_xscale("log", base=2)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
