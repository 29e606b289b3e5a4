"""Start the application of a Serve config on the Ray this process is connected to: what
`serve run CONFIG` does (proxies with the config's http / gRPC options, then the applications),
then wait until every application is RUNNING. Used by `specpipe serve-ray` and the tests."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from ray import serve
from ray.serve._private import api as serve_api
from ray.serve.config import gRPCOptions
from ray.serve.schema import ServeDeploySchema

from specpipe.core.errors import DeadlineExceeded, FailedPrecondition

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "ray" / "serve.yaml"  # a checkout's


def load_config(path: Path | str = CONFIG) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def start(config: dict, timeout_s: float = 300.0) -> ServeDeploySchema:
    """Deploy config (a Serve config as a dict) and block until it runs; raises if a deploy fails."""
    schema = ServeDeploySchema.model_validate(config)
    client = serve_api.serve_start(
        http_options=schema.http_options.model_dump(),
        grpc_options=gRPCOptions(**schema.grpc_options.model_dump()),
        proxy_location=schema.proxy_location,
    )
    client.deploy_apps(schema, _blocking=False)
    wait_running([app.name for app in schema.applications], timeout_s)
    return schema


def wait_running(names: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        apps = serve.status().applications
        states = {name: apps[name].status if name in apps else "NOT_STARTED" for name in names}
        failed = {name: apps[name].message for name, state in states.items() if state == "DEPLOY_FAILED"}
        if failed:
            raise FailedPrecondition(f"Ray Serve deploy failed: {failed}")
        if all(state == "RUNNING" for state in states.values()):
            return
        if time.monotonic() > deadline:
            raise DeadlineExceeded(f"Ray Serve applications not running after {timeout_s:g} s: {states}")
        time.sleep(0.5)
