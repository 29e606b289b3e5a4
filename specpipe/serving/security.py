"""Transport security of every service (docs/security.md): TLS or mutual TLS on the gRPC ports, and
a bearer token on the public Generation API, checked in a server interceptor.

One set of files per process: --tls-cert / --tls-key are its identity (the certificate it serves and,
for mTLS, the one it presents to its peers); --tls-ca is the CA its peers' certificates must chain to
(a server given one requires client certificates: mutual TLS).
"""

from __future__ import annotations

import hmac
import pathlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from specpipe.config.services import TlsFiles
from specpipe.core.errors import InvalidArgument

AUTHORIZATION = "authorization"  # gRPC metadata key (lower case): "Bearer <token>"


@dataclass(frozen=True)
class Tls:
    cert: bytes | None = None  # PEM certificate chain of this process
    key: bytes | None = None   # PEM private key of cert
    ca: bytes | None = None    # PEM CA certificates that peers must chain to
    client_certs: bool = True  # a server with a CA requires client certificates (mTLS); the public API: False
    server_name: str | None = None  # the name a server's certificate must carry, where it is not the address
                                    # dialled (replicas of a DNS name are dialled by IP: specpipe.serving.replicas)

    @staticmethod
    def from_files(cert: str | None, key: str | None, ca: str | None) -> Tls | None:
        """None when no file is given (plaintext); cert and key go together."""
        if not (cert or key or ca):
            return None
        if bool(cert) != bool(key):
            raise InvalidArgument("give --tls-cert and --tls-key together")
        return Tls(read_file(cert), read_file(key), read_file(ca))

    @staticmethod
    def of(files: TlsFiles | None) -> Tls | None:
        return None if files is None else Tls.from_files(files.cert, files.key, files.ca)

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert is None:
            raise InvalidArgument("a TLS server needs --tls-cert and --tls-key")
        mutual = self.ca is not None and self.client_certs
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca if mutual else None,
                                           require_client_auth=mutual)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Verify the server against ca (None: the system roots); present cert if any (mTLS)."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


def read_file(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as err:
        raise InvalidArgument(f"cannot read {path}: {err.strerror}") from None


def read_token(path: str | None) -> str | None:
    """The bearer token in a file (surrounding whitespace dropped); None without a file."""
    data = read_file(path)
    if data is None:
        return None
    token = data.decode("utf-8", "replace").strip()
    if not token:
        raise InvalidArgument(f"the token file {path} is empty")
    return token


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return ((AUTHORIZATION, f"Bearer {token}"),) if token else ()


def token_matches(metadata: Iterable[tuple[str, Any]] | None, token: str) -> bool:
    """Whether the call's metadata carries exactly one authorization entry with the token (constant time)."""
    values = [value for key, value in metadata or () if key == AUTHORIZATION]
    if len(values) != 1 or not isinstance(values[0], str):
        return False
    return hmac.compare_digest(values[0].encode(), f"Bearer {token}".encode())


class TokenAuth(grpc.ServerInterceptor):
    """UNAUTHENTICATED for a call to one of services without the bearer token; other services
    (health, reflection) stay open, so probes need no secret."""

    def __init__(self, token: str, services: tuple[str, ...]):
        self._token = token
        self._prefixes = tuple(f"/{name}/" for name in services)

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self._prefixes):
            return handler
        if token_matches(handler_call_details.invocation_metadata, self._token):
            return handler
        return _refusal(handler)


def _refusal(handler):
    def refuse(request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (metadata authorization: "
                      "Bearer <token>)")

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, handler.request_deserializer, handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(refuse, handler.request_deserializer, handler.response_serializer)
