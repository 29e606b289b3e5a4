"""The operator's side (docs/observability.md): the Grafana dashboard, the alerting rules and the
Kubernetes components that ship them. Every PromQL expression names metrics the services export
(here: the families this process registers; tests/test_observability_up.py: a live `specpipe up`'s
scrape), promtool parses each one and runs the alerts' unit tests, and the components render and
hold what the Prometheus Operator, Grafana's sidecar and an OpenTelemetry Collector need."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
MONITORING = ROOT / "deploy" / "k8s" / "components" / "monitoring"
METRIC = re.compile(r"\b((?:specpipe|process)_[a-z0-9_]+)\b")
SELECTOR = re.compile(r"\b((?:specpipe|process)_[a-z0-9_]+)\{([^}]*)\}")
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created")}

sys.path.insert(0, str(ROOT / "scripts"))
import gen_dashboard  # noqa: E402


def dashboard_expressions() -> list[str]:
    return gen_dashboard.expressions(json.loads((MONITORING / "specpipe-dashboard.json").read_text()))


def rules() -> list[dict]:
    rule = yaml.safe_load((MONITORING / "rules.yaml").read_text())
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def all_expressions() -> list[str]:
    return dashboard_expressions() + [r["expr"] for r in rules()]


def exported_names(families) -> dict[str, set[str]]:
    """sample name -> the label names its samples carry, for every family (a counter's `_total`, a
    histogram's `_bucket` / `_sum` / `_count`), samples or not (a labelled metric before its first use)."""
    names: dict[str, set[str]] = {}
    for family in families:
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.setdefault(family.name + suffix, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def unexported(expressions: list[str], names: dict[str, set[str]]) -> list[str]:
    """What the expressions name that is not exported: metrics, and labels their selectors filter on."""
    missing = [f"{m} in {e!r}" for e in expressions for m in METRIC.findall(e) if m not in names]
    for expr in expressions:
        for metric, selector in SELECTOR.findall(expr):
            for label in re.findall(r"([a-z_]+)\s*[!=]", selector):
                if names.get(metric) and label not in names[metric] | {"le", "instance", "job"}:
                    missing.append(f"label {label} of {metric} in {expr!r}")
    return missing


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is needed (Debian: prometheus); .ci/run installs it"
    return path


def test_the_dashboard_is_what_its_script_writes():
    assert (MONITORING / "specpipe-dashboard.json").read_text() == gen_dashboard.render(), \
        "run python scripts/gen_dashboard.py"


def test_the_dashboard_has_a_panel_for_each_question():
    board = json.loads((MONITORING / "specpipe-dashboard.json").read_text())
    titles = {p["title"] for p in board["panels"]}
    assert {"Throughput", "Time to first token", "Inter-token latency", "Acceptance", "Tokens per round",
            "Branch prediction hit rate", "Verifier batch size", "Busy share", "Queue depth", "Queue wait",
            "CPU by hop", "Learned store hit rate", "Learned store size", "Admission rejections", "Replicas"} <= titles
    exprs = " ".join(dashboard_expressions())
    assert "specpipe_forward_seconds_total" in exprs and "specpipe_cpu_seconds_total" in exprs
    targets = [t for p in board["panels"] for t in p.get("targets", ())]
    assert all(t["datasource"]["uid"] == "${datasource}" for t in targets)


def test_every_expression_names_metrics_this_process_registers():
    """The quick check (the live one scrapes `specpipe up`): every family the services define is registered
    in this process by importing specpipe.runtime.metrics."""
    from prometheus_client import REGISTRY

    import specpipe.runtime.metrics  # noqa: F401

    assert unexported(all_expressions(), exported_names(REGISTRY.collect())) == []


def test_unexported_names_are_caught():
    names = {"specpipe_rounds_total": {"drafter"}}
    assert unexported(["sum(rate(specpipe_rounds_total[5m]))"], names) == []
    assert unexported(["sum(rate(specpipe_round_total[5m]))"], names)  # a typo
    assert unexported(['rate(specpipe_rounds_total{drafer="x"}[5m])'], names)  # a label it does not have


def test_promtool_parses_every_dashboard_expression(tmp_path):
    """Each expression as a recording rule ($__rate_interval as Grafana fills it in), checked by promtool."""
    recorded = [{"record": f"specpipe:panel_{i}", "expr": e.replace("$__rate_interval", "1m")}
                for i, e in enumerate(dashboard_expressions())]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    check = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_alerts_pass_promtools_check_and_unit_tests(tmp_path):
    groups = yaml.safe_load((MONITORING / "rules.yaml").read_text())["spec"]["groups"]
    (tmp_path / "full.yaml").write_text(yaml.safe_dump({"groups": groups}))
    check = subprocess.run([promtool(), "check", "rules", str(tmp_path / "full.yaml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # the annotations' templates too
    for group in groups:  # the unit tests compare labels; the annotations are checked above
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(MONITORING / "rules-test.yaml", tmp_path / "rules-test.yaml")
    test = subprocess.run([promtool(), "test", "rules", "rules-test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert test.returncode == 0, test.stdout + test.stderr
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "rules-test.yaml").read_text()))
    assert tested == {r["alert"] for r in rules()}  # every alert has a unit test


def render(tmp_path: pathlib.Path, *components: str) -> list[dict]:
    """The base with these components, rendered by `kubectl kustomize` (an overlay written in tmp_path)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed (Debian: kubernetes-client); .ci/run installs it"
    k8s = pathlib.Path(os.path.relpath(ROOT / "deploy" / "k8s", tmp_path))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(k8s / "base")], "components": [str(k8s / "components" / c) for c in components]}))
    out = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_the_monitoring_component_scrapes_every_service_and_ships_the_rules_and_the_dashboard(tmp_path):
    """Structural checks of the Prometheus Operator's kinds (their CRDs are not in kubernetes-validate's
    schemas), as the manifest tests check KEDA's."""
    objects = render(tmp_path, "monitoring")
    (monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert monitor["spec"]["scrapeProtocols"][0].startswith("OpenMetrics")  # exemplars need it
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [o for o in objects if o["kind"] == "Deployment"]
    for d in services:
        pod = d["spec"]["template"]
        assert selector.items() <= pod["metadata"]["labels"].items(), d["metadata"]["name"]
        ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
        args = pod["spec"]["containers"][0]["args"]
        assert ports["metrics"] == int(args[args.index("--metrics-port") + 1]), d["metadata"]["name"]
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"] == monitor["metadata"]["labels"]  # one ruleSelector / podMonitorSelector
    for r in (r for g in rule["spec"]["groups"] for r in g["rules"]):
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"} and r["labels"]["severity"]
        assert {"summary", "description"} <= set(r["annotations"])
    (board,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "specpipe-dashboard"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["specpipe-dashboard.json"])["uid"] == "specpipe"


def test_the_tracing_component_turns_tracing_on_toward_a_collector(tmp_path, monkeypatch):
    """Every service reads the component's settings through specpipe-config: `specpipe serve ROLE`
    parses them as --tracing on and the ratio, OpenTelemetry the exporter's variables; the network
    policy lets each pod reach the Collector's OTLP port and DNS."""
    import kubernetes_validate

    from specpipe.cli.main import build_parser
    from specpipe.config.services import tracing_config

    objects = render(tmp_path, "tracing")
    config = next(o for o in objects
                  if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("specpipe-config"))
    env = config["data"]
    assert env["OTEL_TRACES_EXPORTER"] == "otlp" and env["OTEL_EXPORTER_OTLP_ENDPOINT"].endswith(":4317")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for role in ("orchestrator", "verifier", "drafter"):
        traced = tracing_config(vars(build_parser().parse_args(["serve", role])))
        assert traced.enabled and traced.trace_ratio == float(env["SPECPIPE_TRACE_RATIO"])
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "specpipe-otlp-egress"]
    kubernetes_validate.validate(policy, "1.32.0", strict=True)
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "specpipe"}
    assert {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]} == {4317, 53}
    for d in (o for o in objects if o["kind"] == "Deployment"):
        assert {"configMapRef": {"name": config["metadata"]["name"]}} in d["spec"]["template"]["spec"]["containers"][0][
            "envFrom"], d["metadata"]["name"]


def test_a_tenant_is_labelled_by_a_hash_never_by_its_id():
    from prometheus_client import REGISTRY

    from cache_service.memory import InMemoryNgramCache
    from specpipe.core.tenancy import tenant_label

    assert tenant_label("") == "default"
    label = tenant_label("acme-secret-customer")
    assert re.fullmatch(r"t-[0-9a-f]{12}", label) and label == tenant_label("acme-secret-customer")
    assert label != tenant_label("acme-secret-customer2")
    InMemoryNgramCache().update_global(list(range(40)), tenant="acme-secret-customer")
    assert REGISTRY.get_sample_value("specpipe_learned_store_tokens", {"tenant": label}) == 40
    exposition = "".join(f"{s}" for family in REGISTRY.collect() for s in family.samples)
    assert "acme-secret-customer" not in exposition
