"""`specpipe serve-ray [--config deploy/ray/serve.yaml]`: the Ray Serve application
(specpipe.rayserve) on a local Ray (or --address, a running cluster), until SIGTERM / SIGINT. Needs
the ray extra. Prints one line once it is RUNNING:
    specpipe serve-ray: listening on 127.0.0.1:9000 (Serve gRPC proxy, applications: specpipe)
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from specpipe.core.errors import FailedPrecondition


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve-ray", help="run the verifier, drafter and orchestrator as a Ray Serve application",
        description="Run the Ray Serve application of a Serve config (deploy/ray/serve.yaml: deployments, "
        "autoscaling, resources, each role's flags) on a local Ray, the public Generation API on Serve's "
        "gRPC proxy. Stops (and shuts Ray down) on SIGTERM / SIGINT.")
    parser.add_argument("--config", default=None,
                        help="Serve config (default: deploy/ray/serve.yaml under the working directory)")
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start a local Ray)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    parser.add_argument("--num-gpus", type=int, default=None, help="GPUs of the local Ray (default: all)")
    parser.add_argument("--grpc-port", type=int, default=None, help="gRPC proxy port (default: the config's)")
    parser.set_defaults(func=run)


DEFAULT_CONFIG = Path("deploy") / "ray" / "serve.yaml"


def config_path(given: str | None) -> Path:
    """--config, else deploy/ray/serve.yaml under the working directory (a checkout's)."""
    if given:
        return Path(given)
    if not DEFAULT_CONFIG.is_file():
        raise FailedPrecondition(f"no {DEFAULT_CONFIG} here: give --config (a Serve config such as the "
                                 "repository's deploy/ray/serve.yaml)")
    return DEFAULT_CONFIG


def run(args: argparse.Namespace) -> int:
    path = config_path(args.config)
    try:
        import ray
        from ray import serve
    except ImportError:
        raise FailedPrecondition("serve-ray needs Ray Serve: pip install -e '.[ray]'") from None
    from specpipe.rayserve import launch

    config = launch.load_config(path)
    if args.grpc_port is not None:
        config.setdefault("grpc_options", {})["port"] = args.grpc_port
    resources = {} if args.address else {"num_cpus": args.num_cpus, "num_gpus": args.num_gpus}
    ray.init(address=args.address, include_dashboard=False, **resources)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        schema = launch.start(config)
        host = schema.http_options.host or "0.0.0.0"
        names = ", ".join(app.name for app in schema.applications)
        print(f"specpipe serve-ray: listening on {host}:{schema.grpc_options.port} "
              f"(Serve gRPC proxy, applications: {names})", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
