"""The recurring workload's results (specpipe.bench.recurring): per method, tokens/s and tokens per
verifier forward over all requests and by request kind (repeat, template, unique), and the ratios
that say what learning buys: learning on over learning off, and over the verifier alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from specpipe.bench.measure import MethodSummary, summarize
from specpipe.bench.recurring import KINDS

ALL = "all"
GROUPS = (ALL, *KINDS)  # the requests each number is over


@dataclass(frozen=True)
class LearningPair:
    on: MethodSummary             # a method whose store learns finished outputs
    off: MethodSummary | None     # the same method with learning off
    alone: MethodSummary | None   # the verifier alone, run the same way (compiled or not)


def by_kind(summary: MethodSummary, kinds: Mapping[str, str]) -> dict[str, MethodSummary]:
    """group -> the method's summary over its requests of that kind (kinds: prompt id -> kind); ALL: every request."""
    groups = {ALL: summary}
    for kind in KINDS:
        runs = [r for r in summary.runs if kinds.get(r.prompt_id) == kind]
        if runs:
            groups[kind] = summarize(summary.method, runs, None)
    return groups


def learning_pairs(summaries: Sequence[MethodSummary]) -> list[LearningPair]:
    """Each specpipe method that learned, with its twin that did not and the verifier alone."""
    specs = {s.spec: s for s in summaries if s.spec is not None}
    pairs = []
    for spec, on in specs.items():
        if spec.learn_global:
            alone = next((s for k, s in specs.items() if k.drafter == "none" and k.compiled == spec.compiled), None)
            pairs.append(LearningPair(on, specs.get(replace(spec, learn_global=False)), alone))
    return pairs


def ratios(numerator: MethodSummary, denominator: MethodSummary | None, kinds: Mapping[str, str]) -> dict[str, float]:
    """group -> numerator's tokens/s over denominator's on the same requests."""
    if denominator is None:
        return {}
    ours, theirs = by_kind(numerator, kinds), by_kind(denominator, kinds)
    return {group: ours[group].tokens_per_s / theirs[group].tokens_per_s
            for group in GROUPS if group in ours and group in theirs and theirs[group].tokens_per_s}


def to_json(summaries: Sequence[MethodSummary], kinds: Mapping[str, str]) -> dict:
    """The bench JSON's `recurring` entry: requests per kind, each method's numbers by kind, the ratios."""
    return {
        "requests": {kind: sum(k == kind for k in kinds.values()) for kind in KINDS},
        "by_kind": {s.method: {group: {"tokens_per_s": g.tokens_per_s, "tokens_per_round": g.tokens_per_round}
                               for group, g in by_kind(s, kinds).items()} for s in summaries},
        "learning": [{"learning_on": p.on.method, "learning_off": p.off and p.off.method,
                      "verifier_alone": p.alone and p.alone.method,
                      "on_over_off": ratios(p.on, p.off, kinds), "on_over_alone": ratios(p.on, p.alone, kinds)}
                     for p in learning_pairs(summaries)],
    }


def kinds_table(summaries: Sequence[MethodSummary], kinds: Mapping[str, str]) -> str:
    """method | tokens/s (tokens per verifier forward) over all requests and by kind."""
    counts = {kind: sum(k == kind for k in kinds.values()) for kind in KINDS}
    head = [f"{ALL} ({len(kinds)})", *(f"{kind} ({counts[kind]})" for kind in KINDS)]
    lines = ["| method: tokens/s (tokens per verify) | " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(head)]
    for s in summaries:
        groups = by_kind(s, kinds)
        cells = [_cell(groups.get(group)) for group in GROUPS]
        lines.append(f"| {s.method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(summary: MethodSummary | None) -> str:
    if summary is None:
        return "-"
    de = f"{summary.tokens_per_round:.2f}" if summary.tokens_per_round else "-"
    return f"{summary.tokens_per_s:.2f} ({de})"


def ratio_table(summaries: Sequence[MethodSummary], kinds: Mapping[str, str]) -> str:
    """Per learning method: its tokens/s over learning off and over the verifier alone, by kind;
    empty when no method learned."""
    lines = ["| tokens/s ratio | " + " | ".join(GROUPS) + " |", "| --- |" + " ---: |" * len(GROUPS)]
    for pair in learning_pairs(summaries):
        for label, other in (("learning off", pair.off), ("the verifier alone", pair.alone)):
            if other is not None:
                found = ratios(pair.on, other, kinds)
                cells = [f"{found[g]:.2f}x" if g in found else "-" for g in GROUPS]
                lines.append(f"| {pair.on.method} over {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def markdown(summaries: Sequence[MethodSummary], kinds: Mapping[str, str]) -> str:
    """Both tables, for the run's output and for `specpipe bench --report`."""
    return "\n\n".join(t for t in (kinds_table(summaries, kinds), ratio_table(summaries, kinds)) if t)
