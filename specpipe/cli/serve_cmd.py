"""`specpipe serve verifier|drafter|orchestrator|cache`: one service in this process (what a container runs).

Prints one line once the service is SERVING:
    specpipe serve verifier: listening on 127.0.0.1:50052 (metrics port 50152)
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from specpipe.cli import options, security_args
from specpipe.errors import InvalidArgument

DEFAULT_PORTS = {"orchestrator": 50051, "verifier": 50052, "drafter": 50053, "cache": 50054}
READY_RE = re.compile(r"^specpipe serve (\w+): listening on (\S+):(\d+) \(metrics port (\d+|off)\)$")
HELP = {
    "verifier": "the large model: prefill, verify drafts (tree attention), per-session KV cache",
    "drafter": "the small model: propose draft chains / trees",
    "orchestrator": "the public Generation API, driving a remote verifier and drafter",
    "cache": "the n-gram store over gRPC (in this process's memory, or fronting Redis)",
}


def register(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="run one service over gRPC (health, reflection, metrics)",
                                   description="Run one service over gRPC, with the standard health service, "
                                   "reflection and Prometheus metrics. Stops gracefully on SIGTERM / SIGINT.")
    roles = parser.add_subparsers(dest="role", required=True, metavar="ROLE")
    for role in DEFAULT_PORTS:
        sub = roles.add_parser(role, help=HELP[role], description=HELP[role])
        _add_server_args(sub, DEFAULT_PORTS[role])
        if role != "cache":
            options.add_model_args(sub)
        if role in ("drafter", "cache"):
            sub.add_argument("--cache", default=os.environ.get("SPECPIPE_CACHE") if role == "drafter" else "memory",
                             metavar="URL", help="n-gram store: memory, redis://..., rediss://... or grpc://host:port. "
                             "A drafter given one also serves the ngram and hybrid draft methods; it must be the "
                             "store the orchestrator feeds (default: %(default)s; env SPECPIPE_CACHE)"
                             if role == "drafter" else "the store to serve (default: %(default)s)")
        if role == "orchestrator":
            group = sub.add_argument_group("peers")
            group.add_argument("--verifier-addr", default=os.environ.get("SPECPIPE_VERIFIER_ADDR"),
                               help="the verifier replicas: host:port, a comma list, or dns:///name:port (a headless "
                               "Service, re-resolved as replicas come and go) (required; env SPECPIPE_VERIFIER_ADDR)")
            group.add_argument("--drafter-addr", default=os.environ.get("SPECPIPE_DRAFTER_ADDR"),
                               help="the drafter replicas, same forms as --verifier-addr (env SPECPIPE_DRAFTER_ADDR); "
                               "without it only --drafter none works")
            group.add_argument("--rpc-timeout", type=float, default=60.0, metavar="S",
                               help="deadline of each verifier / drafter call in seconds; a Prefill has the client's deadline "
                               "only (its time grows with the prompt and the load) (default: %(default)s)")
            group.add_argument("--connect-timeout", type=float, default=600.0, metavar="S",
                               help="how long to wait at start for the verifier (loading its model) "
                               "(default: %(default)s)")
            options.add_hop_delay_arg(group)
            options.add_speculation_args(sub, drafter=None)  # by --drafter-addr
            security_args.add_learn_global_arg(sub)
        if role in ("verifier", "orchestrator"):
            options.add_admission_args(sub, role)
        security_args.add_limit_args(sub)
        security_args.add_tls_args(sub, role)
        if role in ("verifier", "drafter"):
            security_args.add_session_ttl_arg(sub)
        sub.set_defaults(func=run)


def _add_server_args(parser: argparse.ArgumentParser, default_port: int) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--host", default=os.environ.get("SPECPIPE_HOST", "127.0.0.1"),
                       help="address to bind; 0.0.0.0 in a container (default: %(default)s; env SPECPIPE_HOST)")
    group.add_argument("--port", type=int, default=default_port, help="gRPC port; 0 = a free one (default: %(default)s)")
    group.add_argument("--metrics-port", type=int, default=None,
                       help="Prometheus HTTP port; 0 = a free one (default: off)")
    group.add_argument("--health-port", type=int, default=_env_int("SPECPIPE_HEALTH_PORT"),
                       help="also serve the health service alone here, in plaintext, for probes that speak no "
                       "TLS (Kubernetes' gRPC probes); 0 = a free one (default: off; env SPECPIPE_HEALTH_PORT)")
    group.add_argument("--max-workers", type=int, default=64, help="concurrent RPCs; each Generate stream holds one (default: %(default)s)")
    group.add_argument("--drain-timeout", type=float, default=float(os.environ.get("SPECPIPE_DRAIN_TIMEOUT", 30)),
                       metavar="S", help="on SIGTERM: health NOT_SERVING, new sessions refused, running calls "
                       "get this long to finish (default: %(default)s; env SPECPIPE_DRAIN_TIMEOUT)")
    group.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                       type=str.upper, help="(default: %(default)s)")
    group.add_argument("--log-format", default="json", choices=("json", "text"), help="(default: %(default)s)")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def _verifier(args: argparse.Namespace):
    from verifier_service.servicer import service
    from specpipe.cli.wiring import load_verifier

    return service(load_verifier(args))


def _drafter(args: argparse.Namespace):
    from drafter_service.servicer import service
    from specpipe.cli.wiring import drafter_methods

    return service(drafter_methods(args), security_args.limits(args))


def _cache(args: argparse.Namespace):
    from cache_service.servicer import service
    from specpipe.cli.wiring import ngram_cache

    return service(ngram_cache(args.cache, security_args.tls(args)), security_args.limits(args))


def _orchestrator(args: argparse.Namespace):
    from orchestrator.admission import Admission, AdmissionConfig
    from orchestrator.servicer import service
    from specpipe.cli.wiring import remote_generator
    from specpipe.presets import model_specs

    tokenizer_spec = model_specs(args.preset, args.verifier, args.draft_model)[0]
    generator = remote_generator(tokenizer_spec, args.verifier_addr, args.drafter_addr,
                                 options.speculation_options(args), cache_url=args.cache,
                                 rpc_timeout_s=args.rpc_timeout or None, connect_timeout_s=args.connect_timeout,
                                 hop_delay_ms=args.hop_delay_ms, limits=security_args.limits(args),
                                 learn_global=args.learn_global == "on", tls=security_args.tls(args))
    return service(generator, Admission(AdmissionConfig(args.max_sessions, args.max_queue)))


BUILDERS = {"verifier": _verifier, "drafter": _drafter, "orchestrator": _orchestrator, "cache": _cache}


def check_peers(args: argparse.Namespace) -> None:
    if not args.verifier_addr:
        raise InvalidArgument("--verifier-addr is required: the orchestrator needs a running verifier service "
                              "(host:port, e.g. from `specpipe serve verifier`)")
    if args.drafter in ("model", "hybrid") and not args.drafter_addr:
        raise InvalidArgument(f"--drafter-addr is required with --drafter {args.drafter}; pass --drafter ngram "
                              "or none to draft without the small model")


def run(args: argparse.Namespace) -> int:
    from specpipe import logs
    from specpipe.rpc.security import read_token
    from specpipe.rpc.server import ServerConfig, serve

    if args.role == "orchestrator":
        check_peers(args)  # before anything heavy
    logs.configure(args.log_level, json=args.log_format == "json")
    options.set_threads(getattr(args, "threads", 0))
    handle = serve([BUILDERS[args.role](args)], ServerConfig(
        host=args.host, port=args.port, metrics_port=args.metrics_port, max_workers=options.worker_threads(args),
        max_request_bytes=security_args.limits(args).max_request_bytes, tls=security_args.server_tls(args, args.role),
        reflection=args.reflection, auth_token=read_token(getattr(args, "auth_token_file", None)),
        drain_timeout_s=args.drain_timeout, health_port=args.health_port,
    ))
    metrics = handle.metrics_port if handle.metrics_port is not None else "off"
    print(f"specpipe serve {args.role}: listening on {handle.address} (metrics port {metrics})", flush=True)
    handle.wait()
    exit_now(0)


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown: after a graceful stop nothing is left to clean up,
    and tearing down torch / transformers modules takes seconds that a terminating pod waits for."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
