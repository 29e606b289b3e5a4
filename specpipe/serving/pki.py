"""A private CA and one certificate per service, for `specpipe up --tls` and tests: every
certificate is valid for the loopback names, as a server (TLS) and as a client (mTLS). Keys are
ECDSA P-256, written 0600. Production issues its own (cert-manager, docs/security.md)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
from dataclasses import dataclass
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK = ("localhost", "127.0.0.1", "::1")
VALID_DAYS = 30


@dataclass(frozen=True)
class Issued:
    cert: str  # path of the PEM certificate
    key: str   # path of the PEM private key


@dataclass(frozen=True)
class Pki:
    ca: str                      # path of the CA certificate (PEM)
    issued: dict[str, Issued]    # service name -> its certificate and key


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "specpipe"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _certificate(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
                 signing_key: ec.EllipticCurvePrivateKey, ca: bool,
                 hosts: Sequence[str] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                        critical=True)
    else:
        builder = builder.add_extension(_san(hosts), critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _write(path: pathlib.Path, data: bytes, private: bool = False) -> str:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)
    return str(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_pki(directory: str | os.PathLike, services: Sequence[str], hosts: Sequence[str] = LOOPBACK) -> Pki:
    """A fresh CA in directory and, for each service, a certificate for hosts signed by it."""
    root = pathlib.Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("specpipe private CA")
    ca_cert = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)
    ca_path = _write(root / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM))
    issued = {}
    for service in services:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(_name(service), ca_name, key.public_key(), ca_key, ca=False, hosts=hosts)
        issued[service] = Issued(_write(root / f"{service}.pem", cert.public_bytes(serialization.Encoding.PEM)),
                                 _write(root / f"{service}.key", _key_pem(key), private=True))
    return Pki(ca_path, issued)
