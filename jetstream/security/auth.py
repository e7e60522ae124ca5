"""Authentication: who is at the other end of a connection (its principal).

Theory of operation: with the broker's `authentication` on, a connection is anonymous until
it proves a principal, by one of:
- a client certificate the broker verified (`tls_verify_client`): the principal is the
  certificate subject's common name (CN), at once after the TLS handshake;
- a user name and password (or a token `user:secret`, the same thing in one string),
  checked against the user's salted argon2id hash from the `users` / `users_file`
  settings (`jetstream user hash` prints one). Plain passwords are never stored, logged or
  kept: a successful check is remembered as an HMAC of the user and password under a
  per-process random key (so a repeated HTTP request does not pay argon2 again), a few
  thousand at most;
- the broker principal (`__broker`): brokers calling each other present a token derived
  from the metadata Raft password (HMAC-SHA256), which every broker of a cluster holds;
  a single broker without one uses a random per-process secret (only it calls itself).

argon2 verification costs tens of milliseconds and megabytes: it runs in a thread, at most
VERIFICATIONS_MAX at once, so a flood of wrong passwords cannot take the broker's memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from jetstream.errors import InvalidConfig, Unauthenticated
from jetstream.protocol.auth import Credentials
from jetstream.security.acl import BROKER_PRINCIPAL

#: argon2 checks running at once (each takes its hash's memory cost, 64 MiB by default).
VERIFICATIONS_MAX = 2
#: Successful checks remembered (HMACs of user and password).
REMEMBERED_MAX = 4096
#: Longest user name and password accepted.
USER_CHARS_MAX = 256
PASSWORD_CHARS_MAX = 1024
_PROCESS_KEY = secrets.token_bytes(32)
_BROKER_CONTEXT = b"jetstream broker principal v1"


def hash_password(password: str, hasher: PasswordHasher | None = None) -> str:
    """A salted argon2id hash of `password` for the `users` setting."""
    if not password:
        raise InvalidConfig("an empty password cannot be hashed", field="password")
    return (hasher or PasswordHasher()).hash(password)


def parse_users(text: str, where: str) -> dict[str, str]:
    """`name:hash` entries separated by white space or ';' (an argon2 hash holds neither)."""
    users: dict[str, str] = {}
    for item in text.replace(";", " ").split():
        name, sep, encoded = item.partition(":")
        if not sep or not name or not encoded.startswith("$argon2"):
            raise InvalidConfig(f"{where}: entries are name:$argon2id$... (from `jetstream "
                                f"user hash`), got {item[:40]!r}", field="users")
        if name.startswith("__") or len(name) > USER_CHARS_MAX:
            raise InvalidConfig(f"{where}: user names starting with __ are reserved, and "
                                f"have at most {USER_CHARS_MAX} characters: {name!r}",
                                field="users")
        if name in users:
            raise InvalidConfig(f"{where} names user {name!r} twice", field="users")
        users[name] = encoded
    return users


def load_users(users: str, users_file: str) -> dict[str, str]:
    """The users of the `users` setting and of `users_file` (one name:hash a line)."""
    found = parse_users(users, "users")
    if users_file:
        try:
            text = Path(users_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidConfig(f"cannot read users_file {users_file}: "
                                f"{exc.strerror or exc}", field="users_file") from None
        lines = "\n".join(line for line in text.splitlines()
                          if line.strip() and not line.lstrip().startswith("#"))
        for name, encoded in parse_users(lines, f"users_file {users_file}").items():
            if name in found:
                raise InvalidConfig(f"user {name!r} is in users and users_file",
                                    field="users_file")
            found[name] = encoded
    return found


def broker_token(metadata_password: str) -> str:
    """The token brokers present to each other: derived from the metadata password (never
    the password itself), or from a per-process secret without one."""
    key = metadata_password.encode() if metadata_password else _PROCESS_KEY
    return hmac.new(key, _BROKER_CONTEXT, hashlib.sha256).hexdigest()


def broker_credentials(metadata_password: str) -> Credentials:
    return Credentials(BROKER_PRINCIPAL, broker_token(metadata_password), "BROKER")


def certificate_principal(peercert: Mapping[str, Any] | None) -> str | None:
    """The common name of a verified client certificate's subject (`ssl` getpeercert())."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str) and value:
                return value
    return None


class Authenticator:
    """Checks credentials against the configured users and the broker token."""

    def __init__(self, users: Mapping[str, str], metadata_password: str) -> None:
        self._users = dict(users)
        self._broker_token = broker_token(metadata_password)
        self._hasher = PasswordHasher()
        self._remembered: OrderedDict[bytes, str] = OrderedDict()
        self._slots = asyncio.Semaphore(VERIFICATIONS_MAX)

    async def authenticate(self, credentials: Credentials) -> str:
        """The principal the credentials prove; Unauthenticated otherwise (the message never
        tells a wrong password from an unknown user)."""
        user, password = credentials.user, credentials.password
        if credentials.mechanism == "BROKER":
            if user == BROKER_PRINCIPAL and hmac.compare_digest(password.encode(),
                                                                self._broker_token.encode()):
                return BROKER_PRINCIPAL
            raise Unauthenticated("the broker token was refused (are the brokers' metadata "
                                  "passwords the same?)")
        refused = Unauthenticated(f"user {user!r}: unknown user or wrong password")
        encoded = self._users.get(user)
        if encoded is None or not password or len(password) > PASSWORD_CHARS_MAX:
            raise refused
        key = hmac.new(_PROCESS_KEY, f"{user}\0{password}\0{encoded}".encode(),
                       hashlib.sha256).digest()
        if key in self._remembered:
            self._remembered.move_to_end(key)
            return user
        async with self._slots:
            ok = await asyncio.to_thread(self._verify, encoded, password)
        if not ok:
            raise refused
        self._remembered[key] = user
        while len(self._remembered) > REMEMBERED_MAX:
            self._remembered.popitem(last=False)
        return user

    def _verify(self, encoded: str, password: str) -> bool:
        try:
            return self._hasher.verify(encoded, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False
