"""The pure NATS protocol codec: server->client parsing in any chunking, limits, garbage, and
the client->server encoders. No sockets."""

from __future__ import annotations

import itertools
import json
import shutil
import string
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.compaction import offset_map
from jetstream.errors import JetstreamError
from jetstream.idempotence import dedupe
from jetstream.idempotence.headers import MSG_ID
from jetstream.protocol import ack
from jetstream.server import bulk_gets, ingest_batch
from jetstream.server.nats_wire import (
    ACCELERATED,
    CONTROL_LINE_BYTES_MAX,
    DEFAULT_MAX_PAYLOAD,
    ConnectOptions,
    Err,
    Event,
    Info,
    InvalidNatsSubject,
    NatsMsg,
    NatsParser,
    NatsProtocolError,
    Ok,
    Ping,
    Pong,
    connect_command,
    parse_headers,
    pub_commands,
    pub_commands_python,
    sub_command,
    unsub_command,
)
from jetstream.stream.format import ACCELERATED as format_accelerated

# -- a test-side encoder of the server->client direction ---------------------------------------

Status = tuple[str, str] | None


def header_block(headers: dict[str, str], status: Status = None) -> bytes:
    first = "NATS/1.0"
    if status is not None:
        code, description = status
        first += f" {code}" + (f" {description}" if description else "")
    lines = "".join(f"{key}: {value}\r\n" for key, value in headers.items())
    return f"{first}\r\n{lines}\r\n".encode()


def expected_headers(headers: dict[str, str], status: Status) -> dict[str, str]:
    out: dict[str, str] = {}
    if status is not None:
        out["Status"] = status[0]
        if status[1]:
            out["Description"] = status[1]
    out.update(headers)
    return out


def encode_msg(subject: str, sid: str, reply: str | None, data: bytes,
               block: bytes | None = None) -> bytes:
    reply_part = f" {reply}" if reply else ""
    if block is None:
        line = f"MSG {subject} {sid}{reply_part} {len(data)}\r\n"
        return line.encode() + data + b"\r\n"
    line = f"HMSG {subject} {sid}{reply_part} {len(block)} {len(block) + len(data)}\r\n"
    return line.encode() + block + data + b"\r\n"


def feed_all(parser: NatsParser, chunks: Iterable[bytes]) -> tuple[dict[str, list[NatsMsg]],
                                                                  list[Event]]:
    """Feed chunk by chunk, taking messages after each feed; check the byte counts."""
    by_sid: dict[str, list[NatsMsg]] = {}
    events: list[Event] = []
    for chunk in chunks:
        parser.feed(chunk)
        for sid, msgs, nbytes in parser.take_messages():
            assert msgs, "a batch is never empty"
            assert nbytes == sum(len(m[3]) for m in msgs)
            by_sid.setdefault(sid, []).extend(msgs)
        events.extend(parser.take_events())
    return by_sid, events


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


# -- strategies ----------------------------------------------------------------------------------

# Subjects: anything but whitespace and control characters, non-ASCII included; and the
# ASCII ones the C loop parses (it leaves the rest to the Python loop).
tokens = st.text(st.characters(exclude_categories=("Cc", "Cs", "Zs", "Zl", "Zp")),
                 min_size=1, max_size=16) | st.text(string.ascii_letters + string.digits + "._>*-",
                                                    min_size=1, max_size=16)
sids = st.sampled_from(["1", "2", "17", "abc"])
header_keys = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=12)
header_values = st.text(st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp")),
                        max_size=20).map(str.strip)
headers_dicts = st.dictionaries(header_keys.filter(lambda k: k not in ("Status", "Description")),
                                header_values, max_size=4)
statuses = st.none() | st.tuples(st.from_regex(r"\A[1-5][0-9]{2}\Z"),
                                 header_values.filter(lambda v: "\r" not in v))
payloads = st.binary(max_size=300) | st.sampled_from([b"", b"\r\n", b"MSG a 1 3\r\nabc\r\n"])
err_texts = st.text(st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp"),
                                  exclude_characters="'"), max_size=40).map(str.strip)


@st.composite
def operations(draw: st.DrawFn) -> tuple[bytes, tuple[str, NatsMsg] | Event]:
    """One server operation: its bytes and what the parser must make of it."""
    kind = draw(st.sampled_from(["msg", "msg", "msg", "hmsg", "hmsg", "id", "id", "ping",
                                 "pong", "ok", "err", "info"]))
    if kind == "id":  # a publisher's Nats-Msg-Id alone (the C loop's header block)
        subject, sid, data, value = draw(tokens), draw(sids), draw(payloads), draw(header_values)
        reply = draw(st.none() | tokens)
        wire = encode_msg(subject, sid, reply, data, header_block({MSG_ID: value}))
        return wire, (sid, (subject, reply, {MSG_ID: value}, data))
    if kind in ("msg", "hmsg"):
        subject, sid, data = draw(tokens), draw(sids), draw(payloads)
        reply = draw(st.none() | tokens)
        if kind == "msg":
            return encode_msg(subject, sid, reply, data), (sid, (subject, reply, None, data))
        headers, status = draw(headers_dicts), draw(statuses)
        wire = encode_msg(subject, sid, reply, data, header_block(headers, status))
        return wire, (sid, (subject, reply, expected_headers(headers, status), data))
    if kind == "ping":
        return b"PING\r\n", Ping()
    if kind == "pong":
        return b"PONG\r\n", Pong()
    if kind == "ok":
        return b"+OK\r\n", Ok()
    if kind == "err":
        text = draw(err_texts)
        return f"-ERR '{text}'\r\n".encode(), Err(text)
    info = {"server_id": draw(tokens), "headers": True,
            "max_payload": draw(st.integers(DEFAULT_MAX_PAYLOAD, 8 * DEFAULT_MAX_PAYLOAD))}
    return b"INFO " + json.dumps(info).encode() + b"\r\n", Info(info)


streams = st.lists(operations(), max_size=25)


def expectations(ops: list[tuple[bytes, Any]]) -> tuple[bytes, dict[str, list[NatsMsg]],
                                                        list[Event]]:
    wire = b"".join(w for w, _ in ops)
    by_sid: dict[str, list[NatsMsg]] = {}
    events: list[Event] = []
    for _, outcome in ops:
        if isinstance(outcome, tuple):
            by_sid.setdefault(outcome[0], []).append(outcome[1])
        else:
            events.append(outcome)
    return wire, by_sid, events


# -- round trips ---------------------------------------------------------------------------------


@settings(max_examples=300)
@given(streams, st.lists(st.integers(0, 10_000), max_size=12))
def test_any_chunking_gives_back_the_messages_and_events(ops: list[tuple[bytes, Any]],
                                                         cuts: list[int]) -> None:
    wire, want_msgs, want_events = expectations(ops)
    parser = NatsParser()
    got_msgs, got_events = feed_all(parser, split(wire, cuts))
    assert got_msgs == want_msgs
    assert got_events == want_events
    assert parser.buffered_bytes == 0


@settings(max_examples=200)
@given(streams, st.lists(st.integers(0, 10_000), max_size=12))
def test_the_python_loop_alone_gives_back_the_messages_and_events(
        ops: list[tuple[bytes, Any]], cuts: list[int]) -> None:
    wire, want_msgs, want_events = expectations(ops)
    parser = NatsParser(accelerated=False)
    assert feed_all(parser, split(wire, cuts)) == (want_msgs, want_events)
    assert parser.buffered_bytes == 0


@given(streams)
def test_byte_by_byte(ops: list[tuple[bytes, Any]]) -> None:
    wire, want_msgs, want_events = expectations(ops)
    got_msgs, got_events = feed_all(NatsParser(), [wire[i:i + 1] for i in range(len(wire))])
    assert (got_msgs, got_events) == (want_msgs, want_events)


def test_messages_are_grouped_per_sid_in_arrival_order() -> None:
    parser = NatsParser()
    parser.feed(encode_msg("a", "1", None, b"x") + encode_msg("b", "2", "r", b"yy")
                + encode_msg("c", "1", None, b"zzz"))
    assert parser.take_messages() == [
        ("1", [("a", None, None, b"x"), ("c", None, None, b"zzz")], 4),
        ("2", [("b", "r", None, b"yy")], 2),
    ]
    assert parser.take_messages() == []


def test_a_large_payload_arriving_in_pieces_is_joined_once_complete() -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    wire = encode_msg("big", "1", None, data)
    parser = NatsParser()
    pieces = split(wire, list(range(0, len(wire), 1000)))
    for piece in pieces[:-1]:
        parser.feed(piece)
        assert parser.take_messages() == []
    assert parser.buffered_bytes == len(wire) - len(pieces[-1])
    parser.feed(pieces[-1])
    [(sid, [msg], nbytes)] = parser.take_messages()
    assert (sid, msg[3], nbytes) == ("1", data, len(data))
    assert parser.buffered_bytes == 0


def test_non_utf8_subjects_survive() -> None:
    # A publisher can put any bytes but whitespace in a subject; they must not break the
    # connection, and must encode back to the same bytes (for acks to reply subjects).
    parser = NatsParser()
    parser.feed(b"MSG in.\xff\xfe 1 reply.\x85\xa0 2\r\nhi\r\n")
    [(_, [(subject, reply, _, data)], _)] = parser.take_messages()
    assert data == b"hi"
    assert pub_commands([(reply or "", b"")]) == b"PUB reply.\x85\xa0 0\r\n\r\n"
    assert subject.encode("utf-8", "surrogateescape") == b"in.\xff\xfe"


# -- headers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("block", "expected"), [
    (b"NATS/1.0\r\n\r\n", {}),
    (b"NATS/1.0 503\r\n\r\n", {"Status": "503"}),
    (b"NATS/1.0 404 No Messages\r\n\r\n", {"Status": "404", "Description": "No Messages"}),
    (b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 1016\r\nNats-Last-Stream: 1024\r\n\r\n",
     {"Status": "100", "Description": "Idle Heartbeat", "Nats-Last-Consumer": "1016",
      "Nats-Last-Stream": "1024"}),
    (b"NATS/1.0\r\nA: 1\r\nB:2\r\nC:\t 3 \r\n\r\n", {"A": "1", "B": "2", "C": "3"}),
    (b"NATS/1.0\r\nA: 1\r\nA: 2\r\n\r\n", {"A": "2"}),  # last wins, as in nats-py
    (b"NATS/1.0\r\nA: b: c\r\n\r\n", {"A": "b: c"}),
    # Lenient: a publisher wrote these; a bad line is skipped, never fatal.
    (b"NATS/1.0\r\nno colon\r\n: empty key\r\nbad key: 1\r\nok: \xff\r\n\r\n", {"ok": "\ufffd"}),
    (b"garbage", {}),
    (b"", {}),
    # One header, the common block (a fast path), and its malformed kinds.
    (b"NATS/1.0\r\nNats-Msg-Id: r-1\r\n\r\n", {"Nats-Msg-Id": "r-1"}),
    (b"NATS/1.0\r\nK:\t v \r\n\r\n", {"K": "v"}),
    (b"NATS/1.0\r\nK: \xff\r\n\r\n", {"K": "\ufffd"}),
    (b"NATS/1.0\r\nbad key: 1\r\n\r\n", {}),
    (b"NATS/1.0\r\nno colon\r\n\r\n", {}),
    (b"NATS/1.0\r\n: v\r\n\r\n", {}),
    (b"NATS/1.0 503\r\nK: v\r\n\r\n", {"Status": "503", "K": "v"}),
])
def test_header_blocks(block: bytes, expected: dict[str, str]) -> None:
    assert parse_headers(block) == expected


id_blocks = st.builds(
    lambda name, sep, value, extra: b"NATS/1.0\r\n" + name + sep + value + b"\r\n" + extra
    + b"\r\n",
    st.sampled_from([b"Nats-Msg-Id", b"nats-msg-id", b"Nats-Msg-Id ", b"Nats-Msg-IdX"]),
    st.sampled_from([b":", b": ", b":\t", b""]),
    st.binary(max_size=12) | st.text(max_size=8).map(str.encode)
    | st.sampled_from([b" id ", b"\x1fid\x1c"]),  # str.strip takes \x1c-\x1f, bytes' not
    st.sampled_from([b"", b"K: v\r\n"]))


@settings(max_examples=400, deadline=None)
@given(block=id_blocks)
def test_a_message_id_block_reads_as_parse_headers_reads_it(block: bytes) -> None:
    parser = NatsParser()
    parser.feed(encode_msg("s.in", "1", "_INBOX.x", b"payload", block))
    [(_, [(_, _, headers, data)], _)] = parser.take_messages()
    assert (headers, data) == (parse_headers(block), b"payload")


def test_hmsg_with_status_and_no_payload() -> None:
    parser = NatsParser()
    parser.feed(encode_msg("_INBOX.x", "9", None, b"", b"NATS/1.0 503\r\n\r\n"))
    assert parser.take_messages() == [("9", [("_INBOX.x", None, {"Status": "503"}, b"")], 0)]


# -- limits --------------------------------------------------------------------------------------


def test_control_line_limit() -> None:
    at_limit = b"-ERR '" + b"x" * (CONTROL_LINE_BYTES_MAX - 7) + b"'"
    assert len(at_limit) == CONTROL_LINE_BYTES_MAX
    parser = NatsParser()
    parser.feed(at_limit + b"\r\n")
    assert parser.take_events() == [Err("x" * (CONTROL_LINE_BYTES_MAX - 7))]
    with pytest.raises(NatsProtocolError, match="control line"):
        NatsParser().feed(b"-ERR '" + b"x" * (CONTROL_LINE_BYTES_MAX - 6) + b"'\r\n")


def test_an_endless_control_line_fails_as_soon_as_it_passes_the_limit() -> None:
    parser = NatsParser()
    parser.feed(b"MSG " + b"a" * (CONTROL_LINE_BYTES_MAX - 4))  # could still end: wait
    with pytest.raises(NatsProtocolError, match="control line"):
        parser.feed(b"aa")


def test_payload_limit_is_checked_before_the_payload_arrives() -> None:
    parser = NatsParser()
    parser.feed(f"MSG a 1 {DEFAULT_MAX_PAYLOAD}\r\n".encode())  # at the limit: waits
    with pytest.raises(NatsProtocolError, match="max_payload") as caught:
        NatsParser().feed(f"MSG a 1 {DEFAULT_MAX_PAYLOAD + 1}\r\n".encode())
    assert caught.value.code == "NATS_PROTOCOL_ERROR"
    assert isinstance(caught.value, JetstreamError)
    assert (caught.value.size, caught.value.limit) == (DEFAULT_MAX_PAYLOAD + 1,
                                                       DEFAULT_MAX_PAYLOAD)


def test_info_sets_the_payload_limit() -> None:
    parser = NatsParser()
    parser.feed(b'INFO {"max_payload":100}\r\n' + encode_msg("a", "1", None, b"x" * 100))
    assert parser.payload_bytes_max == 100
    assert len(parser.take_messages()) == 1
    with pytest.raises(NatsProtocolError, match="max_payload"):
        parser.feed(b"MSG a 1 101\r\n")


@pytest.mark.parametrize("line", [
    b"HMSG a 1 1200000 1200000\r\n",  # above max_payload + headers_bytes_max
    b"HMSG a 1 12 1048589\r\n",  # payload part above max_payload
    b"HMSG a 1 20 10\r\n",  # header block larger than the whole
    b"HMSG a 1 -1 10\r\n",
    b"MSG a 1 -1\r\n",
])
@pytest.mark.parametrize("reply", [b"", b" _INBOX.r"])
def test_hmsg_limits(line: bytes, reply: bytes) -> None:
    with pytest.raises(NatsProtocolError):  # with a reply subject: read inline, same checks
        NatsParser().feed(line.replace(b" 1 ", b" 1" + reply + b" ", 1))


def test_large_headers_within_max_payload_are_fine() -> None:
    block = header_block({"Big": "v" * 100_000})
    parser = NatsParser()
    parser.feed(encode_msg("a", "1", None, b"x" * (DEFAULT_MAX_PAYLOAD - len(block)), block))
    [(_, [(_, _, headers, data)], _)] = parser.take_messages()
    assert headers == {"Big": "v" * 100_000}
    assert len(data) + len(block) == DEFAULT_MAX_PAYLOAD


# -- garbage -------------------------------------------------------------------------------------


@pytest.mark.parametrize("wire", [
    b"HELLO\r\n",
    b"\r\n",
    b"msg a 1 1\r\nx\r\n",  # the server speaks upper case
    b"MSG a 1\r\n",
    b"MSG a 1 r x 5\r\n",
    b"MSG a 1 five\r\n",
    b"MSG  a 1 1\r\nx\r\n",  # two spaces: not what nats-server writes
    b"MSG a 1 3\r\nabcd\r\n",  # payload longer than announced
    b"MSG a 1 3\r\nab\r\n\r\n",  # shorter
    b"HMSG a 1 3\r\n",
    b"HMSG a 1 12 x\r\n",
    b"PINGX\r\n",
    b"PING x\r\n",
    b"INFO {not json}\r\n",
    b"INFO [1,2]\r\n",
    b"INFO " + b"[" * 3000 + b"\r\n",
])
def test_garbage_raises_a_protocol_error(wire: bytes) -> None:
    parser = NatsParser()
    with pytest.raises(NatsProtocolError):
        parser.feed(wire)
    with pytest.raises(NatsProtocolError):  # broken for good: no resynchronising
        parser.feed(b"PING\r\n")


def test_what_came_before_an_error_stays_takeable() -> None:
    parser = NatsParser()
    with pytest.raises(NatsProtocolError):
        parser.feed(encode_msg("a", "1", None, b"xyz") + b"PING\r\nBOGUS\r\n")
    assert parser.take_messages() == [("1", [("a", None, None, b"xyz")], 3)]
    assert parser.take_events() == [Ping()]


def feed_garbage(chunks: Iterable[bytes]) -> None:
    parser = NatsParser()
    try:
        for chunk in chunks:
            parser.feed(chunk)
            parser.take_messages()
            parser.take_events()
    except NatsProtocolError:
        pass  # the only exception allowed


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=64) | st.sampled_from(
    [b"MSG ", b"HMSG ", b"PING", b"INFO ", b"-ERR ", b"+OK", b"\r\n", b" ", b"1", b"-1",
     b"NATS/1.0", b"{}"]), max_size=40))
def test_random_bytes_raise_nothing_but_protocol_errors(chunks: list[bytes]) -> None:
    feed_garbage(chunks)


@settings(max_examples=300)
@given(streams, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 4), st.binary(
    max_size=4)), min_size=1, max_size=6), st.lists(st.integers(0, 10_000), max_size=6))
def test_mutated_streams_raise_nothing_but_protocol_errors(
        ops: list[tuple[bytes, Any]], mutations: list[tuple[int, int, bytes]],
        cuts: list[int]) -> None:
    wire = bytearray(b"".join(w for w, _ in ops))
    for at, drop, insert in mutations:
        at %= len(wire) + 1
        wire[at:at + drop] = insert
    feed_garbage(split(bytes(wire), cuts))


# -- the C loop against the Python loop -----------------------------------------------------------


def outcome(accelerated: bool, chunks: list[bytes]) -> list[Any]:
    """Everything a parser makes of `chunks`, feed by feed, up to its error if any."""
    parser = NatsParser(accelerated=accelerated, payload_bytes_max=400, headers_bytes_max=200,
                        control_line_bytes_max=100)
    seen: list[Any] = []
    try:
        for chunk in chunks:
            parser.feed(chunk)
            seen.append((parser.take_messages(), parser.take_events(), parser.buffered_bytes))
    except NatsProtocolError as exc:
        seen.append((str(exc), exc.fields))
    seen.append((parser.take_messages(), parser.take_events()))
    return seen


def test_the_c_parts_are_built_where_a_c_compiler_is() -> None:
    """Every extension setup.py builds (the parser's here, the ingest batch's, the acks',
    the id window's, the batch encoder's, the bulk GETs' and the cleaner's key scan), so a
    broken build cannot pass as the Python fallback."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: each runs its Python loop")
    assert ACCELERATED, "setup.py builds jetstream.server._nats_wire_c (pip install -e .)"
    assert ingest_batch.ACCELERATED, "setup.py builds jetstream.server._ingest_c"
    assert ack.ACCELERATED, "setup.py builds jetstream.protocol._ack_c"
    assert dedupe.ACCELERATED, "setup.py builds jetstream.idempotence._ids_c"
    assert format_accelerated, "setup.py builds jetstream.stream._format_c (pip install -e .)"
    assert bulk_gets.ACCELERATED, "setup.py builds jetstream.server._gets_c"
    assert offset_map.ACCELERATED, "setup.py builds jetstream.compaction._scan_c"


@settings(max_examples=400)
@given(streams, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 4), st.binary(
    max_size=4) | st.sampled_from([b" ", b"\r\n", b"\xc3\xa9", b"99", b"+1", b"_"])),
    max_size=4), st.lists(st.integers(0, 10_000), max_size=6))
def test_the_c_loop_makes_of_any_bytes_what_the_python_loop_makes(
        ops: list[tuple[bytes, Any]], mutations: list[tuple[int, int, bytes]],
        cuts: list[int]) -> None:
    """Messages, events, byte counts, what stays buffered, and errors word for word, on
    well-formed streams and on streams with bytes dropped, replaced or added anywhere."""
    if not ACCELERATED:
        pytest.skip("the C loop is not built here")
    wire = bytearray(b"".join(w for w, _ in ops))
    for at, drop, insert in mutations:
        at %= len(wire) + 1
        wire[at:at + drop] = insert
    chunks = split(bytes(wire), cuts)
    assert outcome(True, chunks) == outcome(False, chunks)


# -- encoders ------------------------------------------------------------------------------------


def test_connect_command() -> None:
    command = connect_command(ConnectOptions(name="broker-1", version="1.2"))
    assert command.startswith(b"CONNECT {") and command.endswith(b"}\r\n")
    fields = json.loads(command[len(b"CONNECT "):])
    assert fields == {"verbose": False, "pedantic": False, "headers": True,
                      "no_responders": True, "protocol": 1, "name": "broker-1",
                      "lang": "python", "version": "1.2"}
    with_user = json.loads(connect_command(ConnectOptions(user="u", password="p"))[8:])
    assert (with_user["user"], with_user["pass"]) == ("u", "p")
    assert "auth_token" not in with_user
    with_token = json.loads(connect_command(ConnectOptions(auth_token="t"))[8:])
    assert with_token["auth_token"] == "t"
    assert "user" not in with_token and "name" not in with_token


def test_sub_and_unsub_commands() -> None:
    assert sub_command("a.>", 7) == b"SUB a.> 7\r\n"
    assert sub_command("a.*", "8", queue="workers") == b"SUB a.* workers 8\r\n"
    assert sub_command("a", 9, queue="") == b"SUB a 9\r\n"
    assert unsub_command(7) == b"UNSUB 7\r\n"
    assert unsub_command("7", max_msgs=10) == b"UNSUB 7 10\r\n"


@pytest.mark.parametrize("subject", ["", "a b", "a\r\nPUB x 1", " a", "a\t", "a\n", "a\r"])
def test_encoders_refuse_subjects_that_would_break_the_line(subject: str) -> None:
    with pytest.raises(InvalidNatsSubject):
        pub_commands([("ok", b"x"), (subject, b"y")])
    with pytest.raises(InvalidNatsSubject):
        sub_command(subject, 1)
    with pytest.raises(InvalidNatsSubject):
        sub_command("ok", 1, queue=subject or " ")


def test_encoders_pass_what_nats_allows_in_subjects() -> None:
    # Only space, tab, CR and LF separate fields; the rest is the server's business.
    subject = "a\u2028\xa0\x0b.\udcff"
    assert pub_commands([(subject, b"")]) == b"PUB a\xe2\x80\xa8\xc2\xa0\x0b.\xff 0\r\n\r\n"
    assert sub_command("a\xa0", 1) == b"SUB a\xc2\xa0 1\r\n"


def parse_pubs(wire: bytes) -> list[tuple[str, bytes]]:
    out = []
    pos = 0
    while pos < len(wire):
        eol = wire.index(b"\r\n", pos)
        op, subject, size = wire[pos:eol].split(b" ")
        assert op == b"PUB"
        start = eol + 2
        end = start + int(size)
        assert wire[end:end + 2] == b"\r\n"
        out.append((subject.decode(), wire[start:end]))
        pos = end + 2
    return out


@given(st.lists(st.tuples(tokens, payloads), max_size=20))
def test_pub_commands_round_trip(messages: list[tuple[str, bytes]]) -> None:
    wire = pub_commands(messages)
    assert parse_pubs(wire) == messages
    assert wire == b"".join(pub_commands([m]) for m in messages)


@given(st.lists(st.tuples(tokens | st.sampled_from(["", "a b", "a\tb", "a\r", "\n", "x\udcff"]),
                          st.binary(max_size=40)), max_size=8))
def test_pub_commands_in_c_are_the_python_bytes_or_declined(
        messages: list[tuple[str, bytes]]) -> None:
    if not ACCELERATED:
        pytest.skip("the C loop is not built here")
    from jetstream.server import _nats_wire_c
    try:
        want: bytes | None = pub_commands_python(messages)
    except InvalidNatsSubject:
        want = None  # C declines it; Python raises
    got = _nats_wire_c.pub_commands(messages)
    assert got is None or got == want
    if want is not None and all(s.isascii() for s, _ in messages):
        assert got == want  # declined only for non-ASCII subjects
