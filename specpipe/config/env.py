"""The SPECPIPE_* environment, read in this one place (docs/cli.md, "Environment").

Each variable is the default of a flag or a path setting; a flag given on the command line wins.
Read when asked (environment()), not at import, so a process that sets a variable before building
its parser or loading a model sees it."""

from __future__ import annotations

import os
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from specpipe.core.errors import InvalidArgument


def _variable(name: str, what: str) -> Any:
    """A field read from the environment variable name."""
    return field(metadata={"variable": name, "what": what})


@dataclass(frozen=True)
class Environment:
    preset: str | None = _variable("SPECPIPE_PRESET", "the default --preset")
    cache: str | None = _variable("SPECPIPE_CACHE", "the default --cache (an n-gram store URL)")
    verifier_addr: str | None = _variable("SPECPIPE_VERIFIER_ADDR", "an orchestrator's verifier replicas")
    drafter_addr: str | None = _variable("SPECPIPE_DRAFTER_ADDR", "an orchestrator's drafter replicas")
    host: str | None = _variable("SPECPIPE_HOST", "the address a service binds")
    health_port: int | None = _variable("SPECPIPE_HEALTH_PORT", "a service's plaintext health-only port")
    drain_timeout_s: float | None = _variable("SPECPIPE_DRAIN_TIMEOUT", "seconds a stopping service drains")
    tls_cert: str | None = _variable("SPECPIPE_TLS_CERT", "a PEM certificate (docs/security.md)")
    tls_key: str | None = _variable("SPECPIPE_TLS_KEY", "its private key")
    tls_ca: str | None = _variable("SPECPIPE_TLS_CA", "the CA peers chain to")
    auth_token_file: str | None = _variable("SPECPIPE_AUTH_TOKEN_FILE", "the public API's bearer token")
    max_new_tokens: int | None = _variable("SPECPIPE_MAX_NEW_TOKENS", "the load test's default answer length")
    home: Path = _variable("SPECPIPE_HOME", "prepared models, kernels, prompt packages")
    kernels: Path | None = _variable("SPECPIPE_KERNELS", "where the packed GEMM kernel is cached")


VARIABLES = {f.metadata["variable"]: f.name for f in fields(Environment)}  # SPECPIPE_X -> Environment field
_KINDS = {"health_port": int, "drain_timeout_s": float, "max_new_tokens": int}  # the rest: text (or a path)


def _number(name: str, kind: type) -> Any:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return kind(value)
    except ValueError:
        raise InvalidArgument(f"{name}={value!r} is not a {kind.__name__}") from None


def _read(f: Field[Any]) -> Any:
    name = f.metadata["variable"]
    if f.name in _KINDS:
        return _number(name, _KINDS[f.name])
    value = os.environ.get(name) or None
    if f.name == "home":
        return Path(value or Path.home() / ".cache" / "specpipe")
    return Path(value) if value is not None and f.name == "kernels" else value


def environment() -> Environment:
    return Environment(**{f.name: _read(f) for f in fields(Environment)})


def variable_value(variable: str) -> Any:
    """The value of one SPECPIPE_* variable (None where unset), as Environment reads it."""
    return getattr(environment(), VARIABLES[variable])
