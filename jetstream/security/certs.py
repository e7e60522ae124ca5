"""A throwaway certificate authority for development and first deployments: `jetstream dev
--tls` and `jetstream certs`.

Theory of operation: one ECDSA P-256 CA, and leaves it signs, each valid for server and
client authentication (a broker is a server to clients and a client to other brokers and to
NATS) with the host names and addresses given as subject alternative names. Files are PEM:
`ca.pem` (and its key `ca.key`, kept to issue more leaves later), `<name>.pem` and
`<name>.key`; keys are written readable by their owner only. An existing CA in the directory
is reused, so leaves issued on several runs trust one another. Built with `cryptography`
directly (already a dependency for the metadata Raft encryption); nothing here is meant to
replace an organisation's own CA in production.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long issued certificates are valid, and how far back their validity starts (clocks
#: of containers and hosts differ a little).
VALID_DAYS = 825
BACKDATE = datetime.timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class IssuedFiles:
    cert: str
    key: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Jetstream"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


class Authority:
    """The CA of `directory` (created there when absent)."""

    def __init__(self, directory: Path, now: datetime.datetime) -> None:
        self.directory = directory
        self.now = now
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_path = directory / "ca.pem"
        key_path = directory / "ca.key"
        if self.ca_path.exists() and key_path.exists():
            self.cert = x509.load_pem_x509_certificate(self.ca_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            assert isinstance(key, ec.EllipticCurvePrivateKey)
            self.key = key
            return
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = _name("Jetstream CA")
        self.cert = (x509.CertificateBuilder()
                     .subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number())
                     .not_valid_before(now - BACKDATE)
                     .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0),
                                    critical=True)
                     .add_extension(x509.KeyUsage(
                         digital_signature=True, key_cert_sign=True, crl_sign=True,
                         content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, encipher_only=False,
                         decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        _write_key(key_path, self.key)
        self.ca_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, hosts: Sequence[str]) -> IssuedFiles:
        """Write `<name>.pem` and `<name>.key`: a leaf for `hosts`, server and client."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(_name(name)).issuer_name(self.cert.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(self.now - BACKDATE)
                .not_valid_after(self.now + datetime.timedelta(days=VALID_DAYS))
                .add_extension(_san(hosts), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                               critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_path, key_path = self.directory / f"{name}.pem", self.directory / f"{name}.key"
        _write_key(key_path, key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return IssuedFiles(str(cert_path), str(key_path))


def write_secret(path: Path) -> str:
    """A random secret (a Raft password) in `path`, owner-readable; kept if it exists."""
    if path.exists():
        return path.read_text().strip()
    secret = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def ensure_leaves(directory: Path, leaves: Sequence[tuple[str, Sequence[str]]],
                  secrets_: Sequence[str] = (), *,
                  now: datetime.datetime | None = None) -> dict[str, str]:
    """The CA of `directory` and each leaf (name, hosts) and secret file named, creating
    those that do not exist yet; every path by name ("ca", "<leaf>", "<leaf>_key",
    "<secret>")."""
    authority = Authority(directory, now or datetime.datetime.now(datetime.UTC))
    paths = {"ca": str(authority.ca_path)}
    for name, hosts in leaves:
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        if not (cert.exists() and key.exists()):
            authority.issue(name, hosts)
        paths[name], paths[f"{name}_key"] = str(cert), str(key)
    for name in secrets_:
        write_secret(directory / name)
        paths[name] = str(directory / name)
    return paths
