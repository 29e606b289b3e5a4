"""Bench results as Markdown tables and PNG plots, from a run or from its JSON files, and the
README's results section regenerated from them (`specpipe bench --report`), so the README never
drifts from a real run."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Sequence

from specpipe.bench import recurring_report
from specpipe.bench.llamacpp import LLAMA_CPP
from specpipe.bench.measure import BASELINE, ORCHESTRATION, MethodSpec, MethodSummary, PromptRun, decode_bound
from specpipe.bench.prompts import RECURRING
from specpipe.core.types import SpeculationOptions


def markers(section: str | None = None) -> tuple[str, str]:
    """The README's begin and end markers of a generated results section (None: the main one)."""
    name = "bench-report" if section is None else f"bench-report:{section}"
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def to_json(summaries: list[MethodSummary], meta: dict) -> dict:
    return {"meta": meta, "methods": [asdict(s) for s in summaries]}


def from_json(data: dict) -> list[MethodSummary]:
    summaries = []
    for m in data["methods"]:
        runs = [
            PromptRun(
                **{
                    **r,
                    "token_ids": tuple(r["token_ids"]),
                    "round_drafted": tuple(r.get("round_drafted", ())),
                    "round_accepted": tuple(r.get("round_accepted", ())),
                }
            )
            for r in m["runs"]
        ]
        fields = {k: v for k, v in m.items() if k in MethodSummary.__dataclass_fields__}
        fields["acceptance_by_position"] = tuple(fields.get("acceptance_by_position", ()))
        fields["orchestration"] = dict(fields.get("orchestration", {}))
        fields["cpu_us_per_token"] = dict(fields.get("cpu_us_per_token", {}))
        fields["spec"] = MethodSpec(**fields["spec"]) if fields.get("spec") else None
        fields.setdefault("default", is_default(fields["spec"]))  # a file from before the field: the n-gram default
        summaries.append(MethodSummary(**{**fields, "runs": runs}))
    # the bound as measure.decode_bound computes it now, also in files written before its verify cost
    runs_of = {s.method: s.runs for s in summaries if s.runs}
    for i, s in enumerate(summaries):
        if s.bound and s.runs and s.reference in runs_of:
            bound, share = decode_bound(s.runs, runs_of[s.reference])
            summaries[i] = replace(s, bound=bound, bound_share=share)
    return summaries


def percent(value: float, shown: bool = True) -> str:
    return f"{value:.0%}" if shown else "-"


def markdown_table(summaries: list[MethodSummary]) -> str:
    compiled = next((s.reference for s in summaries if s.speedup_reference is not None), None)
    extra = f" speed-up over {compiled} |" if compiled else ""
    lines = [
        "| method | tokens/s | decode tokens/s | speed-up |" + extra + " tokens per verify (DE) | acceptance | "
        "hit rate | draft hidden | verifier idle | identical to |",
        "| --- | ---: | ---: | ---: |" + (" ---: |" if compiled else "") + " ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for s in summaries:
        branch = any(r.predicted for r in s.runs)
        drafts = any(r.drafted for r in s.runs)
        over = (f" {s.speedup_reference:.2f}x |" if s.speedup_reference is not None else " - |") if compiled else ""
        de = f"{s.tokens_per_round:.2f}" if s.tokens_per_round else "-"
        decode = f"{s.decode_tokens_per_s:.2f}" if s.decode_tokens_per_s else "-"
        lines.append(f"| {s.method} | {s.tokens_per_s:.2f} | {decode} | {s.speedup:.2f}x |{over} {de} | "
                     f"{percent(s.acceptance, drafts)} | {percent(s.hit_rate, branch)} | "
                     f"{percent(s.hidden_share, branch)} | "
                     f"{percent(s.idle_share, drafts or any(r.idle_ms for r in s.runs))} | "
                     f"{s.reference}: {s.identical}/{s.prompts} |")
    return "\n".join(lines)


def detail_table(summaries: list[MethodSummary]) -> str:
    """Per speculative method: acceptance by draft position, the wall time split, and the bound (on
    decode time)."""
    lines = ["| method | acceptance by position 1, 2, 3, ... | prefill | verify | draft (not hidden) | "
             "orchestration | bound | share of bound |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in summaries:
        if not s.bound:
            continue
        by_position = ", ".join(f"{a:.2f}" for a in s.acceptance_by_position[:8])
        orchestration = percent(s.orchestration_share) if s.orchestration else f"{s.other_share:.0%} (with prefill)"
        lines.append(f"| {s.method} | {by_position} | {percent(s.prefill_share, bool(s.orchestration))} | "
                     f"{s.verify_share:.0%} | {s.draft_share:.0%} | {orchestration} | {s.bound:.2f}x | "
                     f"{s.bound_share:.0%} |")
    return "\n".join(lines)


def time_table(summaries: list[MethodSummary]) -> str:
    """Where each method's wall time went (shares): prefill, and for specpipe's methods the verifier's
    forwards, drafting not hidden, and orchestration by its parts (measure.ORCHESTRATION)."""
    lines = ["| method | prefill | verifier forwards | draft (not hidden) | orchestration | "
             + " | ".join(f"of it: {part.replace('_', ' ')}" for part in ORCHESTRATION) + " |",
             "| --- |" + " ---: |" * (4 + len(ORCHESTRATION))]
    for s in summaries:
        if not s.prefill_share:
            continue
        if not s.orchestration:  # a transformers baseline: prefill, then decoding
            lines.append(f"| {s.method} | {s.prefill_share:.1%} | decoding: {1 - s.prefill_share:.1%} |"
                         + " - |" * (2 + len(ORCHESTRATION)))
            continue
        lines.append(f"| {s.method} | {s.prefill_share:.1%} | {s.verify_share:.1%} | {s.draft_share:.1%} | "
                     f"{s.orchestration_share:.1%} | " + " | ".join(f"{s.orchestration[p]:.1%}" for p in ORCHESTRATION)
                     + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def cpu_table(summaries: list[MethodSummary]) -> str:
    """Where each specpipe method's CPU time went, in microseconds a generated token: each role's hops
    in this process (specpipe.runtime.cpu), and the process's whole CPU time (the verifier's forwards
    run here when embedded)."""
    measured = [s for s in summaries if s.cpu_us_per_token]
    names = sorted({name for s in measured for name in s.cpu_us_per_token if name != "process"})
    if not measured:
        return ""
    lines = ["| method | " + " | ".join(names) + " | process | CPU ms a round |",
             "| --- |" + " ---: |" * (len(names) + 2)]
    for s in measured:
        cells = [f"{s.cpu_us_per_token.get(name, 0.0):.0f}" for name in names]
        lines.append(f"| {s.method} | " + " | ".join(cells) + f" | {s.cpu_us_per_token.get('process', 0.0):.0f} | "
                     f"{s.cpu_ms_per_round:.2f} |")
    return "CPU time, microseconds a generated token (role/hop; docs/pipeline.md)\n" + "\n".join(lines)


def category_table(summaries: list[MethodSummary], categories: dict[str, str]) -> str:
    """Per prompt category: the baseline's tokens/s against the headline method's (report.headline)."""
    from specpipe.bench.measure import throughput

    best, baseline = headline(summaries)[0], summaries[0]
    if best is None or not categories:
        return ""
    lines = [f"| category | prompts | {baseline.method} tokens/s | {best.method} tokens/s | speed-up | acceptance |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for category in dict.fromkeys(categories.values()):
        ours = [r for r in best.runs if categories.get(r.prompt_id) == category]
        theirs = [r for r in baseline.runs if categories.get(r.prompt_id) == category]
        drafted = sum(r.drafted for r in ours)
        acceptance = sum(r.accepted for r in ours) / drafted if drafted else 0.0
        lines.append(f"| {category} | {len(ours)} | {throughput(theirs):.2f} | {throughput(ours):.2f} | "
                     f"{throughput(ours) / throughput(theirs):.2f}x | {acceptance:.0%} |")
    return "\n".join(lines)


def spec_of(summary: MethodSummary) -> MethodSpec:
    """The method's spec, of a summary of a specpipe method (the baselines have none)."""
    assert summary.spec is not None, summary.method
    return summary.spec


def sweep_table(summaries: list[MethodSummary]) -> str:
    """Each adaptive method against the best of the same method at a fixed draft length, in tokens/s;
    empty when the run has no such pair."""
    lines = ["| method | best fixed k | its tokens/s | adaptive tokens/s | adaptive / best fixed |",
             "| --- | ---: | ---: | ---: | ---: |"]
    specpipe = [s for s in summaries if s.spec is not None and s.spec.drafter != "none"]
    for adaptive in (s for s in specpipe if spec_of(s).adaptive == "on"):
        setting = spec_of(adaptive).setting()
        fixed = [s for s in specpipe if spec_of(s).adaptive == "off" and spec_of(s).setting() == setting]
        if fixed:
            best = max(fixed, key=lambda s: s.tokens_per_s)
            lines.append(f"| {adaptive.method} | {spec_of(best).draft_len} | {best.tokens_per_s:.2f} | "
                         f"{adaptive.tokens_per_s:.2f} | {adaptive.tokens_per_s / best.tokens_per_s:.2f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def best_specpipe(summaries: list[MethodSummary]) -> MethodSummary | None:
    ours = [s for s in summaries if s.method.startswith("specpipe ") and s.bound]
    return max(ours, key=lambda s: s.tokens_per_s, default=None)


def is_default(spec: MethodSpec | None, default: SpeculationOptions = SpeculationOptions()) -> bool:
    """Whether a method ran the product's default configuration: default speculation options (for its
    models: specpipe.config.services.in_process_default), the compiled forward (`--compile auto` on a
    host with a C compiler), no added hop delay."""
    return spec is not None and spec.speculation() == default and spec.compiled and not spec.hop_delay_ms


def headline(summaries: list[MethodSummary]) -> tuple[MethodSummary | None, str]:
    """The summary row's method and its label: the default configuration (where a run has it with
    learning on and off, the one with the default learning), else the fastest (labelled)."""
    from specpipe.bench.methods import default_learning

    defaults = [s for s in summaries if s.default]
    default = next((s for s in defaults if spec_of(s).learn_global == default_learning()), next(iter(defaults), None))
    if default is not None:
        return default, "default configuration"
    best = best_specpipe(summaries)
    count = sum(s.method.startswith("specpipe ") and bool(s.bound) for s in summaries)
    return best, f"fastest of {count} configurations: {best.method}" if best else ""


def best_match(summaries: list[MethodSummary], prefix: str) -> MethodSummary | None:
    """The fastest method whose name starts with prefix (prompt lookup runs at several settings)."""
    return max((s for s in summaries if s.method.startswith(prefix)), key=lambda s: s.tokens_per_s, default=None)


def spread(values: Sequence[float]) -> str:
    """median (min-max) of per-prompt speed-ups."""
    if not values:
        return "-"
    ordered = sorted(values)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return f"{median:.2f}x ({ordered[0]:.2f}-{ordered[-1]:.2f})"


SUMMARY_COLUMNS = {  # column -> its heading: the results' summary table
    "label": "specpipe", "tokens_per_s": "tokens/s", "decode": "decode tokens/s",
    "over_eager": "over generate(), 1 core, eager",
    "over_fair": "over generate(), same cores and weights", "per_prompt": "per prompt: median (min-max)",
    "over_assisted": "over assisted", "over_lookup": "over prompt lookup (best setting)",
    "over_best": "over the best transformers method", "bound": "bound (computed)", "share": "share of bound",
    "over_llama": "over llama.cpp", "over_llama_lookup": "over llama.cpp's prompt lookup (best setting)",
    "prefill": "prefill", "orchestration": "orchestration",
}
LLAMA_COLUMNS = ("over_llama", "over_llama_lookup")  # shown where a run has the llama-cpp baselines
HEADLINE_COLUMNS = (
    "tokens_per_s",
    "decode",
    "over_best",
    "over_llama",
    "over_fair",
    "share",
    "prefill",
    "orchestration",
)  # the README's


def summary_cells(summaries: list[MethodSummary]) -> dict[str, str] | None:
    """A suite's summary row: specpipe's default configuration (or, in runs without it, the labelled
    fastest) against every baseline of its run, with the per-prompt spread over generate() on equal footing."""
    from specpipe.bench.measure import per_prompt_speedups

    ours, label = headline(summaries)
    if ours is None:
        return None

    def over(other: MethodSummary | None) -> str:
        return f"{ours.tokens_per_s / other.tokens_per_s:.2f}x" if other and other.tokens_per_s else "-"

    fair = best_match(summaries, BASELINE + ", ")
    transformers = [s for s in summaries[1:] if s.spec is None and not s.method.startswith(LLAMA_CPP)]
    best = max(transformers, key=lambda s: s.tokens_per_s, default=None)
    return {"label": label, "tokens_per_s": f"{ours.tokens_per_s:.2f}", "over_eager": over(summaries[0]),
            "decode": f"{ours.decode_tokens_per_s:.2f}" if ours.decode_tokens_per_s else "-",
            "over_best": f"{over(best)} ({best.method.split(',')[0].removeprefix('transformers ')})" if best else "-",
            "prefill": percent(ours.prefill_share, bool(ours.orchestration)),
            "orchestration": percent(ours.orchestration_share, bool(ours.orchestration)),
            "over_fair": over(fair), "per_prompt": spread(per_prompt_speedups(ours.runs, fair.runs)) if fair else "-",
            "over_assisted": over(best_match(summaries, "transformers assisted")),
            "over_lookup": over(best_match(summaries, "transformers prompt lookup")),
            "over_llama": over(best_match(summaries, f"{LLAMA_CPP} plain")),
            "over_llama_lookup": over(best_match(summaries, f"{LLAMA_CPP} prompt lookup")),
            "bound": f"{ours.bound:.2f}x", "share": f"{ours.bound_share:.0%}"}


def summary_table(results: dict[str, list[MethodSummary]], metas: dict[str, dict[str, Any]] | None = None,
                  columns: Sequence[str] = tuple(SUMMARY_COLUMNS), first: str = "suite (prompts)") -> str:
    """One row a suite (summary_cells), in columns; first names each row: its suite, or with
    first="suite (prompts), preset" its preset too. The llama.cpp columns show where a run has them."""
    rows = []
    for suite, summaries in results.items():
        cells = summary_cells(summaries)
        if cells is None:
            continue
        meta = (metas or {}).get(suite, {})
        name = f"{meta.get('suite', suite)} ({meta.get('limit', len(summaries[0].runs))})"
        if "preset" in first:
            name += f", {meta.get('preset')}"
        rows.append((name, cells))
    columns = [c for c in columns if c not in LLAMA_COLUMNS or any(cells[c] != "-" for _, cells in rows)]
    lines = [f"| {first} | " + " | ".join(SUMMARY_COLUMNS[c] for c in columns) + " |",
             "| --- |" + "".join(" --- |" if c == "label" else " ---: |" for c in columns)]
    lines += [f"| {name} | " + " | ".join(cells[c] for c in columns) + " |" for name, cells in rows]
    return "\n".join(lines)


def plot(results: dict[str, list[MethodSummary]], directory: Path) -> list[Path]:
    """speed-up by suite and method; tokens per round of the headline method; time split."""
    from specpipe.bench.plots import pyplot

    plt = pyplot()

    directory.mkdir(parents=True, exist_ok=True)
    suites = list(results)
    methods = list(dict.fromkeys(s.method for summaries in results.values() for s in summaries if s.method != BASELINE))
    paths = []

    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(1, len(methods))
    colors = plt.get_cmap("tab20")
    for i, method in enumerate(methods):
        values = [next((s.speedup for s in results[suite] if s.method == method), 0.0) for suite in suites]
        ax.bar([x + i * width for x in range(len(suites))], values, width, label=method, color=colors(i % colors.N))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(suites))], suites)
    ax.set_ylabel("speed-up over verifier-only generate()")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    paths.append(directory / "speedup.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, axes = plt.subplots(1, len(suites), figsize=(3.5 * len(suites), 3), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        best = headline(results[suite])[0]
        if best is None:
            continue
        emitted = [a + 1 for r in best.runs for a in r.round_accepted]
        ax.hist(emitted, bins=range(1, max(emitted, default=1) + 2), align="left", rwidth=0.8)
        ax.set_title(f"{suite}: {best.method.removeprefix('specpipe ')}", fontsize=7)
        ax.set_xlabel("tokens per round")
    fig.tight_layout()
    paths.append(directory / "tokens-per-round.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    rows = [(suite, s) for suite in suites for s in results[suite] if s.bound]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.2))
    labels = [f"{suite}: {s.method.removeprefix('specpipe ')}" for suite, s in rows]
    left = [0.0] * len(rows)
    for part, color in (("verify_share", "tab:blue"), ("draft_share", "tab:orange"), ("other_share", "tab:gray")):
        values = [getattr(s, part) for _, s in rows]
        ax.barh(labels, values, left=left, color=color, label=part.removesuffix("_share"))
        left = [a + b for a, b in zip(left, values)]
    ax.set_xlabel("share of wall time")
    ax.tick_params(axis="y", labelsize=6)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    paths.append(directory / "time-split.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)
    return paths


def load(paths: Sequence[str]) -> tuple[dict[str, list[MethodSummary]], dict[str, dict]]:
    results, metas = {}, {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        suite = str(data["meta"].get("suite", Path(path).stem))
        results[suite], metas[suite] = from_json(data), data["meta"]
    return results, metas


def report(paths: Sequence[str], plot_dir: Path, relative_to: Path) -> str:
    """The Markdown of the results section for the JSON files at paths, with plots in plot_dir."""
    results, metas = load(paths)
    images = plot(results, plot_dir)
    meta = next(iter(metas.values()))
    presets: dict[str, list[str]] = {}
    hosts: dict[str, list[str]] = {}
    for suite, suite_meta in metas.items():
        presets.setdefault(str(suite_meta.get("preset")), []).append(suite)
        hosts.setdefault(f"{suite_meta.get('machine')} ({suite_meta.get('cpu_count')} cores; "
                         f"{', '.join(suite_meta.get('vector_extensions', []))})", []).append(suite)
    preset = f"preset `{meta.get('preset')}`" if len(presets) == 1 else \
        "presets " + ", ".join(f"`{name}` ({', '.join(suites)})" for name, suites in presets.items())
    host = next(iter(hosts)) if len(hosts) == 1 else \
        "; ".join(f"{', '.join(suites)} on {name}" for name, suites in hosts.items())
    lines = [f"Generated by `specpipe bench --report` from {', '.join(f'`{p}`' for p in paths)}: {preset}, "
             f"up to {meta.get('max_new_tokens')} new "
             f"tokens, `--compile {meta.get('compile', 'off')}`, transport {meta.get('transport')}, "
             f"{host}.",
             "", summary_table(results, metas), ""]
    lines += [f"![{image.stem}]({Path(os.path.relpath(image, relative_to)).as_posix()})" for image in images]
    for suite, summaries in results.items():
        turns = metas[suite].get("turns", 1)
        lines += [
            "",
            f"**{suite}** ({metas[suite].get('limit')} prompts{f', {turns} turns each' if turns > 1 else ''})",
            "",
            markdown_table(summaries),
            "",
            detail_table(summaries),
            "",
            time_table(summaries),
            "",
            cpu_table(summaries),
        ]
        swept = sweep_table(summaries)
        if swept:
            lines += ["", swept]
        categories = metas[suite].get("categories", {})
        if metas[suite].get("suite") == RECURRING:  # its categories are the requests' kinds
            lines += ["", recurring_report.markdown(summaries, categories)]
        elif by_category := category_table(summaries, categories):
            lines += ["", by_category]
    return "\n".join(lines)


def replace_section(readme: str, body: str, section: str | None = None) -> str:
    """readme with the text between the section's markers replaced by body."""
    begin, end = markers(section)
    if begin not in readme or end not in readme:
        raise ValueError(f"the README has no {begin} ... {end} section to replace")
    head, rest = readme.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"
