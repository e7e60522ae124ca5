"""TLS settings, listener safety, authentication and authorization."""

from __future__ import annotations

from jetstream.errors.base import InvalidConfig, JetstreamError
from jetstream.errors.protocol import ProtocolError


class TlsConfigError(InvalidConfig):
    """A TLS setting names certificates that cannot be used. `field` names the setting and
    `path` the file; fix the file or the setting and start again (or send SIGHUP again)."""

    code = "TLS_CONFIG"


class TlsFileUnreadable(TlsConfigError):
    """A certificate, key or CA file cannot be read or is not PEM of what it should hold."""

    code = "TLS_FILE_UNREADABLE"


class TlsKeyMismatch(TlsConfigError):
    """The private key does not belong to the certificate (or the key's passphrase is
    missing): give the key the certificate was issued for."""

    code = "TLS_KEY_MISMATCH"


class TlsCertExpired(TlsConfigError):
    """The certificate's validity ended (`not_after`): renew it."""

    code = "TLS_CERT_EXPIRED"


class TlsCertNotYetValid(TlsConfigError):
    """The certificate's validity has not begun (`not_before`): check the clocks, or wait."""

    code = "TLS_CERT_NOT_YET_VALID"


class InsecureListener(InvalidConfig):
    """A listener (socket API, HTTP API or metadata Raft) binds to an address off loopback
    without the protection that address needs. The message names the setting to add; pass
    `--insecure` only on a network every host of which is trusted."""

    code = "INSECURE_LISTENER"


class TooManyConnections(JetstreamError):
    """The listener holds its `connections_max` connections already: this one is closed.
    Retry later, or share connections (a client keeps one per broker)."""

    code = "TOO_MANY_CONNECTIONS"
    retriable = True


class Unauthenticated(JetstreamError):
    """The connection has not authenticated (the broker's `authentication` is on), or its
    credentials were refused. Authenticate (a user name and password, a token, or a client
    certificate the broker trusts) and send the request again."""

    code = "UNAUTHENTICATED"


class NotAuthorized(JetstreamError):
    """The principal may not do `operation` on the resource (`resource_type`, `resource`):
    no ACL entry allows it, or one denies it. Ask an administrator for an entry
    (`jetstream acl add`)."""

    code = "NOT_AUTHORIZED"

    def __init__(self, principal: str, operation: str, resource_type: str,
                 resource: str) -> None:
        super().__init__(f"{principal!r} may not {operation} {resource_type} {resource!r}",
                         principal=principal, operation=operation,
                         resource_type=resource_type, resource=resource)


class InvalidAcl(ProtocolError):
    """An ACL entry is malformed: an unknown operation, permission or resource type, a
    pattern with '*' other than at its end, or too many entries. `field` names the part."""

    code = "INVALID_ACL"


class TooManyInFlight(JetstreamError):
    """The principal has `principal_requests_max` requests in flight on this broker
    already: this one is refused. Wait for answers before sending more, or retry later."""

    code = "TOO_MANY_IN_FLIGHT"
    retriable = True
