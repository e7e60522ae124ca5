"""The `nats_subject` transport's pure parts: subject templates, their checks, the headers of
a republished record."""

from __future__ import annotations

import base64

import pytest

from jetstream.datastreams.connector import SourceRecord, WriterContext
from jetstream.datastreams.nats_subject import (
    NatsSubjectDestination,
    check_template,
    headers_of,
    subject_of,
)
from jetstream.errors import InvalidDatastreamConfig

CONTEXT = WriterContext("orders-out", 7, "orders", "same", 100)


def test_subjects_from_templates() -> None:
    template = "out.{stream}.{partition}.{key}"
    assert subject_of(template, "orders", 3, b"alice") == "out.orders.3.alice"
    assert subject_of(template, "orders", 0, None) == "out.orders.0._"
    assert subject_of(template, "orders", 0, b"a.b") == "out.orders.0.0x612e62"
    assert subject_of(template, "orders", 0, b"\xff") == "out.orders.0.0xff"
    assert subject_of(template, "orders", 0, b"") == "out.orders.0.0x"
    assert subject_of("fixed.subject", "orders", 1, b"k") == "fixed.subject"


@pytest.mark.parametrize("template", ["out.{topic}", "out.*", "out.>", "out..x", "out x",
                                      ".out", "a" * 257, "out.{}"])
def test_bad_templates_are_refused(template: str) -> None:
    with pytest.raises(InvalidDatastreamConfig) as info:
        check_template(template)
    assert info.value.fields["field"] == "destination.settings.subject"


def test_settings_are_checked() -> None:
    transport = NatsSubjectDestination()
    transport.check({"url": "nats://127.0.0.1:4222", "subject": "out.{partition}"})
    for settings, field in (({"subject": "x"}, "url"), ({"url": "http://x", "subject": "x"},
                                                        "url"),
                            ({"url": "nats://h:1"}, "subject"),
                            ({"url": "nats://h:1", "subject": "x", "colour": 1}, "colour")):
        with pytest.raises(InvalidDatastreamConfig) as info:
            transport.check(settings)
        assert info.value.fields["field"] == f"destination.settings.{field}"


def test_headers_keep_the_record_and_name_its_source() -> None:
    record = SourceRecord(2, 41, b"v", b"\x00key", {
        "trace": b"abc", "blob": b"\x00\xff", "Nats-Msg-Id": b"m-1",
        "Jetstream-Producer": b"p", "line": b"a\r\nb"}, 5)
    headers = headers_of(record, CONTEXT)
    assert headers == {
        "trace": "abc", "blob-Base64": base64.b64encode(b"\x00\xff").decode(),
        "Jetstream-Source-Msg-Id": "m-1",
        "line-Base64": base64.b64encode(b"a\r\nb").decode(),
        "Jetstream-Key-Base64": base64.b64encode(b"\x00key").decode(),
        "Jetstream-Source": "orders/2", "Jetstream-Source-Offset": "41",
        "Nats-Msg-Id": "orders-out/2/41"}
    plain = headers_of(SourceRecord(0, 0, None, b"k"), CONTEXT)
    assert plain["Jetstream-Key"] == "k"
