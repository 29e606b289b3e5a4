"""deploy/k8s, offline: every overlay renders with `kubectl kustomize`, validates against the Kubernetes
schemas (kubernetes-validate, strict), and has the properties a platform team asks for."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
KUBERNETES_VERSION = "1.32.0"
CRDS = {("keda.sh/v1alpha1", "ScaledObject")}  # not in the core schemas: checked below instead
PRESTOP_S, MARGIN_S = 5, 10


def render(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed (Debian: kubernetes-client); .ci/run installs it"
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True,
                         check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def objects(request) -> list[dict]:
    return render(request.param)


def of_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def pod_specs(objects):
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield o["metadata"]["name"], o["spec"]["template"]["spec"]


def test_renders_and_validates(objects):
    import kubernetes_validate

    for o in objects:
        if (o["apiVersion"], o["kind"]) in CRDS:
            continue
        kubernetes_validate.validate(o, KUBERNETES_VERSION, strict=True)  # raises ValidationError


def test_every_container_probed_limited_non_root_read_only(objects):
    for name, spec in pod_specs(objects):
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        for c in spec["containers"]:
            where = f"{name}/{c['name']}"
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"], where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert {"cpu", "memory"} <= set(c["resources"]["limits"]) and c["resources"]["requests"], where
            if name.startswith("specpipe-models"):
                continue  # a Job runs to completion: no probes
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in c, f"{where} has no {probe}"
            if name != "specpipe-redis":  # specpipe services: native gRPC probes on grpc.health.v1
                assert all("grpc" in c[p] for p in ("startupProbe", "readinessProbe", "livenessProbe")), where


def test_grace_period_covers_prestop_drain_and_margin(objects):
    config = {k: v for cm in of_kind(objects, "ConfigMap") if cm["metadata"]["name"].startswith("specpipe-config")
              for k, v in cm["data"].items()}
    drain_s = float(config["SPECPIPE_DRAIN_TIMEOUT"])
    for d in of_kind(objects, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        assert spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"] == PRESTOP_S
        assert spec["terminationGracePeriodSeconds"] >= PRESTOP_S + drain_s + MARGIN_S, d["metadata"]["name"]


def test_every_workload_has_a_pdb(objects):
    selectors = [p["spec"]["selector"]["matchLabels"] for p in of_kind(objects, "PodDisruptionBudget")]
    for o in of_kind(objects, "Deployment") + of_kind(objects, "StatefulSet"):
        labels = o["spec"]["template"]["metadata"]["labels"]
        assert any(sel.items() <= labels.items() for sel in selectors), o["metadata"]["name"]


def test_verifier_has_a_headless_service(objects):
    headless = [s for s in of_kind(objects, "Service") if s["spec"].get("clusterIP") == "None"]
    assert any(s["spec"]["selector"]["app.kubernetes.io/component"] == "verifier" for s in headless)
    orchestrator = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "specpipe-orchestrator")
    assert "dns:///specpipe-verifier-headless:50052" in orchestrator["spec"]["template"]["spec"]["containers"][0]["args"]


def test_network_policy_denies_by_default_and_allows_the_flows(objects):
    policies = of_kind(objects, "NetworkPolicy")
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")
            and not p["spec"].get("egress")]
    assert deny and set(deny[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}

    def allowed(src: str, dst: str) -> bool:
        policy = next(p for p in policies if p["spec"]["podSelector"].get("matchLabels", {})
                      .get("app.kubernetes.io/component") == dst)
        peers = [peer for rule in policy["spec"].get("ingress", []) for peer in rule.get("from", [])]
        return any(peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == src
                   for peer in peers)

    for src, dst in [("orchestrator", "verifier"), ("orchestrator", "drafter"), ("orchestrator", "redis"),
                     ("drafter", "redis")]:
        assert allowed(src, dst), f"{src} -> {dst}"
    for src, dst in [("drafter", "verifier"), ("verifier", "redis"), ("verifier", "drafter")]:
        assert not allowed(src, dst), f"{src} -> {dst}"
    # the models-prepare Job reaches PyPI (HTTPS outside the cluster) and nothing of specpipe's
    job = next(j for j in of_kind(objects, "Job") if j["metadata"]["name"] == "specpipe-models-prepare")
    component = job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
    prepare = next(p for p in policies if p["spec"]["podSelector"].get("matchLabels", {})
                   .get("app.kubernetes.io/component") == component)
    out = [rule for rule in prepare["spec"]["egress"] if any("ipBlock" in peer for peer in rule["to"])]
    assert [port["port"] for rule in out for port in rule["ports"]] == [443]
    assert all("10.0.0.0/8" in peer["ipBlock"]["except"] for rule in out for peer in rule["to"])


def test_redis_has_auth_from_a_secret_and_is_a_bounded_cache(objects):
    redis = next(s for s in of_kind(objects, "StatefulSet") if s["metadata"]["name"] == "specpipe-redis")
    c = redis["spec"]["template"]["spec"]["containers"][0]
    command = " ".join(c["args"])
    assert "--requirepass" in command and "--maxmemory " in command and "allkeys-lru" in command
    assert any(e.get("valueFrom", {}).get("secretKeyRef") for e in c["env"])


def test_each_role_scales_on_its_own_exported_signal(objects):
    from specpipe import metrics

    from prometheus_client.metrics import MetricWrapperBase

    exported = {m.describe()[0].name for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)}
    exported |= {"specpipe_queue_depth"}  # the verifier's batching queue (batched verification, in progress)
    scalers = {s["spec"]["scaleTargetRef"]["name"]: s for s in of_kind(objects, "ScaledObject")}
    assert set(scalers) == {"specpipe-verifier", "specpipe-drafter", "specpipe-orchestrator"}
    queries = {}
    for name, s in scalers.items():
        trigger = s["spec"]["triggers"][0]
        assert trigger["type"] == "prometheus" and float(trigger["metadata"]["threshold"]) > 0
        queries[name] = trigger["metadata"]["query"]
        for metric in re.findall(r"specpipe_[a-z_]+", queries[name]):
            assert metric.removesuffix("_total") in exported, f"{name}: {metric} is not exported"
    assert len(set(queries.values())) == 3  # verifier, drafter and orchestrator on different signals


def test_prometheus_scrapes_every_specpipe_service(objects):
    for d in of_kind(objects, "Deployment"):
        annotations = d["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        args = d["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--metrics-port") + 1] == annotations["prometheus.io/port"]


def test_gpu_overlay_requests_gpus_and_cuda():
    for d in of_kind(render("gpu"), "Deployment"):
        if d["metadata"]["name"] in ("specpipe-verifier", "specpipe-drafter"):
            spec = d["spec"]["template"]["spec"]
            c = spec["containers"][0]
            assert c["resources"]["limits"]["nvidia.com/gpu"] == "1" and spec["tolerations"] and spec["nodeSelector"]
            assert " ".join(c["args"]).endswith("--device cuda --compile on")
