"""Flags of the hardening settings (docs/security.md): input caps, one flag per specpipe.config.limits.Limits
field (--limit-prompt-tokens for max_prompt_tokens, ...), the HTTP API's bounds on its clients
(HttpLimits: --http-header-timeout, ...), the session TTL of the verifier and the drafter, the learned
store's learning, and TLS / mTLS, reflection and the bearer token."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from specpipe.cli.options import add_setting
from specpipe.config.limits import HTTP_PREFIX, LIMIT_PREFIX, HttpLimits, Limits
from specpipe.config.services import TLS_PREFIX, OrchestratorConfig, ServeConfig, TlsFiles, VerifierConfig, tls_files
from specpipe.core.settings import settings_of
from specpipe.serving.security import Tls, read_token


def flag(field_name: str) -> str:
    return "--limit-" + field_name.removeprefix("max_").replace("_", "-")


def add_limit_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("input caps (beyond one: INVALID_ARGUMENT before any work)")
    for f in fields(Limits):
        add_setting(group, Limits, f.name, flag=flag(f.name), prefix=LIMIT_PREFIX, metavar="N")


def http_flag(key: str) -> str:
    return "--http-" + key.replace("_", "-")


def add_http_limit_args(parser: argparse.ArgumentParser) -> None:
    """--http-header-timeout, --http-body-timeout, --http-request-timeout, --http-max-connections."""
    group = parser.add_argument_group("HTTP API: slow clients and floods (docs/http-api.md)")
    for key in settings_of(HttpLimits):
        add_setting(group, HttpLimits, key, flag=http_flag(key), prefix=HTTP_PREFIX)


def http_limit_flags(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The flags of add_http_limit_args as given (values: the parsed flags; `specpipe up` hands them on)."""
    return tuple(part for key in settings_of(HttpLimits) for part in (http_flag(key), str(values[HTTP_PREFIX + key])))


def limit_flags(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The flags of add_limit_args as given."""
    return tuple(part for f in fields(Limits) for part in (flag(f.name), str(values[LIMIT_PREFIX + f.name])))


def add_session_ttl_arg(parser: argparse.ArgumentParser) -> None:
    add_setting(parser, VerifierConfig, "session_ttl")  # the drafter's is the same setting


def add_learn_global_arg(parser: argparse.ArgumentParser) -> None:
    add_setting(parser, OrchestratorConfig, "learn_global")


CLIENT_HELP = {  # what a file is to a client of the public API (a service's: TlsFiles' settings)
    "ca": ("connect over TLS, trusting the server's certificate if it chains to this CA", "plaintext"),
    "cert": ("client certificate to present (mutual TLS)", ""),
    "key": ("the private key of --tls-cert", ""),
}
def _add_tls_flags(group: argparse._ArgumentGroup, client: bool) -> None:
    """--tls-cert, --tls-key, --tls-ca, with the help of a server or of a client of the public API."""
    for key in ("ca", "cert", "key") if client else ("cert", "key", "ca"):
        overrides = dict(zip(("help", "shown"), CLIENT_HELP[key], strict=True)) if client else {}
        add_setting(group, TlsFiles, key, flag=f"--tls-{key}", prefix=TLS_PREFIX, **overrides)


def _add_token_flag(group: argparse._ArgumentGroup, client: bool) -> None:
    overrides = {"help": "send 'authorization: Bearer <the file's token>'", "shown": ""} if client else {}
    add_setting(group, ServeConfig, "auth_token_file", **overrides)


def add_tls_args(parser: argparse.ArgumentParser, role: str) -> None:
    """TLS of the server (and of its calls to peers), reflection, and the public API's token."""
    group = parser.add_argument_group("transport security (docs/security.md)")
    _add_tls_flags(group, client=False)
    add_setting(group, ServeConfig, "reflection")
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
