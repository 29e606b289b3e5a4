"""The load report (docs/load.md): per user level, speculation off (`--drafter none`) against on,
as a Markdown table and PNG plots of aggregate tokens/s and p99 latency against users, written by
`specpipe loadtest --drafter none,model --report docs/load.md`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specpipe.bench.loadstats import LevelSummary, Slo, markdown_table

SECTION = "load"  # docs/load.md's generated section, between specpipe.bench.report.markers(SECTION)


def run_label(label: str) -> str:
    """A run's name: "drafter D", or "SERVER D" where loadtest compared servers."""
    return label if " " in label else f"drafter {label}"


def _cell(levels: Sequence[LevelSummary], users: int, attr: str, fmt: str) -> str:
    value = next((getattr(s, attr) for s in levels if s.users == users), None)
    return "-" if value is None else format(value, fmt)


def ratio_pairs(labels: Sequence[str]) -> list[tuple[str, str]]:
    """(numerator, denominator) runs whose tokens/s the table compares: each later run over the
    first, then, where runs are labelled "SERVER DRAFTER", each over the first run of its server
    (what its drafter gives) and over the first run with its drafter (what its server gives)."""
    parts = {label: label.rpartition(" ")[::2] for label in labels}  # label -> (server, drafter)
    pairs = [(label, labels[0]) for label in labels[1:]]
    for side in (0, 1):
        for label in labels:
            first = next(other for other in labels if parts[other][side] == parts[label][side])
            if first != label and (label, first) not in pairs:
                pairs.append((label, first))
    return pairs


def tokens_per_s_ratios(runs: Mapping[str, Sequence[LevelSummary]]) -> dict[str, dict[int, float]]:
    """"A / B" -> users -> run A's tokens/s over run B's at that level, for ratio_pairs' runs (a level
    that one of them lacks, or where B made no token, is left out)."""
    tps = {label: {s.users: s.tokens_per_s for s in levels} for label, levels in runs.items()}
    return {f"{a} / {b}": {n: tps[a][n] / tps[b][n] for n in tps[a] if tps[b].get(n)}
            for a, b in ratio_pairs(list(runs))}


def comparison_table(runs: Mapping[str, Sequence[LevelSummary]]) -> str:
    """users | tokens/s, TTFT p99 and ITL p99 of every run side by side, and tokens/s ratios."""
    labels = list(runs)
    users = sorted({s.users for levels in runs.values() for s in levels})
    ratios = tokens_per_s_ratios(runs)
    head = ["users", *(f"tokens/s {label}" for label in labels), *ratios]
    head += [f"TTFT p99 ms {label}" for label in labels] + [f"ITL p99 ms {label}" for label in labels]
    head.append("errors")
    rows = ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for n in users:
        tps = {label: next((s.tokens_per_s for s in runs[label] if s.users == n), None) for label in labels}
        cells = [str(n), *("-" if tps[label] is None else f"{tps[label]:.1f}" for label in labels)]
        cells += [f"{by_users[n]:.2f}x" if n in by_users else "-" for by_users in ratios.values()]
        cells += [_cell(runs[label], n, "ttft_p99_ms", ".0f") for label in labels]
        cells += [_cell(runs[label], n, "itl_p99_ms", ".1f") for label in labels]
        cells.append(str(sum(sum(s.errors.values()) for levels in runs.values() for s in levels if s.users == n)))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(runs: Mapping[str, Sequence[LevelSummary]], directory: Path, stem: str = "load") -> list[Path]:
    """STEM-tokens-per-s.png and STEM-p99-latency.png (stem: the report's, so reports do not share
    plots): one line per run against users."""
    from specpipe.bench.plots import pyplot

    plt = pyplot()

    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{stem}-tokens-per-s.png", directory / f"{stem}-p99-latency.png"]
    users = sorted({s.users for levels in runs.values() for s in levels})

    def users_axis(ax: Any) -> None:
        ax.set_xscale("log", base=2)
        ax.set_xticks(users, [str(n) for n in users])
        ax.minorticks_off()
        ax.set_xlabel("users")
        ax.legend(fontsize=8)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, levels in runs.items():
        ax.plot([s.users for s in levels], [s.tokens_per_s for s in levels], marker="o", label=run_label(label))
    ax.set_ylabel("aggregate tokens/s")
    users_axis(ax)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, attr, title in ((axes[0], "ttft_p99_ms", "TTFT p99 (ms)"), (axes[1], "itl_p99_ms", "ITL p99 (ms)")):
        for label, levels in runs.items():
            points = [(s.users, getattr(s, attr)) for s in levels if getattr(s, attr) is not None]
            ax.plot([u for u, _ in points], [v for _, v in points], marker="o", label=run_label(label))
        ax.set_title(title)
        users_axis(ax)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def report_markdown(runs: Mapping[str, Sequence[LevelSummary]], slo: Slo, meta: Mapping[str, object],
                    images: Sequence[Path], relative_to: Path, command: str) -> str:
    described = ", ".join(f"{key} `{value}`" for key, value in meta.items())
    lines = [f"Generated by `{command}`: {described}.", "",
             comparison_table(runs), ""]
    lines += [f"![{image.stem}]({Path(os.path.relpath(image, relative_to)).as_posix()})" for image in images]
    for label, levels in runs.items():
        lines += ["", f"**{run_label(label)}**", "", markdown_table(levels, slo)]
    return "\n".join(lines)


def write_report(path: Path, body: str) -> None:
    """Replace the generated section of the Markdown file at path (specpipe.bench.report.replace_section)."""
    from specpipe.bench.report import replace_section

    path.write_text(replace_section(path.read_text(), body, SECTION))
