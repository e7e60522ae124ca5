"""Throwaway certificates for tests (trustme): a CA and leaves written as PEM files."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import trustme

LOOPBACK_NAMES = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Leaf:
    cert: str
    key: str


class Pki:
    """A CA in `directory`; `leaf(name)` issues and writes a certificate signed by it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.authority = trustme.CA()
        self.ca = str(directory / "ca.pem")
        self.authority.cert_pem.write_to_path(self.ca)

    def leaf(self, name: str, *identities: str, not_before: datetime.datetime | None = None,
             not_after: datetime.datetime | None = None) -> Leaf:
        cert = self.authority.issue_cert(*(identities or LOOPBACK_NAMES), common_name=name,
                                         not_before=not_before, not_after=not_after)
        cert_path, key_path = self.directory / f"{name}.pem", self.directory / f"{name}.key"
        with open(cert_path, "wb") as f:
            for blob in cert.cert_chain_pems:
                f.write(blob.bytes())
        cert.private_key_pem.write_to_path(str(key_path))
        return Leaf(str(cert_path), str(key_path))


def broker_tls_args(pki: Pki, leaf: Leaf, *, verify_client: bool = True) -> tuple[str, ...]:
    """`jetstream server` flags that put a broker's socket and HTTP APIs on (mutual) TLS."""
    args: tuple[str, ...] = ("--tls-cert", leaf.cert, "--tls-key", leaf.key, "--tls-ca", pki.ca)
    if verify_client:
        args += ("--tls-verify-client", "--http-tls-verify-client")
    return args
