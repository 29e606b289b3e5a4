"""The SPECPIPE_* environment, read in this one place (docs/cli.md, "Environment").

Each variable is the default of a flag or a path setting; a flag given on the command line wins.
Read when asked (environment()), not at import, so a process that sets a variable before building
its parser or loading a model sees it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specpipe.core.errors import InvalidArgument


@dataclass(frozen=True)
class Environment:
    preset: str | None              # SPECPIPE_PRESET: the default --preset
    cache: str | None               # SPECPIPE_CACHE: the default --cache (an n-gram store URL)
    verifier_addr: str | None       # SPECPIPE_VERIFIER_ADDR: an orchestrator's verifier replicas
    drafter_addr: str | None        # SPECPIPE_DRAFTER_ADDR: its drafter replicas
    host: str | None                # SPECPIPE_HOST: the address a service binds
    health_port: int | None         # SPECPIPE_HEALTH_PORT: a plaintext health-only port
    drain_timeout_s: float | None   # SPECPIPE_DRAIN_TIMEOUT: seconds a stopping service drains
    tls_cert: str | None            # SPECPIPE_TLS_CERT / _KEY / _CA: PEM files (docs/security.md)
    tls_key: str | None
    tls_ca: str | None
    auth_token_file: str | None     # SPECPIPE_AUTH_TOKEN_FILE: the public API's bearer token
    max_new_tokens: int | None      # SPECPIPE_MAX_NEW_TOKENS: the load test's default answer length
    home: Path                      # SPECPIPE_HOME: prepared models, kernels, prompt packages
    kernels: Path | None            # SPECPIPE_KERNELS: where the packed GEMM kernel is cached


def _number(name: str, kind):
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return kind(value)
    except ValueError:
        raise InvalidArgument(f"{name}={value!r} is not a {kind.__name__}") from None


def environment() -> Environment:
    get = os.environ.get
    return Environment(
        preset=get("SPECPIPE_PRESET") or None, cache=get("SPECPIPE_CACHE") or None,
        verifier_addr=get("SPECPIPE_VERIFIER_ADDR") or None, drafter_addr=get("SPECPIPE_DRAFTER_ADDR") or None,
        host=get("SPECPIPE_HOST") or None, health_port=_number("SPECPIPE_HEALTH_PORT", int),
        drain_timeout_s=_number("SPECPIPE_DRAIN_TIMEOUT", float),
        tls_cert=get("SPECPIPE_TLS_CERT") or None, tls_key=get("SPECPIPE_TLS_KEY") or None,
        tls_ca=get("SPECPIPE_TLS_CA") or None, auth_token_file=get("SPECPIPE_AUTH_TOKEN_FILE") or None,
        max_new_tokens=_number("SPECPIPE_MAX_NEW_TOKENS", int),
        home=Path(get("SPECPIPE_HOME") or Path.home() / ".cache" / "specpipe"),
        kernels=Path(get("SPECPIPE_KERNELS")) if get("SPECPIPE_KERNELS") else None,
    )
