"""Write specpipe's Grafana dashboard (docs/observability.md) from the panels below, as Grafana's JSON
model, into the monitoring component (which ships it as a ConfigMap for Grafana's dashboard sidecar).

    python scripts/gen_dashboard.py          # rewrite deploy/k8s/components/monitoring/specpipe-dashboard.json
    python scripts/gen_dashboard.py --check  # fail if the committed file differs (tests/test_observability.py)

Every expression names metrics the services export; tests/test_observability.py checks that against a
live `specpipe up` and has promtool parse each one.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "deploy" / "k8s" / "components" / "monitoring" / "specpipe-dashboard.json"
RATE = "$__rate_interval"


def rate(metric: str, by: str = "", selector: str = "") -> str:
    """sum [by (by)] (rate(metric{selector}[$__rate_interval]))."""
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}{{{selector}}}[{RATE}]))" if selector else f"sum{group} (rate({metric}[{RATE}]))"


def ratio(numerator: str, denominator: str, by: str = "") -> str:
    return f"{rate(numerator, by)} / {rate(denominator, by)}"


def quantile(q: float, histogram: str, by: str = "", selector: str = "") -> str:
    return f"histogram_quantile({q}, {rate(histogram + '_bucket', ', '.join(filter(None, ('le', by))), selector)})"


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    width: int = 8


def latency(title: str, histogram: str, what: str, extra: tuple[tuple[str, str], ...] = ()) -> Panel:
    return Panel(title, what, tuple((quantile(q, histogram), f"p{round(q * 100)}") for q in (0.5, 0.9, 0.99)) + extra,
                 unit="ms")


HITS = rate("specpipe_prediction_hits_total", "predictor")
ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Traffic", (
        Panel("Throughput", "Verified tokens streamed to clients per second, all orchestrators.",
              ((rate("specpipe_emitted_tokens_total"), "tokens/s"),), unit="short"),
        latency("Time to first token", "specpipe_ttft_ms",
                "From a Generate request to its first chunk (the wait for a slot included); the objective is "
                "--ttft-slo-ms. A slow bucket's exemplar links to its trace.",
                (("max(specpipe_ttft_slo_ms)", "objective"),)),
        latency("Inter-token latency", "specpipe_inter_token_ms",
                "Time between streamed tokens (a chunk of n tokens counts its gap n times, each gap / n)."),
        Panel("Generations finished", "Finished generations per second, by why they ended.",
              ((rate("specpipe_generations_total", "finish_reason"), "{{finish_reason}}"),)),
    )),
    ("Speculation", (
        Panel("Acceptance", "Draft tokens accepted over draft tokens sent, by drafter; by source below.",
              ((ratio("specpipe_accepted_tokens_total", "specpipe_drafted_tokens_total", "drafter"), "{{drafter}}"),),
              unit="percentunit"),
        Panel("Acceptance by source", "The same by where a draft node came from: the small model, or the n-gram "
              "drafter's context, verifier table or learned store (global).",
              ((ratio("specpipe_accepted_tokens_by_source_total", "specpipe_drafted_tokens_by_source_total", "source"),
                "{{source}}"),), unit="percentunit"),
        Panel("Tokens per round", "Tokens emitted per verify round (1 is plain decoding: speculation then pays "
              "only its cost).",
              ((ratio("specpipe_emitted_tokens_total", "specpipe_rounds_total", "drafter"), "{{drafter}}"),)),
        Panel("Branch prediction hit rate", "Rounds whose outcome matched a pre-drafted hypothesis, of the rounds "
              "that had hypotheses.",
              ((f"{HITS} / ({HITS} + {rate('specpipe_prediction_misses_total', 'predictor')})", "{{predictor}}"),),
              unit="percentunit"),
        Panel("Speculation gate", "1 while an orchestrator's generations of a drafter kind may draft, 0 while its "
              "speculation gate runs them plain because plain rounds gave it more tokens a second "
              "(docs/adaptive.md).",
              (("min by (drafter, instance) (specpipe_speculation_gate)", "{{drafter}} {{instance}}"),)),
    )),
    ("Verifier and drafter", (
        Panel("Verifier batch size", "Sessions and tokens per batched verifier forward.",
              ((ratio("specpipe_verify_batch_sessions_sum", "specpipe_verify_batch_sessions_count"), "sessions (mean)"),
               (quantile(0.9, "specpipe_verify_batch_sessions"), "sessions (p90)"),
               (ratio("specpipe_verify_batch_tokens_sum", "specpipe_verify_batch_tokens_count"), "tokens (mean)"))),
        Panel("Busy share", "Forward time over wall time, per replica: how much of its time the verifier (the "
              "expensive part) computes. Near 1 with a queue is saturation; low while tokens/s is low is a "
              "pipeline that keeps it waiting (see CPU by hop).",
              ((rate("specpipe_forward_seconds_total", "role, instance"), "{{role}} {{instance}}"),),
              unit="percentunit"),
        latency("Verifier forward", "specpipe_verify_forward_ms", "Forward time of a round's batch, as the verifier "
                "measured it."),
        Panel("Queue depth", "Work waiting for the model (verifier rounds and prefills, drafter proposals) and "
              "generations waiting for an orchestrator slot.",
              (("max by (role) (specpipe_queue_depth)", "{{role}}"),)),
        Panel("Queue wait", "How long work waited before it started, p90 by role.",
              ((quantile(0.9, "specpipe_queue_wait_ms", "role"), "{{role}}"),), unit="ms"),
        latency("Draft time", "specpipe_draft_ms", "Drafter time per proposal."),
    )),
    ("Where the time goes", (
        Panel("CPU by hop", "CPU seconds per second of each role's threads, by hop (specpipe.runtime.cpu); the "
              "process's whole CPU is process_cpu_seconds_total.",
              ((rate("specpipe_cpu_seconds_total", "role, hop"), "{{role}}/{{hop}}"),), width=12),
        Panel("Round time by part", "Where the orchestrator's generations spend their wall time (seconds per "
              "second): prefill, wait for drafts, control, the verify call, emit, record, rest.",
              ((f"{rate('specpipe_round_part_ms_total', 'part')} / 1000", "{{part}}"),), width=12),
    )),
    ("Learned store", (
        Panel("Learned store hit rate", "Lookups whose draft came from the tenant's learned store, per tenant (the "
              "label is a hash of the tenant's id: specpipe.core.tenancy.tenant_label).",
              ((ratio("specpipe_learned_hits_total", "specpipe_learned_lookups_total", "tenant"), "{{tenant}}"),),
              unit="percentunit"),
        Panel("Learned store size", "Tokens in each tenant's learned store.",
              (("max by (tenant) (specpipe_learned_store_tokens)", "{{tenant}}"),)),
        Panel("Store failures", "N-gram store calls that failed (a store that is down costs drafts, never tokens).",
              ((rate("specpipe_cache_failures_total", "call"), "{{call}}"),)),
    )),
    ("Serving health", (
        Panel("Admission rejections", "Requests refused before any work, by role and reason; HTTP connections and "
              "requests the server refused before the API read them (too many, too slow).",
              ((rate("specpipe_admission_rejections_total", "role, reason"), "{{role}} {{reason}}"),
               (rate("specpipe_http_refused_total", "reason"), "http {{reason}}"))),
        Panel("Replicas", "The replicas each role's routing sees, by state (the least across orchestrators).",
              (("min by (role, state) (specpipe_replicas)", "{{role}} {{state}}"),)),
        Panel("Failovers", "Replicas marked failed, sessions moved to another verifier replica, proposals retried "
              "on another drafter replica.",
              ((rate("specpipe_replica_failures_total", "role"), "{{role}} failed"),
               (rate("specpipe_verifier_failovers_total", "reason"), "sessions moved: {{reason}}"),
               (rate("specpipe_drafter_failovers_total"), "proposals retried"))),
        Panel("Draining", "Replicas draining (SIGTERM): health NOT_SERVING, no new sessions.",
              (("sum by (instance) (specpipe_draining)", "{{instance}}"),)),
    )),
)


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    return {
        "id": panel_id, "type": "timeseries", "title": panel.title, "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "exemplar": True,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(panel.targets)],
    }


def dashboard() -> dict:
    panels, y, panel_id = [], 0, 1
    for title, row in ROWS:
        panels.append({"id": panel_id, "type": "row", "title": title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        panel_id, y, x = panel_id + 1, y + 1, 0
        for panel in row:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(panel_json(panel, panel_id, x, y))
            panel_id, x = panel_id + 1, x + panel.width
        y += 8
    return {
        "uid": "specpipe", "title": "specpipe", "tags": ["specpipe", "llm", "speculative-decoding"],
        "description": "Lossless speculative decoding as a service: traffic, speculation, the verifier's batches "
                       "and busy share, where the CPU goes, the learned store, serving health (docs/observability.md).",
        "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1, "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"}, "timezone": "",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []}, "links": [], "panels": panels,
    }


def expressions(board: dict) -> list[str]:
    """Every PromQL expression of a dashboard's panels."""
    return [target["expr"] for panel in board["panels"] for target in panel.get("targets", ())]


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed dashboard differs")
    args = parser.parse_args()
    text = render()
    if args.check:
        if OUT.read_text() != text:
            sys.exit(f"{OUT.relative_to(ROOT)} is stale: run python scripts/gen_dashboard.py")
        print("dashboard is up to date")
        return
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
