"""Secure by default off loopback: which listeners a configuration leaves open to a network.

Theory of operation: on loopback only local processes reach a port, so `jetstream dev` and
single-machine setups need no settings. A listener bound anywhere else is reachable by every
host of that network, and each of ours needs something there:
- metadata Raft: pysyncobj unpickles what reaches its port, so an open Raft port is remote
  code execution; `raft_password` makes it refuse (before unpickling) whatever is not
  encrypted and authenticated with the group's password;
- socket API and HTTP API: anyone reaching them could read, write, create and delete any
  stream and read every byte in clear; TLS (`tls_cert`, `tls_key`) encrypts the traffic and
  mutual TLS (`tls_verify_client` with `tls_ca`, `http_tls_verify_client`) admits only
  clients holding a certificate of the cluster's CA, and `authentication` only clients
  proving a principal (either will do, with TLS).
`exposures` (pure: a configuration in, what is missing out) lists each listener off loopback
and the settings it lacks; the broker refuses to start while the list is not empty, unless
the operator passed `--insecure` (then it logs the list as an error and `GET /health` shows
it). A host name other than `localhost` counts as off loopback: what it resolves to is the
network's to decide.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Protocol


class ListenerSettings(Protocol):
    """The settings the guard reads (jetstream.server.config.BrokerConfig has them)."""

    @property
    def host(self) -> str: ...

    @property
    def http_port(self) -> int: ...

    @property
    def raft_password(self) -> str: ...

    @property
    def raft_password_file(self) -> str: ...

    @property
    def tls_cert(self) -> str: ...

    @property
    def tls_verify_client(self) -> bool: ...

    @property
    def http_tls_cert(self) -> str: ...

    @property
    def http_tls_verify_client(self) -> bool: ...

    @property
    def authentication(self) -> bool: ...

    @property
    def broker_id(self) -> int: ...

    @property
    def cluster_members(self) -> dict[int, str]: ...


@dataclass(frozen=True, slots=True)
class Exposure:
    """A listener bound off loopback and the settings it lacks there."""

    listener: str
    address: str
    missing: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.listener} on {self.address} needs {' and '.join(self.missing)}"


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposures(config: ListenerSettings) -> list[Exposure]:
    """Every listener of `config` off loopback that lacks its protection."""
    found: list[Exposure] = []
    own_raft = config.cluster_members.get(config.broker_id)
    if own_raft is not None:
        raft_host = own_raft.rpartition(":")[0]
        if not is_loopback(raft_host) and not (config.raft_password
                                               or config.raft_password_file):
            found.append(Exposure("metadata Raft", own_raft,
                                  ("raft_password (or raft_password_file)",)))
    if not is_loopback(config.host):
        missing = _tls_missing(bool(config.tls_cert),
                               config.tls_verify_client or config.authentication,
                               "tls_cert/tls_key",
                               "tls_verify_client (with tls_ca) or authentication")
        if missing:
            found.append(Exposure("socket API", config.host, missing))
        if config.http_port >= 0:
            missing = _tls_missing(bool(config.http_tls_cert or config.tls_cert),
                                   config.http_tls_verify_client or config.authentication,
                                   "tls_cert/tls_key (or http_tls_cert/http_tls_key)",
                                   "http_tls_verify_client (with tls_ca) or authentication")
            if missing:
                found.append(Exposure("HTTP API", config.host, missing))
    return found


def _tls_missing(tls: bool, verify: bool, tls_names: str, verify_name: str) -> tuple[str, ...]:
    return tuple(name for name, present in ((tls_names, tls), (verify_name, verify))
                 if not present)


def insecure_listeners(config: ListenerSettings, insecure: bool) -> list[str] | None:
    """What `GET /health` shows under `insecure`: None unless the broker was started with
    `--insecure`, then each listener it left open (empty when none is)."""
    return [str(e) for e in exposures(config)] if insecure else None


def refusal(found: list[Exposure]) -> str:
    """The message a broker refusing to start gives."""
    return ("listeners bound off loopback without protection: " + "; ".join(map(str, found))
            + ". Add those settings (see README, Security), bind to 127.0.0.1, or pass "
            "--insecure on a network whose every host is trusted")
