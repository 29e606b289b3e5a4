"""Flags of the hardening settings (docs/security.md): input caps, one flag per specpipe.config.limits.Limits
field (--limit-prompt-tokens for max_prompt_tokens, ...), the session TTL of the verifier and the
drafter, the learned store's learning, and TLS / mTLS, reflection and the bearer token."""

from __future__ import annotations

import argparse
from dataclasses import fields, replace

from specpipe.config.env import environment
from specpipe.config.limits import DEFAULT_HTTP, DEFAULT_LIMITS, HttpLimits, Limits
from specpipe.config.services import tls_files
from specpipe.serving.security import Tls, read_token

HELP = {
    "max_prompt_tokens": "prompt tokens of a generation or a prefill",
    "max_new_tokens": "max_new_tokens of a generation",
    "max_draft_len": "draft_len (k) a request may ask for",
    "max_width": "tree width a request may ask for",
    "max_hypotheses": "branch-schedule hypotheses a request may ask for",
    "max_stops": "stop strings per generation",
    "max_stop_chars": "characters of one stop string",
    "max_draft_nodes": "nodes of a draft tree sent to the verifier",
    "max_q_entries": "entries of one draft node's sparse q",
    "max_id_chars": "characters of a request id",
    "max_session_id_chars": "characters of a session id",
    "max_prompt_chars": "characters of a text prompt",
    "max_request_bytes": ("bytes of one request: a gRPC message (beyond: RESOURCE_EXHAUSTED) or an HTTP body "
                          "(beyond: 413, a Content-Length over it refused unread)"),
}
HTTP_HELP = {  # specpipe.config.limits.HttpLimits: the OpenAI-compatible API's bounds on its clients
    "header_timeout_s": ("a request's headers must arrive within S seconds of its first byte, else 408 and the "
                         "connection closes"),
    "body_timeout_s": "a request's body must arrive within S seconds of its headers, else 408",
    "request_timeout_s": ("an HTTP request's deadline, as a gRPC client's: its wait for a generation slot and its "
                          "generation end by then"),
    "max_connections": ("open HTTP connections; one more is answered 503 and closed at once, so a flood of "
                        "them leaves the gRPC API its file descriptors"),
}


def flag(field_name: str) -> str:
    return "--limit-" + field_name.removeprefix("max_").replace("_", "-")


def add_limit_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("input caps (beyond one: INVALID_ARGUMENT before any work)")
    for f in fields(Limits):
        group.add_argument(flag(f.name), dest=f"limit_{f.name}", type=int, default=getattr(DEFAULT_LIMITS, f.name),
                           metavar="N", help=f"{HELP[f.name]} (default: %(default)s)")


def add_http_limit_args(parser: argparse.ArgumentParser) -> None:
    """--http-header-timeout, --http-body-timeout, --http-request-timeout, --http-max-connections (0: no bound)."""
    group = parser.add_argument_group("HTTP API: slow clients and floods (docs/http-api.md)")
    for f in fields(HttpLimits):
        group.add_argument("--http-" + f.name.removesuffix("_s").replace("_", "-"), dest=f"http_{f.name}",
                           type=float if f.name.endswith("_s") else int, default=getattr(DEFAULT_HTTP, f.name),
                           metavar="S" if f.name.endswith("_s") else "N",
                           help=f"{HTTP_HELP[f.name]}; 0: no bound (default: %(default)s)")


def http_limit_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags of add_http_limit_args as given (`specpipe up` hands them to its orchestrator)."""
    return tuple(part for f in fields(HttpLimits) for part in
                 ("--http-" + f.name.removesuffix("_s").replace("_", "-"), str(getattr(args, f"http_{f.name}"))))


def limit_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags of add_limit_args as given."""
    return tuple(part for f in fields(Limits) for part in (flag(f.name), str(getattr(args, f"limit_{f.name}"))))


def add_session_ttl_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--session-ttl", type=float, default=600.0, metavar="S",
                        help="a session idle this long is evicted by a background sweeper, its KV cache freed "
                        "(clients that went away without releasing) (default: %(default)s)")


def add_learn_global_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--learn-global", default="on", choices=("off", "on"),
                        help="on: finished outputs feed their tenant's learned store, which drafts for the "
                        "tenant's later requests (one tenant is one trust domain); off: it holds `specpipe "
                        "cache seed` corpora only, so no output ever drafts for another request: for endpoints "
                        "whose users must not learn about each other (default: %(default)s; docs/security.md)")


TLS_HELP = {  # flag -> (server side, client side): what the file is to a service, and to a client of the public API
    "--tls-cert": ("this service's certificate: served over TLS, and presented to peers for mutual TLS "
                   "(env SPECPIPE_TLS_CERT; default: plaintext)",
                   "client certificate to present (mutual TLS) (env SPECPIPE_TLS_CERT)"),
    "--tls-key": ("the private key of --tls-cert (env SPECPIPE_TLS_KEY)",) * 2,
    "--tls-ca": ("CA that peers' certificates must chain to; a server given one requires client certificates "
                 "(mutual TLS) (env SPECPIPE_TLS_CA)",
                 "connect over TLS, trusting the server's certificate if it chains to this CA (env SPECPIPE_TLS_CA; "
                 "default: plaintext)"),
    "--auth-token-file": ("require 'authorization: Bearer <the file's token>' on the Generation API; UNAUTHENTICATED "
                          "otherwise (env SPECPIPE_AUTH_TOKEN_FILE; default: no token)",
                          "send 'authorization: Bearer <the file's token>' (env SPECPIPE_AUTH_TOKEN_FILE)"),
}


def _add_tls_flags(group, client: bool) -> None:
    """--tls-cert, --tls-key, --tls-ca, with the help of a server or of a client of the public API."""
    env = environment()
    defaults = {"--tls-cert": env.tls_cert, "--tls-key": env.tls_key, "--tls-ca": env.tls_ca}
    for flag in ("--tls-ca", "--tls-cert", "--tls-key") if client else ("--tls-cert", "--tls-key", "--tls-ca"):
        group.add_argument(flag, default=defaults[flag], metavar="PEM", help=TLS_HELP[flag][client])


def _add_token_flag(group, client: bool) -> None:
    group.add_argument("--auth-token-file", default=environment().auth_token_file, metavar="FILE",
                       help=TLS_HELP["--auth-token-file"][client])


def add_tls_args(parser: argparse.ArgumentParser, role: str) -> None:
    """TLS of the server (and of its calls to peers), reflection, and the public API's token."""
    group = parser.add_argument_group("transport security (docs/security.md)")
    _add_tls_flags(group, client=False)
    group.add_argument("--reflection", action="store_true", help="serve gRPC reflection (default: off)")
    if role == "orchestrator":
        _add_token_flag(group, client=False)


def add_client_tls_args(parser: argparse.ArgumentParser, applies: str = "") -> None:
    """What a client of the public API brings (docs/security.md): the CA to check the orchestrator's
    certificate by, a client certificate where one is asked for, and the bearer token."""
    group = parser.add_argument_group(f"transport security{applies} (docs/security.md)")
    _add_tls_flags(group, client=True)
    _add_token_flag(group, client=True)


def client_security(args: argparse.Namespace) -> tuple[Tls | None, str | None]:
    """The TLS files and the bearer token of add_client_tls_args' flags."""
    return tls(args), read_token(getattr(args, "auth_token_file", None))


def tls(args: argparse.Namespace) -> Tls | None:
    return Tls.of(tls_files(vars(args)))


def server_tls(args: argparse.Namespace, role: str) -> Tls | None:
    """The server side: mutual TLS between services; the public API (orchestrator) asks no client
    certificate (its clients bring a bearer token), its --tls-ca is for its own calls to peers."""
    files = tls(args)
    return replace(files, client_certs=role != "orchestrator") if files is not None else None
