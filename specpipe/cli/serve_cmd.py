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
from specpipe.config.services import CacheConfig, DrafterConfig, OrchestratorConfig, ServeConfig, VerifierConfig

DEFAULT_PORTS = {"orchestrator": 50051, "verifier": 50052, "drafter": 50053, "cache": 50054}
HELP = {
    "verifier": "the large model: prefill, verify drafts (tree attention), per-session KV cache",
    "drafter": "the small model: propose draft chains / trees",
    "orchestrator": "the public Generation API, driving a remote verifier and drafter",
    "cache": "the n-gram store over gRPC (in this process's memory, or fronting Redis)",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
            options.add_setting(sub, DrafterConfig if role == "drafter" else CacheConfig, "cache")
        if role == "orchestrator":
            group = sub.add_argument_group("peers")
            options.add_settings(group, OrchestratorConfig, "verifier_addr", "drafter_addr", "rpc_timeout")
            options.add_setting(group, ServeConfig, "http_port")
            options.add_setting(group, OrchestratorConfig, "connect_timeout")
            options.add_hop_delay_arg(group)
            options.add_speculation_args(sub)  # by --drafter-addr
            security_args.add_learn_global_arg(sub)
            security_args.add_http_limit_args(sub)
        if role in ("verifier", "orchestrator"):
            options.add_admission_args(sub, role)
        security_args.add_limit_args(sub)
        security_args.add_tls_args(sub, role)
        options.add_tracing_args(sub)
        if role == "orchestrator":
            options.add_setting(sub, OrchestratorConfig, "ttft_slo_ms")
        if role in ("verifier", "drafter"):
            security_args.add_session_ttl_arg(sub)
            group = sub.add_argument_group("simulated device (load tests)")
            options.add_settings(group, VerifierConfig if role == "verifier" else DrafterConfig, "cost_model", "replay")
        sub.set_defaults(func=run)


def _add_server_args(parser: argparse.ArgumentParser, default_port: int) -> None:
    group = parser.add_argument_group("server")
    options.add_setting(group, ServeConfig, "host")
    options.add_setting(group, ServeConfig, "port", default=default_port)
    options.add_settings(group, ServeConfig, "metrics_port", "health_port", "max_workers", "drain_timeout")
    options.add_setting(group, ServeConfig, "log_level", type=str.upper)
    options.add_setting(group, ServeConfig, "log_format")


CONFIGS = {"verifier": "verifier_config", "drafter": "drafter_config", "orchestrator": "orchestrator_config",
           "cache": "cache_config"}  # specpipe.config.services: each role's config from its flags


def run(args: argparse.Namespace) -> None:
    from specpipe.app import startup
    from specpipe.config import services as configs
    from specpipe.runtime import logs, tracing
    from specpipe.runtime.lifecycle import freeze_startup_heap

    config = getattr(configs, CONFIGS[args.role])(vars(args))
    if args.role == "orchestrator":
        config.check_peers()  # before anything heavy
    server = configs.serve_config(vars(args))
    logs.configure(server.log_level, json=server.log_format == "json")
    tracing.configure(config.tracing, args.role)  # before any channel or server is made: they carry it
    with startup.step(startup.IMPORTS):
        from specpipe.app import services
        from specpipe.engine.cores import set_threads
        from specpipe.serving.security import read_token
        from specpipe.serving.server import ServerConfig, serve
    set_threads(getattr(args, "threads", 0))
    token = read_token(server.auth_token_file)
    if args.role == "orchestrator":
        parts = services.orchestrator_parts(config)  # one generator and admission for both APIs
        service = services.orchestrator_service(config, parts)
    else:
        service = getattr(services, f"{args.role}_service")(config)
    handle = serve([service], ServerConfig(
        host=server.host, port=server.port, metrics_port=server.metrics_port, max_workers=options.worker_threads(args),
        max_request_bytes=config.limits.max_request_bytes, tls=security_args.server_tls(args, args.role),
        reflection=server.reflection, auth_token=token, drain_timeout_s=server.drain_timeout_s,
        health_port=server.health_port,
    ))
    http = None
    if server.http_port is not None:
        from specpipe.serving.http import HttpServer

        app = services.openai_app(parts, token, config, lambda: handle.draining)
        http = HttpServer(app, server.host, server.http_port, configs.tls_files(vars(args)), config.http)
    freeze_startup_heap()
    metrics = handle.metrics_port if handle.metrics_port is not None else "off"
    print(READY_LINE.format(role=args.role, address=handle.address, metrics=metrics)
          + (f" and {http.url}" if http else ""), flush=True)
    handle.wait()
    if http is not None:
        http.stop()
    tracing.shutdown()  # the spans still buffered: exit_now skips the interpreter's exit hooks
    exit_now(0)


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown: after a graceful stop nothing is left to clean up,
    and tearing down torch / transformers modules takes seconds that a terminating pod waits for."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
