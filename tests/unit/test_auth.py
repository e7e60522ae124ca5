"""Authentication's cores: the users setting, argon2id checks, the broker token, the
principal of a client certificate, and the settings that go together."""

from __future__ import annotations

from pathlib import Path

import pytest
from argon2 import PasswordHasher

from jetstream.errors import InvalidConfig, Unauthenticated
from jetstream.protocol import messages as m
from jetstream.security.acl import BROKER_PRINCIPAL
from jetstream.security.auth import (
    Authenticator,
    broker_credentials,
    broker_token,
    certificate_principal,
    hash_password,
    load_users,
    parse_users,
)
from jetstream.server.config import BrokerConfig
from jetstream.server.http_auth import credentials_of

HASHER = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)


def test_users_setting_and_file(tmp_path: Path) -> None:
    a, b = HASHER.hash("pa"), HASHER.hash("pb")
    assert parse_users(f"alice:{a}; bob:{b}", "users") == {"alice": a, "bob": b}
    users_file = tmp_path / "users"
    users_file.write_text(f"# comment\ncarol:{a}\n\n")
    assert load_users(f"alice:{a}", str(users_file)) == {"alice": a, "carol": a}
    for bad in ("alice", "alice:plain-password", f"__x:{a}", f"a:{a} a:{b}"):
        with pytest.raises(InvalidConfig):
            parse_users(bad, "users")
    with pytest.raises(InvalidConfig, match="users_file"):
        load_users("", str(tmp_path / "missing"))
    assert PasswordHasher().verify(hash_password("s3cret"), "s3cret")


async def test_authenticator() -> None:
    auth = Authenticator({"alice": HASHER.hash("right")}, "raft-pw")
    assert await auth.authenticate(m.Credentials("alice", "right")) == "alice"
    assert await auth.authenticate(m.Credentials("alice", "right")) == "alice"  # remembered
    for user, password in (("alice", "wrong"), ("bob", "right"), ("alice", "")):
        with pytest.raises(Unauthenticated):
            await auth.authenticate(m.Credentials(user, password))
    assert await auth.authenticate(broker_credentials("raft-pw")) == BROKER_PRINCIPAL
    with pytest.raises(Unauthenticated):
        await auth.authenticate(broker_credentials("another-pw"))
    with pytest.raises(Unauthenticated):  # the broker principal takes no password
        await auth.authenticate(m.Credentials(BROKER_PRINCIPAL, broker_token("raft-pw")))
    assert "raft-pw" not in broker_token("raft-pw")
    assert "right" not in repr(m.Credentials("alice", "right"))
    assert "right" not in repr(m.AuthenticateRequest("alice", "right"))


def test_certificate_principal_and_http_credentials() -> None:
    cert = {"subject": ((("organizationName", "x"),), (("commonName", "carol"),))}
    assert certificate_principal(cert) == "carol"
    assert certificate_principal({}) is None and certificate_principal(None) is None
    assert credentials_of("Basic YWxpY2U6cHc=") == m.Credentials("alice", "pw")
    assert credentials_of("Bearer alice:pw") == m.Credentials("alice", "pw", "TOKEN")
    for header in ("Basic !!", "Bearer nocolon", "Digest x", ""):
        with pytest.raises(Unauthenticated):
            credentials_of(header)


def test_settings_that_go_together() -> None:
    with pytest.raises(InvalidConfig, match="authorization needs authentication"):
        BrokerConfig(authorization=True)
    with pytest.raises(InvalidConfig, match="raft_password_file"):
        BrokerConfig(authentication=True, cluster="0@127.0.0.1:5000")
    with pytest.raises(InvalidConfig, match="authentication"):
        BrokerConfig(users="alice:$argon2id$x")
    config = BrokerConfig(authentication=True, authorization=True, super_users="a, b")
    assert config.super_user_set == frozenset({"a", "b"})
    assert BrokerConfig.load(env={"JETSTREAM_AUTHENTICATION": "true"}).authentication


def test_spark_options_carry_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    from jetstream.errors import InvalidSparkOption
    from jetstream.spark.options import tls_option

    for name in ("USER", "PASSWORD", "TOKEN"):
        monkeypatch.delenv(f"JETSTREAM_CLIENT_{name}", raising=False)
    options = tls_option({"user": "alice", "password": "pw"})
    assert options.connect_options()["user"] == "alice"
    assert options.connect_options()["password"] == "pw" and "pw" not in repr(options)
    monkeypatch.setenv("JETSTREAM_CLIENT_TOKEN", "bob:s")
    assert tls_option({}).connect_options()["token"] == "bob:s"
    with pytest.raises(InvalidSparkOption):
        tls_option({"user": "alice"})
