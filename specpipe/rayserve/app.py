"""The Ray Serve application: `import_path: specpipe.rayserve.app:build_app` in a Serve config.

    args:                       # each role's settings: its `specpipe serve ROLE` flags' names
      verifier: {preset: tiny, max_sessions: 32}
      drafter: {preset: tiny}
      orchestrator: {preset: tiny, schedule: sequential}

The orchestrator is the ingress (Serve's gRPC proxy calls it); it reaches the verifier and the
drafter through DeploymentHandles. Both are routed by specpipe/rayserve/router.py: a session's verifier
calls to the replica holding its KV (strict), its drafts preferably to the last drafter replica.
Replicas, autoscaling, queues and resources come from the config's `deployments:` section.
"""

from __future__ import annotations

from typing import Any, Mapping

from ray.serve.config import RequestRouterConfig

from specpipe.config import services
from specpipe.core.errors import InvalidArgument
from specpipe.rayserve.deployments import DrafterDeployment, OrchestratorDeployment, VerifierDeployment

ROLES = ("verifier", "drafter", "orchestrator")
ROUTER = "specpipe.rayserve.router:SessionPinRouter"
CONFIGS = {"verifier": services.verifier_config, "drafter": services.drafter_config,
           "orchestrator": lambda values: services.orchestrator_config(values, drafter_service=True)}


def role_config(role: str, settings: Mapping[str, Any] | None) -> Any:
    """The role's config from its settings (checked: an unknown key is an error, not a silent default)."""
    settings = dict(settings or {})
    services.check_settings(role, settings)
    return CONFIGS[role](settings)


def build_app(args: dict[str, Any]) -> Any:
    """Serve application builder; args: {role: settings} (deploy/ray/serve.yaml)."""
    unknown = set(args) - set(ROLES)
    if unknown:
        raise InvalidArgument(f"unknown application args {sorted(unknown)}; expected {', '.join(ROLES)}")
    configs = {role: role_config(role, args.get(role)) for role in ROLES}  # bad settings fail the deploy here
    # @serve.deployment makes the classes Deployments (options, bind), which Ray's types do not say;
    # RequestRouterConfig takes the router's import path, which its types do not say either.
    verifier = VerifierDeployment.options(request_router_config=RequestRouterConfig(  # type: ignore[attr-defined]
        request_router_class=ROUTER, request_router_kwargs={"strict": True}))  # type: ignore[arg-type]
    drafter = DrafterDeployment.options(request_router_config=RequestRouterConfig(  # type: ignore[attr-defined]
        request_router_class=ROUTER, request_router_kwargs={"strict": False}))  # type: ignore[arg-type]
    return OrchestratorDeployment.bind(  # type: ignore[attr-defined]
        verifier.bind(configs["verifier"]), drafter.bind(configs["drafter"]), configs["orchestrator"])
