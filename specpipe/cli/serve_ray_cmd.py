"""`specpipe serve-ray [--config deploy/ray/serve.yaml]`: the Ray Serve application (deploy/ray) on a
local Ray (or --address, a running cluster), until SIGTERM / SIGINT. Needs the ray extra and a
checkout (deploy/ray is not part of the installed package). Prints one line once it is RUNNING:
    specpipe serve-ray: listening on 127.0.0.1:9000 (Serve gRPC proxy, applications: specpipe)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from specpipe.errors import FailedPrecondition


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve-ray", help="run the verifier, drafter and orchestrator as a Ray Serve application",
        description="Run the Ray Serve application of a Serve config (deploy/ray/serve.yaml: deployments, "
        "autoscaling, resources, each role's flags) on a local Ray, the public Generation API on Serve's "
        "gRPC proxy. Stops (and shuts Ray down) on SIGTERM / SIGINT.")
    parser.add_argument("--config", default=None, help="Serve config (default: deploy/ray/serve.yaml of this checkout)")
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start a local Ray)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    parser.add_argument("--num-gpus", type=int, default=None, help="GPUs of the local Ray (default: all)")
    parser.add_argument("--grpc-port", type=int, default=None, help="gRPC proxy port (default: the config's)")
    parser.set_defaults(func=run)


def checkout_root() -> Path:
    """The checkout holding deploy/ray: the working directory, else the one specpipe runs from."""
    import specpipe

    for root in (Path.cwd(), Path(specpipe.__file__).resolve().parents[1]):
        if (root / "deploy" / "ray" / "app.py").is_file():
            return root
    raise FailedPrecondition("serve-ray runs from a specpipe checkout (deploy/ray); run it from the repository root")


def run(args: argparse.Namespace) -> int:
    root = checkout_root()
    sys.path.insert(0, str(root))  # deploy.ray here, and in every Ray worker this Ray starts
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    try:
        import ray
        from ray import serve
    except ImportError:
        raise FailedPrecondition("serve-ray needs Ray Serve: pip install -e '.[ray]'") from None
    from deploy.ray import launch

    config = launch.load_config(args.config or root / "deploy" / "ray" / "serve.yaml")
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
