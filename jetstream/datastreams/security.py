"""Settings that secure the connections a datastream's task makes, and keeping their secrets
out of sight.

Theory of operation: a `jetstream` source or destination on another cluster, and a
`nats_jetstream` source, dial servers that may want TLS and credentials. Their settings take
what the client takes (README "Security"): `tls_ca` (the CA bundle that signed the servers'
certificates), `tls_cert` and `tls_key` (this end's certificate, for servers that verify
clients), and `user` with `password`, or a `token`. The files are read on the broker that
runs the task (the same path on every broker); a create checks them on the broker that takes
it, so a wrong path is refused at once (INVALID_DATASTREAM_CONFIG naming the setting).

The secrets (`password`, `token`, and a password inside a URL's `user:password@`) are kept
as given in the metadata log, since every broker that may run the task needs them; what any
API, log line or error shows goes through `redacted` / `scrub`, which put REDACTED in their
place. Pure: no IO apart from reading the TLS files a check names.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from jetstream.datastreams.connector import setting_str
from jetstream.errors import InvalidDatastreamConfig, TlsConfigError

TLS_SETTINGS = ("tls_ca", "tls_cert", "tls_key")
CREDENTIAL_SETTINGS = ("user", "password", "token")
SECURITY_SETTINGS = TLS_SETTINGS + CREDENTIAL_SETTINGS
#: A `jetstream` endpoint publishes through the other cluster's NATS: its credentials there.
NATS_CREDENTIAL_SETTINGS = ("nats_user", "nats_password", "nats_token")
#: Settings whose values are secrets: never shown, logged or put in an error.
SECRET_SETTINGS = frozenset({"password", "token", "nats_password", "nats_token"})
#: Settings that are URLs (or comma-separated lists of them) and may carry a password.
URL_SETTINGS = frozenset({"url", "brokers"})
REDACTED = "<redacted>"


def check_security(settings: Mapping[str, Any], where: str, *,
                   token_is_user_secret: bool) -> None:
    """Raise InvalidDatastreamConfig (`field` `<where>.<setting>`) for security settings no
    connection could use: not strings, a certificate without its key, a user without a
    password, a token with a user, unreadable TLS files. `token_is_user_secret`: the token is
    Jetstream's `user:secret` (a NATS token is any string)."""
    values = {name: setting_str(settings, name, where) for name in SECURITY_SETTINGS}
    if bool(values["tls_cert"]) != bool(values["tls_key"]):
        missing = "tls_key" if values["tls_cert"] else "tls_cert"
        raise InvalidDatastreamConfig(f"{where}.tls_cert and {where}.tls_key go together",
                                      field=f"{where}.{missing}")
    if values["token"] and (values["user"] or values["password"]):
        raise InvalidDatastreamConfig(f"{where}: give a token or a user and password, not both",
                                      field=f"{where}.token")
    if bool(values["user"]) != bool(values["password"]):
        missing = "password" if values["user"] else "user"
        raise InvalidDatastreamConfig(f"{where}.user and {where}.password go together",
                                      field=f"{where}.{missing}")
    token = values["token"]
    if token_is_user_secret and token is not None and not _user_secret(token):
        raise InvalidDatastreamConfig(f"{where}.token must be 'user:secret'",
                                      field=f"{where}.token")
    tls_context(settings, where)


def check_nats_credentials(settings: Mapping[str, Any], where: str) -> None:
    """Raise InvalidDatastreamConfig for NATS credentials no connection could use."""
    user, password, token = (setting_str(settings, name, where)
                             for name in NATS_CREDENTIAL_SETTINGS)
    if token and (user or password):
        raise InvalidDatastreamConfig(f"{where}: give nats_token or nats_user and "
                                      f"nats_password, not both", field=f"{where}.nats_token")
    if bool(user) != bool(password):
        missing = "nats_password" if user else "nats_user"
        raise InvalidDatastreamConfig(f"{where}.nats_user and {where}.nats_password go "
                                      f"together", field=f"{where}.{missing}")


def nats_options(settings: Mapping[str, Any]) -> dict[str, str]:
    """nats-py `connect` options from the NATS credential settings (the ones given)."""
    return {name.removeprefix("nats_"): str(settings[name])
            for name in NATS_CREDENTIAL_SETTINGS if settings.get(name)}


def _user_secret(token: str) -> bool:
    user, sep, secret = token.partition(":")
    return bool(sep and user and secret)


def tls_context(settings: Mapping[str, Any], where: str) -> ssl.SSLContext | None:
    """The client TLS context the settings ask for (None: none of `tls_*` given).
    InvalidDatastreamConfig names the setting whose file cannot be used."""
    from jetstream.security.tls import client_context

    ca, cert, key = (settings.get(name) or None for name in TLS_SETTINGS)
    if not (ca or cert or key):
        return None
    try:
        return client_context(ca, cert, key)
    except TlsConfigError as exc:
        field = str(exc.fields.get("field") or "tls_ca")
        raise InvalidDatastreamConfig(f"{where}.{field}: {exc}", field=f"{where}.{field}",
                                      reason=exc.code) from None


def credential(settings: Mapping[str, Any], name: str) -> str | None:
    """The `user`, `password` or `token` setting (None: not given)."""
    assert name in CREDENTIAL_SETTINGS, name
    value = settings.get(name)
    return str(value) if value else None


def redacted(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings to show: secrets replaced by REDACTED."""
    out: dict[str, Any] = {}
    for name, value in settings.items():
        if name in SECRET_SETTINGS and value is not None:
            out[name] = REDACTED
        elif name in URL_SETTINGS and isinstance(value, str):
            out[name] = ",".join(_redact_url(u) for u in value.split(","))
        else:
            out[name] = value
    return out


def _redact_url(url: str) -> str:
    parts = urlsplit(url.strip()) if "@" in url else None
    if parts is None or parts.password is None:
        return url
    netloc = f"{parts.username}:{REDACTED}@{parts.hostname or ''}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def secret_values(*settings: Mapping[str, Any]) -> list[str]:
    """Every secret the settings hold (for `scrub`)."""
    found: list[str] = []
    for one in settings:
        for name, value in one.items():
            if name in SECRET_SETTINGS and isinstance(value, str) and value:
                found.append(value)
                found.extend(part for part in value.split(":")[1:] if part)
            elif name in URL_SETTINGS and isinstance(value, str) and "@" in value:
                found.extend(p for u in value.split(",")
                             if (p := urlsplit(u.strip()).password))
    return sorted(set(found), key=len, reverse=True)


def scrub(text: str, secrets: Sequence[str]) -> str:
    """`text` (an error message, a log line) with every secret replaced by REDACTED."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text
