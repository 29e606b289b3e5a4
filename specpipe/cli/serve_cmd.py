"""`specpipe serve verifier|drafter|orchestrator|cache`: one service in this process (what a container runs).

Prints one line once the service is SERVING:
    specpipe serve verifier: listening on 127.0.0.1:50052 (metrics port 50152)
"""

from __future__ import annotations

import argparse
import os
import sys

from specpipe.app.topology import READY_LINE
from specpipe.cli import options, security_args
from specpipe.config.env import environment

DEFAULT_PORTS = {"orchestrator": 50051, "verifier": 50052, "drafter": 50053, "cache": 50054}
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
    env = environment()
    for role in DEFAULT_PORTS:
        sub = roles.add_parser(role, help=HELP[role], description=HELP[role])
        _add_server_args(sub, DEFAULT_PORTS[role])
        if role != "cache":
            options.add_model_args(sub)
        if role in ("drafter", "cache"):
            sub.add_argument("--cache", default=env.cache if role == "drafter" else "memory",
                             metavar="URL", help="n-gram store: memory, redis://..., rediss://... or grpc://host:port. "
                             "A drafter given one also serves the ngram and hybrid draft methods; it must be the "
                             "store the orchestrator feeds (default: %(default)s; env SPECPIPE_CACHE)"
                             if role == "drafter" else "the store to serve (default: %(default)s)")
        if role == "orchestrator":
            group = sub.add_argument_group("peers")
            group.add_argument("--verifier-addr", default=env.verifier_addr,
                               help="the verifier replicas: host:port, a comma list, or dns:///name:port (a headless "
                               "Service, re-resolved as replicas come and go) (required; env SPECPIPE_VERIFIER_ADDR)")
            group.add_argument("--drafter-addr", default=env.drafter_addr,
                               help="the drafter replicas, same forms as --verifier-addr (env SPECPIPE_DRAFTER_ADDR); "
                               "without it only --drafter none works")
            group.add_argument("--rpc-timeout", type=float, default=60.0, metavar="S",
                               help="deadline of each verifier / drafter call in seconds; a Prefill has the client's deadline "
                               "only (its time grows with the prompt and the load) (default: %(default)s)")
            group.add_argument("--http-port", type=int, default=None, metavar="PORT",
                               help="also serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
                               "/v1/models, /health) on this port, with the same TLS files and token; 0 = a free one "
                               "(default: off; docs/http-api.md)")
            group.add_argument("--connect-timeout", type=float, default=600.0, metavar="S",
                               help="how long to wait at start for the verifier (loading its model) "
                               "(default: %(default)s)")
            options.add_hop_delay_arg(group)
            options.add_speculation_args(sub)  # by --drafter-addr
            security_args.add_learn_global_arg(sub)
            security_args.add_http_limit_args(sub)
        if role in ("verifier", "orchestrator"):
            options.add_admission_args(sub, role)
        security_args.add_limit_args(sub)
        security_args.add_tls_args(sub, role)
        if role in ("verifier", "drafter"):
            security_args.add_session_ttl_arg(sub)
        sub.set_defaults(func=run)


def _add_server_args(parser: argparse.ArgumentParser, default_port: int) -> None:
    env = environment()
    group = parser.add_argument_group("server")
    group.add_argument("--host", default=env.host or "127.0.0.1",
                       help="address to bind; 0.0.0.0 in a container (default: %(default)s; env SPECPIPE_HOST)")
    group.add_argument("--port", type=int, default=default_port, help="gRPC port; 0 = a free one (default: %(default)s)")
    group.add_argument("--metrics-port", type=int, default=None,
                       help="Prometheus HTTP port; 0 = a free one (default: off)")
    group.add_argument("--health-port", type=int, default=env.health_port,
                       help="also serve the health service alone here, in plaintext, for probes that speak no "
                       "TLS (Kubernetes' gRPC probes); 0 = a free one (default: off; env SPECPIPE_HEALTH_PORT)")
    group.add_argument("--max-workers", type=int, default=64, help="concurrent RPCs; each Generate stream holds one (default: %(default)s)")
    group.add_argument("--drain-timeout", type=float, default=30.0 if env.drain_timeout_s is None else env.drain_timeout_s,
                       metavar="S", help="on SIGTERM: health NOT_SERVING, new sessions refused, running calls "
                       "get this long to finish (default: %(default)s; env SPECPIPE_DRAIN_TIMEOUT)")
    group.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                       type=str.upper, help="(default: %(default)s)")
    group.add_argument("--log-format", default="json", choices=("json", "text"), help="(default: %(default)s)")


CONFIGS = {"verifier": "verifier_config", "drafter": "drafter_config", "orchestrator": "orchestrator_config",
           "cache": "cache_config"}  # specpipe.config.services: each role's config from its flags


def run(args: argparse.Namespace) -> int:
    from specpipe.app import services
    from specpipe.config import services as configs
    from specpipe.engine.cores import set_threads
    from specpipe.runtime import logs
    from specpipe.serving.security import read_token
    from specpipe.serving.server import ServerConfig, serve

    config = getattr(configs, CONFIGS[args.role])(vars(args))
    if args.role == "orchestrator":
        config.check_peers()  # before anything heavy
    logs.configure(args.log_level, json=args.log_format == "json")
    set_threads(getattr(args, "threads", 0))
    token = read_token(getattr(args, "auth_token_file", None))
    http_port = getattr(args, "http_port", None)
    if args.role == "orchestrator":
        parts = services.orchestrator_parts(config)  # one generator and admission for both APIs
        service = services.orchestrator_service(config, parts)
    else:
        service = getattr(services, f"{args.role}_service")(config)
    handle = serve([service], ServerConfig(
        host=args.host, port=args.port, metrics_port=args.metrics_port, max_workers=options.worker_threads(args),
        max_request_bytes=config.limits.max_request_bytes, tls=security_args.server_tls(args, args.role),
        reflection=args.reflection, auth_token=token, drain_timeout_s=args.drain_timeout, health_port=args.health_port,
    ))
    http = None
    if http_port is not None:
        from specpipe.config.services import tls_files
        from specpipe.serving.http import HttpServer

        app = services.openai_app(parts, token, config, lambda: handle.draining)
        http = HttpServer(app, args.host, http_port, tls_files(vars(args)), config.http)
    metrics = handle.metrics_port if handle.metrics_port is not None else "off"
    print(READY_LINE.format(role=args.role, address=handle.address, metrics=metrics)
          + (f" and {http.url}" if http else ""), flush=True)
    handle.wait()
    if http is not None:
        http.stop()
    exit_now(0)


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown: after a graceful stop nothing is left to clean up,
    and tearing down torch / transformers modules takes seconds that a terminating pod waits for."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
