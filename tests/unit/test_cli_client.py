"""The pure parts of the client commands: `--from`, `k=v` pairs, argv, brokers, rendering."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

import pytest

from jetstream.cli_client import brokers_from
from jetstream.cli_groups import parse_reset
from jetstream.cli_text import (
    UsageError,
    message_json,
    message_text,
    normalize_argv,
    parse_from,
    parse_pairs,
    table,
)
from jetstream.client import Message, Start

NOW_MS = 1_700_000_000_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("earliest", (Start.EARLIEST, None, None)),
        ("LATEST", (Start.LATEST, None, None)),
        ("new", (Start.NEW_ONLY, None, None)),
        ("42", (Start.OFFSET, 42, None)),
        ("0", (Start.OFFSET, 0, None)),
        ("-5m", (Start.TIMESTAMP, None, NOW_MS - 300_000)),
        ("-1h30m", (Start.TIMESTAMP, None, NOW_MS - 5_400_000)),
        ("-250ms", (Start.TIMESTAMP, None, NOW_MS - 250)),
        ("-2d", (Start.TIMESTAMP, None, NOW_MS - 172_800_000)),
        ("2023-11-14T22:13:20Z", (Start.TIMESTAMP, None, NOW_MS)),
        ("2023-11-14T23:13:20.5+01:00", (Start.TIMESTAMP, None, NOW_MS + 500)),
    ],
)
def test_parse_from(text: str, expected: tuple[Start, int | None, int | None]) -> None:
    assert parse_from(text, NOW_MS) == expected


def test_parse_from_reads_a_time_without_zone_as_local_time() -> None:
    local = datetime(2024, 5, 1, 12, 0).astimezone()
    assert parse_from("2024-05-01T12:00", NOW_MS)[2] == int(local.timestamp() * 1000)


@pytest.mark.parametrize("text", ["yesterday", "-5", "5m", "-5x", "", "١٢", "-m"])
def test_parse_from_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--from"):
        parse_from(text, NOW_MS)


def test_parse_pairs() -> None:
    assert parse_pairs(["a=1", "b=x=y", "c="], "--label") == {"a": "1", "b": "x=y", "c": ""}
    assert parse_pairs(None, "--label") == {}
    for bad in ("novalue", "=v"):
        with pytest.raises(UsageError, match="--header"):
            parse_pairs([bad], "--header")


def test_normalize_argv_joins_a_relative_from() -> None:
    assert normalize_argv(["sub", "s", "--from", "-5m", "--max", "3"]) == [
        "sub", "s", "--from=-5m", "--max", "3"]
    assert normalize_argv(["sub", "s", "--from", "-x"]) == ["sub", "s", "--from", "-x"]
    assert normalize_argv(["sub", "--from"]) == ["sub", "--from"]


def test_brokers_from_flag_then_environment() -> None:
    env = {"JETSTREAM_BROKERS": "h1:1,h2:2"}
    assert brokers_from(argparse.Namespace(brokers="a:1"), env) == "a:1"
    assert brokers_from(argparse.Namespace(brokers=None), env) == "h1:1,h2:2"
    with pytest.raises(UsageError, match="no brokers"):
        brokers_from(argparse.Namespace(brokers=None), {})
    with pytest.raises(UsageError, match="host:port"):
        brokers_from(argparse.Namespace(brokers="nonsense"), {})


def test_messages_render_text_or_base64() -> None:
    ts = int(datetime(2024, 5, 1, 12, 0, 0, 123000, UTC).timestamp() * 1000)
    text = Message("s", 0, 7, ts, key=b"k", value=b"a\tb\nc",
                   headers={"h": b"v", "bin": b"\xff"}, subject="s.x", leader_epoch=0)
    binary = Message("s", 0, 8, ts, key=b"\xfe", value=b"\x00\xff", headers={},
                     subject="s.x", leader_epoch=0)
    assert message_text(text) == "7  2024-05-01T12:00:00.123Z  k  a\\tb\\nc"
    assert message_text(binary) == "8  2024-05-01T12:00:00.123Z  base64:/g==  base64:AP8="
    assert message_json(text) == {
        "stream": "s", "partition": 0, "offset": 7, "timestamp_ms": ts,
        "time": "2024-05-01T12:00:00.123Z", "subject": "s.x", "key": "k", "value": "a\tb\nc",
        "headers": {"h": "v"}, "headers_base64": {"bin": "/w=="}}
    rendered = message_json(binary)
    assert (rendered["key_base64"], rendered["value_base64"]) == ("/g==", "AP8=")
    assert "key" not in rendered and "value" not in rendered


def test_table_aligns_columns() -> None:
    assert table(["A", "LONG"], [(1, None), ("wide", 2)]) == "A     LONG\n1     -\nwide  2"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("earliest", ("earliest", None, None)),
        ("Latest", ("latest", None, None)),
        ("42", ("offset", 42, None)),
        ("-1h", ("timestamp", None, NOW_MS - 3_600_000)),
        ("2023-11-14T22:13:20+00:00", ("timestamp", None, NOW_MS)),
    ],
)
def test_offsets_reset_to(text: str, expected: tuple[str, int | None, int | None]) -> None:
    assert parse_reset(text, NOW_MS) == expected


def test_offsets_reset_to_refuses_new_and_nonsense() -> None:
    for text in ("new", "yesterday"):
        with pytest.raises(UsageError):
            parse_reset(text, NOW_MS)
    assert normalize_argv(["offsets", "reset", "g", "s", "--to", "-5m"]) == [
        "offsets", "reset", "g", "s", "--to=-5m"]
