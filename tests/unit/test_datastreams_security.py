"""The settings that secure a datastream's connections: checks naming the setting at fault,
secrets redacted wherever a definition is shown, and scrubbed from error texts."""

from __future__ import annotations

from pathlib import Path

import pytest

from jetstream.datastreams import registry
from jetstream.datastreams.commands import CreateDatastream
from jetstream.datastreams.model import DatastreamConfig
from jetstream.datastreams.security import REDACTED, redacted, scrub, secret_values
from jetstream.errors import InvalidDatastreamConfig
from tests.pki import Pki

SECRET = "s3cret-Pa55"


def mirror(source: dict[str, object], destination: dict[str, object]) -> DatastreamConfig:
    return DatastreamConfig.from_dict({
        "name": "dr", "source": {"type": "jetstream", "settings": {"stream": "a", **source}},
        "destination": {"type": "jetstream", "settings": {"stream": "b", **destination}}})


def test_good_security_settings_pass(pki: Pki) -> None:
    leaf = pki.leaf("mirror")
    registry.check(mirror({"brokers": "jetstreams://127.0.0.1:1", "tls_ca": pki.ca,
                           "tls_cert": leaf.cert, "tls_key": leaf.key,
                           "user": "alice", "password": SECRET},
                          {"brokers": "127.0.0.1:2", "token": f"alice:{SECRET}"}))
    nats = DatastreamConfig.from_dict({
        "name": "m", "source": {"type": "nats_jetstream", "settings": {
            "url": "tls://127.0.0.1:4222", "stream": "S", "tls_ca": pki.ca, "token": SECRET}},
        "destination": {"type": "jetstream", "settings": {"stream": "b"}}})
    registry.check(nats)  # a NATS token is any string


@pytest.mark.parametrize(("source", "field"), [
    ({"tls_cert": "x.pem"}, "source.settings.tls_key"),
    ({"tls_key": "x.key"}, "source.settings.tls_cert"),
    ({"user": "alice"}, "source.settings.password"),
    ({"password": SECRET}, "source.settings.user"),
    ({"token": f"alice:{SECRET}", "user": "alice", "password": SECRET},
     "source.settings.token"),
    ({"token": "no-colon"}, "source.settings.token"),
    ({"user": 7, "password": SECRET}, "source.settings.user"),
    ({"tls_ca": "/nonexistent/ca.pem"}, "source.settings.tls_ca"),
    ({"nats_user": "m", "nats_password": SECRET}, "source.settings.nats_password"),  # unknown
])
def test_bad_security_settings_name_the_setting(source: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidDatastreamConfig) as info:
        registry.check(mirror(source, {}))
    assert info.value.fields["field"] == field
    assert SECRET not in str(info.value)


@pytest.mark.parametrize(("destination", "field"), [
    ({"nats_user": "m"}, "destination.settings.nats_password"),
    ({"nats_password": SECRET}, "destination.settings.nats_user"),
    ({"nats_token": SECRET, "nats_user": "m", "nats_password": SECRET},
     "destination.settings.nats_token"),
])
def test_bad_nats_credentials_name_the_setting(destination: dict[str, object],
                                               field: str) -> None:
    with pytest.raises(InvalidDatastreamConfig) as info:
        registry.check(mirror({}, destination))
    assert info.value.fields["field"] == field


def test_unreadable_certificate_names_the_destination_setting(pki: Pki,
                                                              tmp_path: Path) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(InvalidDatastreamConfig) as info:
        registry.check(mirror({}, {"tls_cert": str(not_pem), "tls_key": str(not_pem)}))
    assert info.value.fields["field"] == "destination.settings.tls_cert"


def test_secrets_never_shown() -> None:
    config = mirror({"user": "alice", "password": SECRET},
                    {"brokers": f"nats://bob:{SECRET}@127.0.0.1:1", "token": f"bob:{SECRET}",
                     "nats_user": "m", "nats_password": SECRET + "-nats"})
    registry.check(config)
    shown = config.shown()
    assert shown["source"]["settings"]["password"] == REDACTED
    assert shown["source"]["settings"]["user"] == "alice"
    assert shown["destination"]["settings"]["token"] == REDACTED
    assert shown["destination"]["settings"]["nats_password"] == REDACTED
    assert shown["destination"]["settings"]["brokers"] == f"nats://bob:{REDACTED}@127.0.0.1:1"
    for text in (str(shown), repr(config), repr(CreateDatastream(config))):
        assert SECRET not in text
    # The metadata keeps them: brokers that run the task need them.
    assert DatastreamConfig.from_dict(config.to_dict()) == config
    assert config.to_dict()["source"]["settings"]["password"] == SECRET


def test_scrub_removes_every_secret_from_a_text() -> None:
    settings = {"token": f"bob:{SECRET}", "url": "nats://u:pw-in-url@h:4222", "user": "u"}
    secrets = secret_values(settings)
    text = scrub(f"refused bob:{SECRET} ({SECRET}) at nats://u:pw-in-url@h", secrets)
    assert SECRET not in text and "pw-in-url" not in text and REDACTED in text
    assert redacted({"url": "nats://h:4222"}) == {"url": "nats://h:4222"}
