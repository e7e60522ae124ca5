"""TLS contexts for every listener and every dial: built from PEM files, checked at start,
read again on SIGHUP.

Theory of operation: a `TlsFiles` names one end's files (certificate chain, key, CA bundle),
whether a server verifies its clients (mutual TLS) and the lowest TLS version. Building a
context checks what OpenSSL would only report vaguely, or not at all, and says which setting
is at fault with a stable code: a file that cannot be read or is not PEM
(`TLS_FILE_UNREADABLE`), a key that is not the certificate's (`TLS_KEY_MISMATCH`), a
certificate past its `not_after` (`TLS_CERT_EXPIRED`) or before its `not_before`
(`TLS_CERT_NOT_YET_VALID`). Validity is decided by `check_validity`, pure, with the time as
an argument.

Reloading: an asyncio server keeps the SSLContext it was given for every connection it will
accept, so a reload cannot swap contexts. Instead `Reloadable.reload` first builds a whole new
context from the files (so a bad file changes nothing and is reported), then loads the new
chain and CA bundle into the live context: OpenSSL copies a context's certificate into each
connection when it begins, so new connections use the new certificate and open ones carry on.
A CA bundle can be added to, not taken from, a live context: removing a CA takes a restart.
A process keeps one live context per `TlsFiles` (`server_ssl`, `client_ssl`), so the socket
API, the HTTP API and every broker-to-broker dial share them and one `reload_all` reaches all.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypedDict

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from jetstream.errors import (
    TlsCertExpired,
    TlsCertNotYetValid,
    TlsConfigError,
    TlsFileUnreadable,
    TlsKeyMismatch,
)

log = logging.getLogger(__name__)

TLS_VERSIONS: Final = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class TlsArguments(TypedDict):
    """The TLS keyword arguments of jetstream.client.connect (CLI, Spark options)."""

    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """One end of a TLS link. A server needs `cert` and `key`; a client needs neither (it
    presents them when given, for servers that verify clients). `ca` verifies the other end
    (empty: the system's CAs); `verify_client` makes a server refuse clients without a
    certificate of `ca`. `setting` is the name of the settings these came from, for errors."""

    cert: str = ""
    key: str = ""
    ca: str = ""
    verify_client: bool = False
    min_version: str = "1.2"
    setting: str = "tls"


@dataclass(frozen=True, slots=True)
class Validity:
    not_before_s: float
    not_after_s: float
    subject: str


def check_validity(validity: Validity, now_s: float, *, path: str, field: str) -> None:
    """Raise TlsCertExpired / TlsCertNotYetValid unless `now_s` is inside the validity."""
    if now_s > validity.not_after_s:
        raise TlsCertExpired(
            f"{field}: certificate {path} ({validity.subject}) expired at "
            f"{_iso(validity.not_after_s)}", field=field, path=path,
            not_after=_iso(validity.not_after_s))
    if now_s < validity.not_before_s:
        raise TlsCertNotYetValid(
            f"{field}: certificate {path} ({validity.subject}) is valid only from "
            f"{_iso(validity.not_before_s)}", field=field, path=path,
            not_before=_iso(validity.not_before_s))


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")


def _read(path: str, field: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsFileUnreadable(f"{field}: cannot read {path}: {exc.strerror or exc}",
                                field=field, path=path) from None


def read_validity(path: str, field: str) -> Validity:
    """The validity of the first certificate of the PEM file at `path`."""
    data = _read(path, field)
    try:
        cert = x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise TlsFileUnreadable(f"{field}: {path} holds no PEM certificate ({exc})",
                                field=field, path=path) from None
    return Validity(cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp(),
                    cert.subject.rfc4514_string())


def _check_key(path: str, field: str) -> None:
    try:
        serialization.load_pem_private_key(_read(path, field), password=None)
    except (ValueError, TypeError) as exc:
        raise TlsFileUnreadable(f"{field}: {path} holds no unencrypted PEM private key "
                                f"({exc})", field=field, path=path) from None


def _load_chain(context: ssl.SSLContext, files: TlsFiles, now_s: float) -> None:
    cert_field, key_field = f"{files.setting}_cert", f"{files.setting}_key"
    check_validity(read_validity(files.cert, cert_field), now_s, path=files.cert,
                   field=cert_field)
    _check_key(files.key, key_field)
    try:
        context.load_cert_chain(files.cert, files.key)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise TlsKeyMismatch(f"{key_field}: the key {files.key} is not the key of the "
                                 f"certificate {files.cert}", field=key_field,
                                 path=files.key) from None
        raise TlsFileUnreadable(f"{cert_field}: cannot load {files.cert} with {files.key}: "
                                f"{exc}", field=cert_field, path=files.cert) from None


def _load_ca(context: ssl.SSLContext, files: TlsFiles) -> None:
    field = f"{files.setting}_ca"
    _read(files.ca, field)
    try:
        context.load_verify_locations(cafile=files.ca)
    except ssl.SSLError as exc:
        raise TlsFileUnreadable(f"{field}: {files.ca} holds no PEM CA certificate ({exc})",
                                field=field, path=files.ca) from None


def build_context(files: TlsFiles, *, server: bool, now_s: float) -> ssl.SSLContext:
    """A new context for a server (which needs `cert` and `key`) or a client (which verifies
    the server's certificate and host name). Raises a TlsConfigError naming the setting."""
    if server and not (files.cert and files.key):
        raise TlsConfigError(f"{files.setting}_cert and {files.setting}_key are needed for a "
                             f"TLS listener", field=f"{files.setting}_cert")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = TLS_VERSIONS[files.min_version]
    if files.cert:
        _load_chain(context, files, now_s)
    if files.ca:
        _load_ca(context, files)
    elif not server:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if server:
        context.verify_mode = ssl.CERT_REQUIRED if files.verify_client else ssl.CERT_NONE
    return context


class Reloadable:
    """A live context and the files it came from; `reload` re-reads them into it."""

    def __init__(self, files: TlsFiles, *, server: bool, now_s: float) -> None:
        self.files = files
        self.server = server
        self.context = build_context(files, server=server, now_s=now_s)
        self.reloads = 0

    def reload(self, now_s: float) -> None:
        """Check the files by building a context of them (raising, with nothing changed,
        when one is bad), then load them into the live context."""
        build_context(self.files, server=self.server, now_s=now_s)
        if self.files.cert:
            _load_chain(self.context, self.files, now_s)
        if self.files.ca:
            _load_ca(self.context, self.files)
        self.reloads += 1


_LIVE: dict[tuple[TlsFiles, bool], Reloadable] = {}
_LIVE_LOCK = threading.Lock()


def _shared(files: TlsFiles, server: bool) -> ssl.SSLContext:
    with _LIVE_LOCK:
        found = _LIVE.get((files, server))
        if found is None:
            found = _LIVE[(files, server)] = Reloadable(files, server=server, now_s=time.time())
        return found.context


def server_ssl(files: TlsFiles | None) -> ssl.SSLContext | None:
    """This process's live server context for `files` (None: plain TCP)."""
    return None if files is None else _shared(files, True)


def client_ssl(files: TlsFiles | None) -> ssl.SSLContext | None:
    """This process's live client context for `files` (None: plain TCP)."""
    return None if files is None else _shared(files, False)


def reload_all(now_s: float) -> list[str]:
    """Reload every live context of this process; what failed, as messages (a context whose
    files are bad keeps its old certificate and is logged)."""
    failures: list[str] = []
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    for item in live:
        try:
            item.reload(now_s)
        except TlsConfigError as exc:
            log.error("TLS reload of %s failed, the old certificate stays: [%s] %s",
                      item.files.setting, exc.code, exc)
            failures.append(f"[{exc.code}] {exc}")
        else:
            log.warning("TLS certificates of %s reloaded from %s", item.files.setting,
                        item.files.cert or item.files.ca)
    return failures


def client_context(ca: str | None = None, cert: str | None = None, key: str | None = None,
                   *, min_version: str = "1.2") -> ssl.SSLContext:
    """A client context from the client's options (`tls_ca`, `tls_cert`, `tls_key`): the
    server is verified against `ca` (default: the system's CAs) and its host name; `cert` and
    `key` are presented to servers that verify clients."""
    if bool(cert) != bool(key):
        raise TlsConfigError("tls_cert and tls_key go together", field="tls_key" if cert
                             else "tls_cert")
    files = TlsFiles(cert or "", key or "", ca or "", False, min_version)
    return build_context(files, server=False, now_s=time.time())
