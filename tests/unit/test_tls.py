"""TLS contexts from PEM files: clear errors with stable codes, reload in place, the settings
that go together, and the guard over listeners bound off loopback."""

from __future__ import annotations

import datetime
import shutil
import ssl
import time
from pathlib import Path

import pytest

from jetstream.client.client import parse_brokers, wants_tls
from jetstream.errors import (
    InvalidConfig,
    TlsCertExpired,
    TlsCertNotYetValid,
    TlsConfigError,
    TlsFileUnreadable,
    TlsKeyMismatch,
)
from jetstream.security.guard import exposures, insecure_listeners, is_loopback
from jetstream.security.tls import (
    Reloadable,
    TlsFiles,
    Validity,
    build_context,
    check_validity,
    client_context,
)
from jetstream.server.config import BrokerConfig
from tests.pki import Pki

NOW = time.time()
DAY = datetime.timedelta(days=1)


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def test_a_good_server_context_verifies_clients_only_when_asked(pki: Pki) -> None:
    leaf = pki.leaf("broker")
    plain = build_context(TlsFiles(leaf.cert, leaf.key, pki.ca), server=True, now_s=NOW)
    mutual = build_context(TlsFiles(leaf.cert, leaf.key, pki.ca, verify_client=True),
                           server=True, now_s=NOW)
    assert (plain.verify_mode, mutual.verify_mode) == (ssl.CERT_NONE, ssl.CERT_REQUIRED)
    assert mutual.minimum_version == ssl.TLSVersion.TLSv1_2
    tls13 = build_context(TlsFiles(leaf.cert, leaf.key, min_version="1.3"), server=True,
                          now_s=NOW)
    assert tls13.minimum_version == ssl.TLSVersion.TLSv1_3


def test_a_client_context_checks_the_host_name_and_the_ca(pki: Pki) -> None:
    context = client_context(pki.ca)
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(TlsConfigError, match="tls_cert and tls_key go together"):
        client_context(pki.ca, cert=pki.leaf("c").cert)


def test_unreadable_files_name_the_setting_and_the_path(pki: Pki, tmp_path: Path) -> None:
    leaf = pki.leaf("broker")
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(TlsFileUnreadable) as caught:
        build_context(TlsFiles(missing, leaf.key), server=True, now_s=NOW)
    assert (caught.value.code, caught.value.fields["field"]) == ("TLS_FILE_UNREADABLE",
                                                                  "tls_cert")
    assert caught.value.fields["path"] == missing
    not_pem = tmp_path / "garbage.pem"
    not_pem.write_text("not a certificate")
    with pytest.raises(TlsFileUnreadable, match="no PEM certificate"):
        build_context(TlsFiles(str(not_pem), leaf.key), server=True, now_s=NOW)
    with pytest.raises(TlsFileUnreadable) as key_error:
        build_context(TlsFiles(leaf.cert, str(not_pem), setting="http_tls"), server=True,
                      now_s=NOW)
    assert key_error.value.fields["field"] == "http_tls_key"
    with pytest.raises(TlsFileUnreadable) as ca_error:
        build_context(TlsFiles(leaf.cert, leaf.key, str(not_pem)), server=True, now_s=NOW)
    assert ca_error.value.fields["field"] == "tls_ca"


def test_a_key_of_another_certificate_is_a_mismatch(pki: Pki) -> None:
    one, other = pki.leaf("one"), pki.leaf("other")
    with pytest.raises(TlsKeyMismatch) as caught:
        build_context(TlsFiles(one.cert, other.key), server=True, now_s=NOW)
    assert caught.value.code == "TLS_KEY_MISMATCH"
    assert caught.value.fields == {"field": "tls_key", "path": other.key}


def test_expired_and_not_yet_valid_certificates_are_refused(pki: Pki) -> None:
    expired = pki.leaf("expired", not_before=utc_now() - 3 * DAY, not_after=utc_now() - DAY)
    future = pki.leaf("future", not_before=utc_now() + DAY, not_after=utc_now() + 3 * DAY)
    with pytest.raises(TlsCertExpired) as caught:
        build_context(TlsFiles(expired.cert, expired.key), server=True, now_s=time.time())
    assert caught.value.code == "TLS_CERT_EXPIRED" and "expired at" in str(caught.value)
    with pytest.raises(TlsCertNotYetValid) as early:
        build_context(TlsFiles(future.cert, future.key), server=True, now_s=time.time())
    assert early.value.code == "TLS_CERT_NOT_YET_VALID"


@pytest.mark.parametrize(("now_s", "error"), [
    (99.0, TlsCertNotYetValid), (100.0, None), (200.0, None), (200.5, TlsCertExpired)])
def test_validity_bounds_are_inclusive(now_s: float, error: type[Exception] | None) -> None:
    validity = Validity(100.0, 200.0, "CN=x")
    if error is None:
        check_validity(validity, now_s, path="p", field="tls_cert")
    else:
        with pytest.raises(error):
            check_validity(validity, now_s, path="p", field="tls_cert")


def test_reload_loads_new_files_into_the_same_context_and_keeps_it_on_a_bad_file(
        pki: Pki, tmp_path: Path) -> None:
    first, second = pki.leaf("first"), pki.leaf("second")
    live_cert, live_key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(first.cert, live_cert)
    shutil.copy(first.key, live_key)
    item = Reloadable(TlsFiles(str(live_cert), str(live_key)), server=True, now_s=NOW)
    context = item.context
    shutil.copy(second.cert, live_cert)
    shutil.copy(second.key, live_key)
    item.reload(time.time())
    assert item.context is context and item.reloads == 1
    shutil.copy(first.key, live_key)  # a half-done renewal: the key no longer matches
    with pytest.raises(TlsKeyMismatch):
        item.reload(time.time())
    assert item.reloads == 1


def test_tls_settings_that_go_together() -> None:
    with pytest.raises(InvalidConfig, match="set tls_key too"):
        BrokerConfig(tls_cert="c.pem")
    with pytest.raises(InvalidConfig, match="tls_verify_client needs TLS"):
        BrokerConfig(tls_verify_client=True)
    with pytest.raises(InvalidConfig, match="tls_min_version"):
        BrokerConfig(tls_cert="c", tls_key="k", tls_min_version="1.1")
    with pytest.raises(InvalidConfig, match="nats_user and nats_password"):
        BrokerConfig(nats_user="u")
    with pytest.raises(InvalidConfig, match="must be true or false"):
        BrokerConfig.load(env={"JETSTREAM_INSECURE": "maybe"})
    config = BrokerConfig.load(env={"JETSTREAM_TLS_CERT": "c", "JETSTREAM_TLS_KEY": "k",
                                    "JETSTREAM_TLS_CA": "ca", "JETSTREAM_INSECURE": "yes",
                                    "JETSTREAM_TLS_VERIFY_CLIENT": "true"})
    assert config.insecure and config.socket_tls == TlsFiles("c", "k", "ca", True)
    # The HTTP API takes the socket API's files unless given its own; mTLS per listener.
    assert config.http_tls == TlsFiles("c", "k", "ca", False, setting="tls")
    assert config.peer_tls == TlsFiles("c", "k", "ca", False)
    assert BrokerConfig().nats_tls is None
    assert BrokerConfig(nats_url="tls://n:4222").nats_tls == TlsFiles(setting="nats_tls")
    own = BrokerConfig(tls_cert="c", tls_key="k", http_tls_cert="h", http_tls_key="hk")
    assert own.http_tls == TlsFiles("h", "hk", setting="http_tls")  # errors name http_tls_*


def test_loopback_needs_nothing_and_every_other_address_names_what_it_lacks() -> None:
    assert exposures(BrokerConfig()) == []
    assert exposures(BrokerConfig(host="localhost", cluster="0@127.0.0.1:7500")) == []
    found = exposures(BrokerConfig(host="10.0.0.5", cluster="0@10.0.0.5:7500,1@10.0.0.6:7500"))
    assert [(e.listener, e.missing) for e in found] == [
        ("metadata Raft", ("raft_password (or raft_password_file)",)),
        ("socket API", ("tls_cert/tls_key", "tls_verify_client (with tls_ca) or authentication")),
        ("HTTP API", ("tls_cert/tls_key (or http_tls_cert/http_tls_key)",
                      "http_tls_verify_client (with tls_ca) or authentication"))]
    secured = BrokerConfig(host="10.0.0.5", cluster="0@10.0.0.5:7500", raft_password="s",
                           tls_cert="c", tls_key="k", tls_ca="ca", tls_verify_client=True,
                           http_tls_verify_client=True)
    assert exposures(secured) == []
    authenticated = BrokerConfig(host="10.0.0.5", cluster="0@10.0.0.5:7500", raft_password="s",
                                 tls_cert="c", tls_key="k", authentication=True)
    assert exposures(authenticated) == []  # TLS and passwords instead of client certificates
    assert [e.listener for e in exposures(BrokerConfig(host="0.0.0.0", http_port=-1))] == [
        "socket API"]
    assert (is_loopback("127.0.0.2"), is_loopback("::1"), is_loopback("broker-1")) == (
        True, True, False)


def test_health_lists_open_listeners_only_when_started_insecure() -> None:
    exposed = BrokerConfig(host="10.0.0.5", http_port=-1, insecure=True)
    assert insecure_listeners(exposed, exposed.insecure) == [
        ("socket API on 10.0.0.5 needs tls_cert/tls_key and tls_verify_client (with tls_ca) "
        "or authentication")]
    assert insecure_listeners(BrokerConfig(insecure=True), True) == []
    assert insecure_listeners(BrokerConfig(host="10.0.0.5"), False) is None


def test_broker_addresses_may_name_their_scheme() -> None:
    brokers = "jetstreams://a:7400, jetstreams://b:7401"
    assert parse_brokers(brokers) == ["a:7400", "b:7401"] and wants_tls(brokers)
    assert parse_brokers(["jetstream://a:1"]) == ["a:1"] and not wants_tls("jetstream://a:1")
    assert not wants_tls("a:1,b:2")
