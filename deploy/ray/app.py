"""The Ray Serve application: `import_path: deploy.ray.app:build_app` in a Serve config.

    args:                       # each role's flags, as `specpipe serve ROLE` takes them
      verifier: --preset tiny --max-sessions 64
      drafter: --preset tiny
      orchestrator: --preset tiny --schedule branch

The orchestrator is the ingress (Serve's gRPC proxy calls it); it reaches the verifier and the
drafter through DeploymentHandles. Both are routed by deploy/ray/router.py: a session's verifier
calls to the replica holding its KV (strict), its drafts preferably to the last drafter replica.
Replicas, autoscaling, queues and resources come from the config's `deployments:` section.
"""

from __future__ import annotations

import shlex

from ray.serve.config import RequestRouterConfig

from deploy.ray.deployments import DrafterDeployment, OrchestratorDeployment, VerifierDeployment
from specpipe.errors import InvalidArgument

ROLES = ("verifier", "drafter", "orchestrator")
ROUTER = "deploy.ray.router:SessionPinRouter"


def role_args(role: str, flags: str):
    """The Namespace `specpipe serve ROLE FLAGS` would run with (same parser, defaults, checks)."""
    from specpipe.cli.main import build_parser

    try:
        return build_parser().parse_args(["serve", role, *shlex.split(flags)])
    except SystemExit:  # argparse has printed why
        raise InvalidArgument(f"bad {role} flags for the Ray application: {flags!r}") from None


def build_app(args: dict):
    """Serve application builder; args: {role: flags} (deploy/ray/serve.yaml)."""
    unknown = set(args) - set(ROLES)
    if unknown:
        raise InvalidArgument(f"unknown application args {sorted(unknown)}; expected {', '.join(ROLES)}")
    flags = {role: str(args.get(role) or "") for role in ROLES}
    for role in ROLES:
        role_args(role, flags[role])  # bad flags fail the deploy here, before any replica starts
    verifier = VerifierDeployment.options(request_router_config=RequestRouterConfig(
        request_router_class=ROUTER, request_router_kwargs={"strict": True}))
    drafter = DrafterDeployment.options(request_router_config=RequestRouterConfig(
        request_router_class=ROUTER, request_router_kwargs={"strict": False}))
    return OrchestratorDeployment.bind(verifier.bind(flags["verifier"]), drafter.bind(flags["drafter"]),
                                       flags["orchestrator"])
