"""deploy/k8s/ray, offline: the KubeRay RayService renders with `kubectl kustomize`; what has a
schema is validated against it: the embedded pod templates and the serve Service against the
Kubernetes schemas (kubernetes-validate, strict; the RayService CRD itself is not in them), and
serveConfigV2 against Ray Serve's own config schema (ServeDeploySchema), with each role's settings
built into the config its deployment gets. Then the properties of the shape: a head without GPU or
replicas, a GPU worker group, the Ray version of the ray extra."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
KUBERNETES_VERSION = "1.32.0"


@pytest.fixture(scope="module")
def rayservice() -> dict:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed (Debian: kubernetes-client); .ci/run installs it"
    out = subprocess.run([kubectl, "kustomize", str(ROOT / "deploy" / "k8s" / "ray")], capture_output=True,
                         text=True, check=True).stdout
    objects = [doc for doc in yaml.safe_load_all(out) if doc]
    assert [(o["apiVersion"], o["kind"]) for o in objects] == [("ray.io/v1", "RayService")]
    return objects[0]


def groups(rayservice):
    cluster = rayservice["spec"]["rayClusterConfig"]
    return [("head", cluster["headGroupSpec"]), *((g["groupName"], g) for g in cluster["workerGroupSpecs"])]


def test_pod_templates_and_service_validate(rayservice):
    import kubernetes_validate

    for name, group in groups(rayservice):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
                                      "template": group["template"]}, KUBERNETES_VERSION, strict=True)
    service = rayservice["spec"]["serveService"]
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Service", **service}, KUBERNETES_VERSION, strict=True)
    assert {p["port"] for p in service["spec"]["ports"]} >= {9000}


def test_serve_config_is_the_applications(rayservice):
    pytest.importorskip("ray", reason="the ray extra checks serveConfigV2 against Ray Serve's schema")
    from ray.serve.schema import ServeDeploySchema

    from specpipe.rayserve.app import ROLES, role_config
    from specpipe.rayserve.launch import load_config

    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    schema = ServeDeploySchema.model_validate(config)
    local = load_config()
    assert config["grpc_options"]["grpc_servicer_functions"] == local["grpc_options"]["grpc_servicer_functions"]
    (app,) = schema.applications
    assert app.import_path == local["applications"][0]["import_path"]
    for role in ROLES:
        assert role_config(role, app.args[role]).model.preset == "smollm2"  # the config each deployment gets
    names = {d.name for d in app.deployments}
    assert names == {d["name"] for d in local["applications"][0]["deployments"]}
    gpus = {d.name: d.ray_actor_options.num_gpus for d in app.deployments}
    assert gpus["Verifier"] > 0 and gpus["Drafter"] > 0 and gpus["Orchestrator"] == 0
    assert all(d.autoscaling_config for d in app.deployments)


def test_head_without_gpu_workers_with_gpu(rayservice):
    (head_name, head), *workers = groups(rayservice)
    assert head["rayStartParams"]["num-cpus"] == "0"  # no replica is placed on the head
    assert workers
    for name, group in groups(rayservice):
        spec = group["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        for c in spec["containers"]:
            gpu = "nvidia.com/gpu" in c["resources"].get("limits", {})
            assert gpu == (name != head_name), f"{name}/{c['name']}"
            assert c["securityContext"]["readOnlyRootFilesystem"] and c["resources"]["requests"], name
            assert {v["mountPath"] for v in c["volumeMounts"]} >= {"/tmp", "/dev/shm"}, name  # Ray writes there


def test_ray_version_is_the_extra(rayservice):
    pin = re.search(r'"ray\[serve\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert rayservice["spec"]["rayClusterConfig"]["rayVersion"] == pin
    assert f'"ray[serve]=={pin}"' in (ROOT / "deploy" / "ray" / "Dockerfile").read_text()
