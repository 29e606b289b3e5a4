"""Every default once (specpipe.core.settings): the configs own each default and its help text; the
CLI's flags, the SPECPIPE_* environment, the Ray YAML and the Kubernetes args are built from them or
checked against them here. A zero is a zero, or refused, never silently replaced."""

from __future__ import annotations

import inspect
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

from specpipe.cli.main import build_parser
from specpipe.config import services
from specpipe.config.bench import bench_config, loadtest_config
from specpipe.config.env import VARIABLES
from specpipe.core.errors import InvalidArgument
from specpipe.core.settings import ENV, default_of, settings_of

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETTING_CLASSES = (services.ModelConfig, services.BatchConfig, services.AdmissionConfig, services.TlsFiles,
                   services.VerifierConfig, services.DrafterConfig, services.CacheConfig, services.SeedConfig,
                   services.OrchestratorConfig, services.GeneratorConfig, services.ServeConfig, services.UpConfig)


@pytest.fixture(autouse=True)
def no_specpipe_environment(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def parse(*argv: str) -> dict:
    return vars(build_parser().parse_args(list(argv)))


@pytest.mark.parametrize("argv, build", [
    (["serve", "verifier"], services.verifier_config),
    (["serve", "drafter"], services.drafter_config),
    (["serve", "cache"], services.cache_config),
    (["serve", "orchestrator"], services.orchestrator_config),
    (["generate", "--prompt", "x"], services.generator_config),
    (["bench"], bench_config),
    (["loadtest"], loadtest_config),
])
def test_a_command_without_flags_builds_the_default_config(argv, build):
    """Every flag's default is its setting's: the config of no flags is the config of an empty mapping
    (the Ray application's and the tests' way of saying "the defaults")."""
    assert build(parse(*argv)) == build({})


@pytest.mark.parametrize("role", ["verifier", "drafter", "orchestrator", "cache"])
def test_serve_without_flags_is_the_default_server_on_its_roles_port(role):
    from specpipe.cli.serve_cmd import DEFAULT_PORTS

    assert services.serve_config(parse("serve", role)) == services.ServeConfig(port=DEFAULT_PORTS[role])


def test_cache_seed_and_up_without_flags_build_the_defaults(tmp_path):
    from specpipe.cli.up_cmd import up_config

    assert services.seed_config(parse("cache", "seed", "a.txt")) == services.SeedConfig(files=("a.txt",))
    up = up_config(parse("up"), tmp_path)
    assert (up.model, up.base_port, up.http_port, up.pin, up.verifiers, up.drain_timeout_s, up.cache) == (
        services.ModelConfig(), 50051, 8000, False, 1, services.DRAIN_TIMEOUT_S, "memory")


def test_each_setting_names_a_known_variable_and_the_docs_list_them_all():
    named = {f.metadata[ENV] for cls in SETTING_CLASSES for f in settings_of(cls).values() if f.metadata[ENV]}
    assert named <= set(VARIABLES), named - set(VARIABLES)
    cli_doc = (ROOT / "docs" / "cli.md").read_text()
    assert all(f"`{variable}`" in cli_doc for variable in VARIABLES)


def test_a_variable_is_the_flags_default(monkeypatch):
    monkeypatch.setenv("SPECPIPE_DRAIN_TIMEOUT", "7")
    monkeypatch.setenv("SPECPIPE_PRESET", "tiny")
    assert services.serve_config(parse("serve", "verifier")).drain_timeout_s == 7.0
    assert services.verifier_config(parse("serve", "verifier")).model.preset == "tiny"


@pytest.mark.parametrize("argv, build, read", [
    (["serve", "orchestrator", "--max-queue", "0"], services.orchestrator_config, lambda c: c.admission.max_queue),
    (["generate", "--prompt", "x", "--draft-len", "0"], services.generator_config,
     lambda c: (c.speculation.draft_len, c.speculation.adaptive)),
    (["serve", "orchestrator", "--hop-delay-ms", "0"], services.orchestrator_config, lambda c: c.hop_delay_ms),
])
def test_a_zero_is_a_zero(argv, build, read):
    assert read(build(parse(*argv))) in (0, (0, "off"))


@pytest.mark.parametrize("argv, build, message", [
    (["serve", "verifier", "--max-sessions", "0"], services.verifier_config, "max_sessions must be > 0"),
    (["serve", "verifier", "--max-queue", "0"], services.verifier_config, "max_queue must be at least 1"),
    (["serve", "verifier", "--session-ttl", "0"], services.verifier_config, "session_ttl_s must be > 0"),
    (["serve", "orchestrator", "--max-sessions", "0"], services.orchestrator_config, "max_sessions must be >= 1"),
    (["serve", "orchestrator", "--rpc-timeout", "0"], services.orchestrator_config, "rpc_timeout_s must be > 0"),
    (["serve", "orchestrator", "--connect-timeout", "0"], services.orchestrator_config, "connect_timeout_s must be"),
    (["generate", "--prompt", "x", "--width", "0"], services.generator_config, "width >= 1"),
    (["serve", "verifier", "--max-workers", "0"], services.serve_config, "max_workers must be >= 1"),
    (["up", "--startup-timeout", "0"], lambda values: services.UpConfig(startup_timeout_s=0), "startup_timeout"),
])
def test_a_zero_that_means_nothing_is_refused(argv, build, message):
    with pytest.raises(InvalidArgument, match=message):
        build(parse(*argv))


def test_the_speculation_fields_are_listed_once():
    """The flags `up` passes on, the Ray keys and the config all come from SpeculationOptions' fields."""
    from specpipe.cli.options import speculation_flags
    from specpipe.core.types import SpeculationOptions

    keys = set(settings_of(SpeculationOptions))
    flags = speculation_flags(SpeculationOptions())
    assert {flag.removeprefix("--").replace("-", "_") for flag in flags[::2]} == keys
    assert keys <= services.SETTINGS["orchestrator"]


def test_role_constructors_default_to_the_configs_settings():
    """The verifier's and drafter's own keyword defaults (used by tests and benches that build them
    directly) are the configs' defaults."""
    from drafter_service.model_drafter import ModelDrafter
    from verifier_service.verifier import ModelVerifier

    verifier = inspect.signature(ModelVerifier.__init__).parameters
    config = services.VerifierConfig()
    assert (verifier["max_sessions"].default, verifier["session_ttl_s"].default) == (
        config.max_sessions, config.session_ttl_s)
    drafter = inspect.signature(ModelDrafter.__init__).parameters
    assert drafter["session_ttl_s"].default == services.DrafterConfig().session_ttl_s


# --- the Ray YAML ------------------------------------------------------------------------------

def ray_applications() -> list[tuple[str, dict]]:
    """(where, application) of deploy/ray/serve.yaml and of the KubeRay RayService's serveConfigV2."""
    local = yaml.safe_load((ROOT / "deploy" / "ray" / "serve.yaml").read_text())
    rayservice = yaml.safe_load((ROOT / "deploy" / "k8s" / "ray" / "rayservice.yaml").read_text())
    kuberay = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    return [(name, app) for name, config in (("deploy/ray", local), ("deploy/k8s/ray", kuberay))
            for app in config["applications"]]


def setting_defaults(role: str) -> dict:
    """The default of each key a role takes (on / off for a bool setting's flag)."""
    classes = {"verifier": (services.ModelConfig, services.BatchConfig, services.VerifierConfig),
               "drafter": (services.ModelConfig, services.DrafterConfig),
               "orchestrator": (services.ModelConfig, services.OrchestratorConfig, services.AdmissionConfig)}[role]
    from specpipe.core.types import SpeculationOptions

    classes += (SpeculationOptions,) if role == "orchestrator" else ()
    return {key: default_of(f) for cls in classes for key, f in settings_of(cls).items()}


@pytest.mark.parametrize("where, app", ray_applications())
def test_ray_args_are_settings_that_differ_from_the_defaults(where, app):
    for role in services.SETTINGS:  # the Ray application's roles
        args = app["args"].get(role) or {}
        services.check_settings(role, args)
        restated = {k: v for k, v in args.items() if setting_defaults(role).get(k, object()) == v}
        assert not restated, f"{where} {role} restates defaults {restated}: leave them out"


@pytest.mark.parametrize("where, app", ray_applications())
def test_ray_replicas_take_as_many_calls_as_their_role_admits(where, app):
    """A Verifier replica's max_ongoing_requests is its max_sessions (one call in flight per session);
    an Orchestrator's, its admission's max_sessions (one Generate stream per generation)."""
    ongoing = {d["name"]: d["max_ongoing_requests"] for d in app["deployments"]}
    verifier = services.verifier_config(app["args"]["verifier"])
    orchestrator = services.orchestrator_config(app["args"]["orchestrator"], drafter_service=True)
    assert ongoing["Verifier"] == verifier.max_sessions, where
    assert ongoing["Orchestrator"] == orchestrator.admission.max_sessions, where


# --- the Kubernetes args -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def k8s_objects() -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed (Debian: kubernetes-client); .ci/run installs it"
    out = subprocess.run([kubectl, "kustomize", str(ROOT / "deploy" / "k8s" / "overlays" / "cpu")],
                         capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_k8s_args_parse_and_the_configmap_restates_the_code(k8s_objects):
    """Each `serve ROLE` container's args, $(VAR)s expanded from the ConfigMap, parse with the CLI and
    build their role's config; it listens on the role's default port; each SPECPIPE_* key of the
    ConfigMap is a variable the code reads or one the args expand, and the speculation it expands to
    is the served default (a drafter service of its own: the hybrid)."""
    from specpipe.cli.serve_cmd import CONFIGS, DEFAULT_PORTS

    data = {k: v for o in k8s_objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(
        "specpipe-config") for k, v in o["data"].items()}
    expanded = set()
    for o in k8s_objects:
        if o["kind"] != "Deployment":
            continue
        container = o["spec"]["template"]["spec"]["containers"][0]
        args = container.get("args", [])
        if args[:1] != ["serve"]:
            continue
        expanded |= {m for a in args for m in re.findall(r"\$\((\w+)\)", a)}
        values = parse(*(re.sub(r"\$\((\w+)\)", lambda m: data[m.group(1)], a) for a in args))
        config = getattr(services, CONFIGS[values["role"]])(values)
        grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
        assert grpc_port == DEFAULT_PORTS[values["role"]]
        if values["role"] == "orchestrator":
            assert config.speculation == services.speculation({}, drafter_service=True)
    unknown = {k for k in data if k.startswith("SPECPIPE_")} - set(VARIABLES) - expanded
    assert not unknown
