"""Tenants: who a generation is for, so that one tenant's outputs never draft for another.

A tenant id comes with a public Generate call as gRPC request metadata (TENANT_METADATA, default
DEFAULT_TENANT: one tenant); the orchestrator carries it into its session ids and into every n-gram
store call, where it names the learned store (docs/security.md). Tenant ids become Redis key parts,
so they are short and plain.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from specpipe.core.errors import InvalidArgument

TENANT_METADATA = "x-specpipe-tenant"  # gRPC metadata keys are lower case
DEFAULT_TENANT = ""
MAX_TENANT_CHARS = 64
_TENANT_RE = re.compile(r"[A-Za-z0-9._-]*")


def check_tenant(tenant: str) -> None:
    if len(tenant) > MAX_TENANT_CHARS or not _TENANT_RE.fullmatch(tenant):
        raise InvalidArgument(f"tenant id {tenant[:80]!r} is not valid: at most {MAX_TENANT_CHARS} characters "
                              "of A-Z a-z 0-9 . _ -")


def tenant_from_metadata(metadata: Iterable[tuple[str, Any]] | None) -> str:
    """The tenant of a call's invocation metadata ((key, value) pairs); the default tenant if none."""
    values = [value for key, value in metadata or () if key == TENANT_METADATA]
    if len(values) > 1:
        raise InvalidArgument(f"give at most one {TENANT_METADATA} metadata entry, got {len(values)}")
    tenant = values[0] if values else DEFAULT_TENANT
    if not isinstance(tenant, str):
        raise InvalidArgument(f"{TENANT_METADATA} must be text")
    check_tenant(tenant)
    return tenant


def session_prefix(tenant: str) -> str:
    """What a tenant's session ids start with (the default tenant's: nothing, as before tenants)."""
    return f"{tenant}/" if tenant else ""


def salted_tenant(tenant: str, salt: str) -> str:
    """The tenant of requests that carry a salt (vLLM's cache_salt): what they learn drafts only for
    requests with the same tenant and salt. A plain id: the salt never reaches a key in clear."""
    digest = hashlib.sha256(f"{tenant}\0{salt}".encode()).hexdigest()[:32]
    return f"salt-{digest}"
