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
OVERLAYS = ("cpu", "gpu", "simulated-gpu")
KUBERNETES_VERSION = "1.32.0"
CRDS = {("keda.sh/v1alpha1", "ScaledObject"),  # not in the core schemas: checked below instead
        ("cert-manager.io/v1", "Certificate"), ("cert-manager.io/v1", "Issuer")}
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


def test_the_orchestrator_speculates_with_the_served_defaults(objects):
    from specpipe.core.types import DRAFTER_WITH_MODEL, SpeculationOptions

    config = {k: v for cm in of_kind(objects, "ConfigMap") if cm["metadata"]["name"].startswith("specpipe-config")
              for k, v in cm["data"].items()}
    assert config["SPECPIPE_DRAFTER"] == DRAFTER_WITH_MODEL  # the drafter runs in pods of its own
    defaults = SpeculationOptions()
    assert (config["SPECPIPE_SCHEDULE"], config["SPECPIPE_ADAPTIVE"]) == (defaults.schedule, defaults.adaptive)


def test_every_workload_has_a_pdb(objects):
    selectors = [p["spec"]["selector"]["matchLabels"] for p in of_kind(objects, "PodDisruptionBudget")]
    for o in of_kind(objects, "Deployment") + of_kind(objects, "StatefulSet"):
        labels = o["spec"]["template"]["metadata"]["labels"]
        assert any(sel.items() <= labels.items() for sel in selectors), o["metadata"]["name"]


def test_verifier_has_a_headless_service(objects):
    headless = [s for s in of_kind(objects, "Service") if s["spec"].get("clusterIP") == "None"]
    assert any(s["spec"]["selector"]["app.kubernetes.io/component"] == "verifier" for s in headless)
    orchestrator = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "specpipe-orchestrator")
    assert (
        "dns:///specpipe-verifier-headless:50052" in orchestrator["spec"]["template"]["spec"]["containers"][0]["args"]
    )


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


def redis_container(objects) -> dict:
    redis = next(s for s in of_kind(objects, "StatefulSet") if s["metadata"]["name"] == "specpipe-redis")
    return redis["spec"]["template"]["spec"]["containers"][0]


def test_redis_has_an_acl_user_from_a_secret_and_is_a_bounded_cache(objects):
    from cache_service.redis_store import ACL_RULES

    c = redis_container(objects)
    script = " ".join(c["args"])
    assert "--aclfile" in script and "--maxmemory " in script and "allkeys-lru" in script
    assert "user default off" in script and f"user specpipe on >$REDIS_PASSWORD {ACL_RULES}\"" in script
    assert "--requirepass" not in script and "umask 077" in script  # the password in a 0600 file only
    assert any(e.get("valueFrom", {}).get("secretKeyRef") for e in c["env"])
    for d in of_kind(objects, "Deployment"):  # the services log in as that user, password from the Secret
        env = {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        if "SPECPIPE_CACHE" in env:
            assert env["SPECPIPE_CACHE"]["value"].startswith("redis://specpipe:$(REDIS_PASSWORD)@"), d["metadata"][
                "name"
            ]
            assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "specpipe-redis", "key": "password"}


def test_the_redis_start_script_serves_the_services_url(tmp_path):
    """The manifest's own start script on a real redis-server (its /data a temp dir): the services'
    SPECPIPE_CACHE URL works, the default user and other keys do not."""
    import os
    import time

    import redis as redis_py

    from cache_service.stores import open_store
    from specpipe.devtools import local_redis

    if local_redis.find_binary() is None:
        pytest.skip(local_redis.NOT_FOUND)
    objects = render("cpu")
    script = redis_container(objects)["args"][0].rstrip().replace("/data/", f"{tmp_path}/")
    port = local_redis.free_port()
    script = (
        script.replace("exec redis-server", f"exec {local_redis.find_binary()}") + f" --port {port} --bind 127.0.0.1"
    )
    orchestrator = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "specpipe-orchestrator")
    url = next(e["value"] for e in orchestrator["spec"]["template"]["spec"]["containers"][0]["env"]
               if e["name"] == "SPECPIPE_CACHE").split()[0]
    url = url.replace("$(REDIS_PASSWORD)", "s3cret").replace("specpipe-redis:6379", f"127.0.0.1:{port}")
    proc = subprocess.Popen(["sh", "-c", script], env={**os.environ, "REDIS_PASSWORD": "s3cret"}, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        store = None
        for _ in range(100):
            try:
                store = open_store(url)
                store.update_global([4, 5, 6, 7, 8])
                break
            except Exception:  # not up yet
                time.sleep(0.05)
        assert store is not None and store.lookup("s", [4, 5, 6], 2, 1).draft.tokens == (7, 8)
        assert (tmp_path / "users.acl").stat().st_mode & 0o777 == 0o600
        with pytest.raises(redis_py.exceptions.AuthenticationError):
            redis_py.Redis(port=port).ping()  # the default user is off
        with pytest.raises(redis_py.exceptions.NoPermissionError):
            redis_py.Redis.from_url(url).execute_command("CONFIG", "GET", "*")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_tls_component_mounts_certificates_and_probes_in_plaintext(monkeypatch):
    """overlays/gpu (components/tls): every service has its role's certificate and the CA from a
    Secret that cert-manager issues for the Service names its peers dial, reads them through the
    variables the CLI reads, and is probed on its plaintext health-only port; the public API
    requires a token from a Secret."""
    from specpipe.cli.main import build_parser

    objects = render("gpu")
    certificates = {c["spec"]["secretName"]: c for c in of_kind(objects, "Certificate")}
    orchestrator_args = next(d for d in of_kind(objects, "Deployment")
                             if d["metadata"]["name"] == "specpipe-orchestrator")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    dialled = {a.removeprefix("dns:///").rpartition(":")[0] for a in orchestrator_args if a.startswith("dns:///")}
    assert dialled == {"specpipe-verifier-headless", "specpipe-drafter-headless"}
    for d in of_kind(objects, "Deployment"):
        name, spec = d["metadata"]["name"], d["spec"]["template"]["spec"]
        role = name.removeprefix("specpipe-")
        c = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        tls_mount = mounts["/etc/specpipe/tls"]
        assert tls_mount["readOnly"] and volumes[tls_mount["name"]]["secret"]["secretName"] == f"specpipe-tls-{role}"
        assert {env[k] for k in ("SPECPIPE_TLS_CERT", "SPECPIPE_TLS_KEY", "SPECPIPE_TLS_CA")} == {
            f"/etc/specpipe/tls/{f}" for f in ("tls.crt", "tls.key", "ca.crt")}
        health = int(env["SPECPIPE_HEALTH_PORT"])
        assert {"name": "health", "containerPort": health} in c["ports"], name
        assert all(c[p]["grpc"]["port"] == health for p in ("startupProbe", "readinessProbe", "livenessProbe")), name
        certificate = certificates[f"specpipe-tls-{role}"]["spec"]
        assert {"server auth", "client auth"} <= set(certificate["usages"]), name
        assert (
            f"specpipe-{role}-headless" in certificate["dnsNames"] and certificate["issuerRef"]["name"] == "specpipe-ca"
        )
        for key, value in env.items():  # the CLI reads these variables as the flags' defaults
            monkeypatch.setenv(key, value or "")
        args = build_parser().parse_args(["serve", role])
        assert (args.tls_cert, args.tls_key, args.tls_ca, args.health_port) == (
            env["SPECPIPE_TLS_CERT"], env["SPECPIPE_TLS_KEY"], env["SPECPIPE_TLS_CA"], health)
        if role == "orchestrator":
            auth = mounts["/etc/specpipe/auth"]
            assert volumes[auth["name"]]["secret"]["secretName"] == "specpipe-auth"
            assert env["SPECPIPE_AUTH_TOKEN_FILE"] == "/etc/specpipe/auth/token" == args.auth_token_file
    cpu = render("cpu")  # the laptop overlay stays plaintext
    assert not of_kind(cpu, "Certificate")


def test_each_role_scales_on_its_own_exported_signal(objects):
    from prometheus_client.metrics import MetricWrapperBase

    from specpipe.runtime import metrics

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


def test_the_simulated_gpu_overlay_holds_the_model_services_to_a_packaged_curve():
    """overlays/simulated-gpu: the verifier's and the drafter's args are flags `specpipe serve` takes, and
    the curve they name loads for each role; the serving overlays hold no forward to a curve."""
    from specpipe.cli.main import build_parser
    from specpipe.engine.costmodel import load_curve

    containers = {name: spec["containers"][0] for name, spec in pod_specs(render("simulated-gpu"))}
    for role in ("verifier", "drafter"):
        args = containers[f"specpipe-{role}"]["args"]
        parsed = build_parser().parse_args(args)
        assert parsed.cost_model == "nvidia-h200-qwen-coder"
        assert load_curve(parsed.cost_model, role).device == "NVIDIA H200"
    for overlay in ("cpu", "gpu"):
        assert not any(
            "--cost-model" in spec["containers"][0].get("args", ()) for _, spec in pod_specs(render(overlay))
        )
