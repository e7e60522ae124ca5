"""The NATS client protocol as pure functions: a server->client parser and client->server
encoders. No sockets, no clocks, no asyncio (h11 style); `nats_ingest` is the IO shell.

Theory of operation
- `NatsParser.feed(data)` appends bytes and parses every complete operation at once. Messages
  are collected per subscription id (sid) into lists of `NatsMsg` tuples, taken in bulk with
  `take_messages()`; control operations (PING, PONG, +OK, -ERR, INFO) become events taken
  with `take_events()`. A reader therefore pays one Python call per socket read, not per
  message, and the parse loop itself makes no Python-level function call for a MSG: it scans
  with `bytes.find`, splits the control line in C and builds a plain tuple per message.
- The loop in C (`_nats_wire_c.c`, built by setup.py at install when a C compiler is there;
  `ACCELERATED` says whether it was) parses the operations that carry the load: MSG, and
  HMSG whose header block is a publisher's Nats-Msg-Id alone, with plain ASCII control lines.
  It declines anything else (control operations, other headers, non-ASCII, any field the
  Python loop would refuse), and the Python loop parses that one operation, raising its
  errors, before C goes on: both make the same messages, events and errors of any bytes
  (tests/unit/test_nats_wire.py checks it on random and mutated streams). It parses a
  128-byte MSG in about a tenth of the Python loop's time.
- Buffering: the parser keeps the unconsumed tail of the last parse (an immutable `bytes`,
  scanned with an offset) and the chunks fed since. It knows how many bytes the next
  operation needs (`_need`: the rest of a payload whose control line it has read); until that
  many have arrived `feed` only appends the chunk to a list, so a large payload arriving in
  many reads is joined once, not once per read. Each parse starts from a fresh join of tail
  and chunks, which is the compaction: a payload byte is copied twice at most (join, slice),
  so the cost is amortised O(1) per byte. Only a partial control line is re-joined on every
  feed until its CRLF arrives, which the 4 KiB control line limit bounds.
- Subjects and reply subjects are decoded as UTF-8 with `surrogateescape`, so whatever bytes
  a publisher put in them survive and encode back unchanged (`pub_commands` encodes the same
  way); fields are split on single spaces, exactly as nats-server writes them.
- Limits are checked before anything is buffered for them: a control line longer than
  `control_line_bytes_max` (4 KiB, as nats-py and nats-server) or a payload above the
  server's `max_payload` (from INFO, at most 64 MiB; 1 MiB until an INFO arrives) or an HMSG
  above `max_payload` + `headers_bytes_max` (64 KiB for headers) raises `NatsProtocolError`
  as soon as its control line is read (for a control line: as soon as the buffer holds more
  than the limit without a CRLF).
- Errors: malformed framing (an unknown operation, a bad size, a payload not followed by
  CRLF, bad INFO JSON) raises `NatsProtocolError`, and the parser stays broken: the stream
  cannot be resynchronised, the connection must be closed. Header *contents* are parsed
  leniently, as nats-py does (a line without a colon is skipped, bad UTF-8 is replaced):
  a publisher wrote them, not the server, and one bad message must not kill the connection.
- Headers come out as `dict[str, str]`; a repeated key keeps its last value (nats-py does
  the same). A status line `NATS/1.0 503` or `NATS/1.0 404 No Messages` adds the keys
  `Status` and `Description` (nats-py's names).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

from jetstream.errors import JetstreamError
from jetstream.idempotence.headers import MSG_ID

_accelerated: ModuleType | None
try:  # the hot loop in C, when it was built (setup.py; optional)
    from jetstream.server import _nats_wire_c as _accelerated
except ImportError:  # pragma: no cover - a build without a C compiler
    _accelerated = None

#: Whether `NatsParser` parses MSG and HMSG in C (built at install; the Python loop does the
#: same work, slower, without it).
ACCELERATED: Final = _accelerated is not None

# -- grammar (server -> client) -------------------------------------------------------------
#   MSG  <subject> <sid> [reply-to] <#bytes>\r\n<payload>\r\n
#   HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>\r\n<headers><payload>\r\n
#        headers: NATS/1.0[ <status>[ <description>]]\r\n(<key>: <value>\r\n)*\r\n
#   PING\r\n | PONG\r\n | +OK\r\n | -ERR '<message>'\r\n | INFO <json object>\r\n
# (client -> server, encoders below)
#   CONNECT <json>\r\n | PING\r\n | PONG\r\n | PUB <subject> <#bytes>\r\n<payload>\r\n
#   SUB <subject> [queue group] <sid>\r\n | UNSUB <sid> [max msgs]\r\n
CRLF: Final = b"\r\n"
# MSG and HMSG are compared after the control line is decoded and split; the rest as bytes.
OP_MSG: Final = "MSG"
OP_HMSG: Final = "HMSG"
OP_PING: Final = b"PING"
OP_PONG: Final = b"PONG"
OP_OK: Final = b"+OK"
OP_ERR: Final = b"-ERR"
OP_INFO: Final = b"INFO"
HEADER_VERSION: Final = "NATS/1.0"
#: Whitespace inside a header name makes the line malformed (skipped).
_SPACE: Final = re.compile(r"\s")
_VERSION_LINE: Final = HEADER_VERSION + "\r\n"
_VERSION_LINE_BYTES: Final = _VERSION_LINE.encode()
#: The header block of a publisher's Nats-Msg-Id alone, up to its value.
_MSG_ID_BLOCK: Final = _VERSION_LINE_BYTES + MSG_ID.encode() + b":"
_MSG_ID_BLOCK_LEN: Final = len(_MSG_ID_BLOCK)
STATUS_KEY: Final = "Status"
DESCRIPTION_KEY: Final = "Description"
PING: Final = b"PING\r\n"
PONG: Final = b"PONG\r\n"
assert len(CRLF) == 2 and PING == OP_PING + CRLF and PONG == OP_PONG + CRLF

CONTROL_LINE_BYTES_MAX: Final = 4096  # nats-server's and nats-py's MAX_CONTROL_LINE_SIZE
DEFAULT_MAX_PAYLOAD: Final = 1024 * 1024  # nats-server's default until INFO says otherwise
MAX_PAYLOAD_CEILING: Final = 64 * 1024 * 1024  # nats-server's own ceiling; INFO is clamped
HEADERS_BYTES_MAX: Final = 64 * 1024  # allowance for an HMSG's headers on top of max_payload
LANG: Final = "python"
PROTOCOL: Final = 1  # dynamic cluster updates; INFO may arrive at any time
_SEPARATORS: Final = (" ", "\t", "\r", "\n")  # what nats-server splits protocol fields on


class NatsProtocolError(JetstreamError):
    """The NATS server sent bytes that are not the NATS client protocol, or that break a
    limit (control line, payload or header size). The byte stream cannot be
    resynchronised: close the connection and reconnect."""

    code = "NATS_PROTOCOL_ERROR"


class InvalidNatsSubject(JetstreamError):
    """A subject, queue group or sid handed to an encoder is empty or contains a space, tab,
    CR or LF (which would break the protocol line). Fix the caller; it fails again."""

    code = "INVALID_NATS_SUBJECT"

    def __init__(self, value: str, what: str = "subject") -> None:
        super().__init__(f"invalid NATS {what} {value!r}: empty, or holds a space, tab, CR "
                         "or LF",
                         value=value, what=what)


#: One delivered message: (subject, reply, headers, data), a plain tuple. Unpack it
#: (`for subject, reply, headers, data in batch`) or index it with the constants below. Not a
#: NamedTuple on purpose: building a tuple subclass costs ~100 ns more per message (measured
#: here: 22 ns vs 126 ns), and the GC can untrack plain tuples of str/bytes but not subclasses.
NatsMsg = tuple[str, str | None, dict[str, str] | None, bytes]
SUBJECT: Final = 0
REPLY: Final = 1
HEADERS: Final = 2
DATA: Final = 3


# -- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ping:
    """The server asks for a PONG (a liveness check): answer `PONG` promptly."""


@dataclass(frozen=True, slots=True)
class Pong:
    """The answer to one PING this client sent (in order)."""


@dataclass(frozen=True, slots=True)
class Ok:
    """+OK: only sent in verbose mode, which `connect_command` turns off."""


@dataclass(frozen=True, slots=True)
class Err:
    """-ERR: the server reports an error; most (authorization, stale connection, max
    payload) are followed by the server closing the connection."""

    message: str


@dataclass(frozen=True, slots=True)
class Info:
    """INFO: server information, first on every connection and again on cluster changes."""

    info: dict[str, Any]


Event = Ping | Pong | Ok | Err | Info
#: (sid, messages in arrival order, payload bytes of those messages)
SidBatch = tuple[str, list[NatsMsg], int]

_PING_EVENT: Final = Ping()
_PONG_EVENT: Final = Pong()
_OK_EVENT: Final = Ok()


class NatsParser:
    """Server->client protocol parser: `feed` bytes, then take messages and events in bulk."""

    __slots__ = ("_accelerated", "_batches", "_broken", "_buf", "_chunks", "_chunks_len",
                 "_events", "_need",
                 "control_line_bytes_max", "headers_bytes_max", "payload_bytes_max")

    def __init__(
        self,
        *,
        payload_bytes_max: int = DEFAULT_MAX_PAYLOAD,
        headers_bytes_max: int = HEADERS_BYTES_MAX,
        control_line_bytes_max: int = CONTROL_LINE_BYTES_MAX,
        accelerated: bool = True,
    ) -> None:
        """`accelerated`: parse in C when it was built (`ACCELERATED`); False: in Python."""
        if payload_bytes_max < 0 or headers_bytes_max < 0 or control_line_bytes_max < 8:
            raise ValueError("parser limits must be positive")
        #: Largest message payload accepted; an INFO with `max_payload` replaces it.
        self.payload_bytes_max = payload_bytes_max
        self.headers_bytes_max = headers_bytes_max
        self.control_line_bytes_max = control_line_bytes_max
        self._buf = b""  # unconsumed bytes of the last parse
        self._chunks: list[bytes] = []  # fed since, not yet joined
        self._chunks_len = 0
        self._need = 1  # bytes (tail + chunks) the next parse needs to make progress
        self._batches: dict[str, list[Any]] = {}  # sid -> [messages, payload bytes]
        self._events: list[Event] = []
        #: The C loop in use, or None: the Python loop alone.
        self._accelerated = _accelerated if accelerated else None
        self._broken: NatsProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet parsed (a partial operation)."""
        return len(self._buf) + self._chunks_len

    def feed(self, data: bytes) -> None:
        """Add received bytes and parse every complete operation in them.

        Raises `NatsProtocolError` on malformed input or a broken limit; afterwards every
        call raises it again. Messages and events parsed before the error stay takeable.
        """
        if self._broken is not None:
            raise self._broken
        if not data:
            return
        self._chunks.append(data)
        self._chunks_len += len(data)
        if len(self._buf) + self._chunks_len < self._need:
            return
        if self._buf:
            self._chunks.insert(0, self._buf)
        buf = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks = []
        self._chunks_len = 0
        try:
            self._parse(bytes(buf))
        except NatsProtocolError as exc:
            self._broken = exc
            raise

    def take_messages(self) -> list[SidBatch]:
        """Messages parsed since the last call, grouped by sid: [(sid, msgs, payload_bytes)].
        The lists are new on each call and belong to the caller."""
        if not self._batches:
            return []
        out = [(sid, pair[0], pair[1]) for sid, pair in self._batches.items()]
        self._batches = {}
        return out

    def take_events(self) -> list[Event]:
        """Control events parsed since the last call, in arrival order."""
        events, self._events = self._events, []
        return events

    def _parse(self, buf: bytes) -> None:
        line_max, payload_max = self.control_line_bytes_max, self.payload_bytes_max
        accelerated = self._accelerated
        if accelerated is None:
            pos, need, _ = self._parse_python(buf, 0, line_max, payload_max, False)
        else:
            # C parses the common operations and declines the rest, one of which Python
            # then parses (raising its errors) before C goes on.
            pos, n = 0, len(buf)
            while True:
                pos, need, slow = accelerated.parse(
                    buf, pos, self._batches, line_max, payload_max, self.headers_bytes_max,
                    _MSG_ID_BLOCK, MSG_ID)
                if not slow:
                    break
                pos, need, incomplete = self._parse_python(buf, pos, line_max, payload_max,
                                                           True)
                if incomplete or pos >= n:
                    break
        self._buf = buf[pos:] if pos else buf
        self._need = need

    def _parse_python(self, buf: bytes, pos: int, line_max: int, payload_max: int,
                      one: bool) -> tuple[int, int, bool]:
        """Parse from `pos` (only one operation with `one`): (where it stopped, the bytes it
        needs from there, whether it stopped before an operation not wholly here)."""
        # One long loop on purpose: a MSG costs no Python function call (see module doc).
        n = len(buf)
        find = buf.find
        batches = self._batches
        last_sid: str | None = None
        pair: list[Any] = []
        msgs: list[NatsMsg] = []
        nbytes = 0
        need = 1
        try:
            while pos < n:
                eol = find(b"\r\n", pos, pos + line_max + 2)
                if eol < 0:
                    if n - pos > line_max + 1:
                        raise NatsProtocolError(f"control line longer than {line_max} bytes",
                                                limit=line_max)
                    need = n - pos + 1
                    break
                # The server separates fields by one space; splitting on exactly " " (not on
                # any whitespace) keeps subjects with other odd characters intact.
                args = buf[pos:eol].decode("utf-8", "surrogateescape").split(" ")
                op = args[0]
                if op == OP_MSG:
                    nargs = len(args)
                    if nargs == 5:
                        _, subject, sid, reply, size_text = args
                    elif nargs == 4:
                        _, subject, sid, size_text = args
                        reply = None
                    else:
                        raise NatsProtocolError("wrong number of MSG fields")
                    if "" in args:  # two spaces in a row or a trailing space
                        raise NatsProtocolError("empty MSG field")
                    size = int(size_text)
                    if size > payload_max or size < 0:
                        raise _payload_error(size, payload_max)
                    start = eol + 2
                    end = start + size
                    if end + 2 > n:
                        need = end + 2 - pos
                        break
                    if buf[end] != 13 or buf[end + 1] != 10:
                        raise NatsProtocolError(f"payload of {size} bytes not followed by CRLF")
                    data = buf[start:end]
                    headers = None
                elif op == OP_HMSG:
                    if len(args) == 6 and "" not in args:  # the usual one: with a reply
                        _, subject, sid, reply, hdr_text, size_text = args
                        hdr_size, size = int(hdr_text), int(size_text)
                        if not 0 <= hdr_size <= size or size - hdr_size > payload_max or \
                                size > payload_max + self.headers_bytes_max:
                            self._hmsg_fields(args)  # raises, naming what is wrong
                    else:
                        subject, sid, reply, hdr_size, size = self._hmsg_fields(args)
                    start = eol + 2
                    end = start + size
                    if end + 2 > n:
                        need = end + 2 - pos
                        break
                    if buf[end] != 13 or buf[end + 1] != 10:
                        raise NatsProtocolError(f"payload of {size} bytes not followed by CRLF")
                    block = buf[start:start + hdr_size]
                    if block.startswith(_MSG_ID_BLOCK) and block.endswith(b"\r\n\r\n") and \
                            block.count(b"\r\n") == 3 and block.isascii():
                        # A publisher's Nats-Msg-Id alone: what parse_headers reads, sooner.
                        headers = {MSG_ID: block[_MSG_ID_BLOCK_LEN:-4].decode().strip()}
                    else:
                        headers = parse_headers(block)
                    data = buf[start + hdr_size:end]
                    size -= hdr_size
                else:
                    self._events.append(self._control(buf[pos:eol]))
                    pos = eol + 2
                    if one:
                        break
                    continue
                if sid != last_sid:
                    if last_sid is not None:
                        pair[1] += nbytes
                    pair = batches.get(sid) or batches.setdefault(sid, [[], 0])
                    msgs = pair[0]
                    nbytes = 0
                    last_sid = sid
                msgs.append((subject, reply, headers, data))
                nbytes += size
                pos = end + 2
                if one:
                    break
        except (NatsProtocolError, ValueError, IndexError, TypeError, RecursionError) as exc:
            if last_sid is not None:
                pair[1] += nbytes  # what was parsed stays takeable, with its byte count
            raise NatsProtocolError(f"bad NATS protocol data at {buf[pos:pos + 60]!r}: {exc}",
                                    **getattr(exc, "fields", {})) from exc
        if last_sid is not None:
            pair[1] += nbytes
        return pos, need, need > 1

    def _hmsg_fields(self, args: list[str]) -> tuple[str, str, str | None, int, int]:
        """(subject, sid, reply, header bytes, total bytes) of an HMSG line, checked."""
        if len(args) == 5:
            _, subject, sid, hdr_text, size_text = args
            reply = None
        elif len(args) == 6:
            _, subject, sid, reply, hdr_text, size_text = args
        else:
            raise NatsProtocolError("wrong number of HMSG fields")
        if "" in args:
            raise NatsProtocolError("empty HMSG field")
        hdr_size = int(hdr_text)
        size = int(size_text)
        if not 0 <= hdr_size <= size:
            raise NatsProtocolError(f"HMSG header size {hdr_size} outside [0, {size}]")
        # nats-server counts headers within max_payload; the allowance on top is slack for
        # messages routed from servers with other limits, never a reason to drop a good one.
        if size > self.payload_bytes_max + self.headers_bytes_max:
            limit = self.payload_bytes_max + self.headers_bytes_max
            raise NatsProtocolError(f"message of {size} bytes with headers exceeds the limit "
                                    f"of {limit}", size=size, limit=limit)
        if size - hdr_size > self.payload_bytes_max:
            raise _payload_error(size - hdr_size, self.payload_bytes_max)
        return subject, sid, reply, hdr_size, size

    def _control(self, line: bytes) -> Event:
        """A control operation other than MSG/HMSG (rare: one function call is fine)."""
        parts = line.split(None, 1)
        if not parts:
            raise NatsProtocolError("empty NATS control line")
        op = parts[0]
        rest = parts[1] if len(parts) == 2 else b""
        if op == OP_PING and not rest.strip():
            return _PING_EVENT
        if op == OP_PONG and not rest.strip():
            return _PONG_EVENT
        if op == OP_OK and not rest.strip():
            return _OK_EVENT
        if op == OP_ERR:
            return Err(rest.strip().strip(b"'").decode(errors="replace"))
        if op == OP_INFO:
            info = json.loads(rest)
            if not isinstance(info, dict):
                raise NatsProtocolError(f"INFO is not a JSON object: {rest[:80]!r}")
            max_payload = info.get("max_payload")
            if type(max_payload) is int and max_payload > 0:
                self.payload_bytes_max = min(max_payload, MAX_PAYLOAD_CEILING)
            return Info(info)
        raise NatsProtocolError(f"unknown NATS operation {line[:40]!r}")


def _payload_error(size: int, limit: int) -> NatsProtocolError:
    return NatsProtocolError(f"message payload of {size} bytes is negative or exceeds the "
                             f"max_payload of {limit}", size=size, limit=limit)


def parse_headers(block: bytes) -> dict[str, str]:
    """A NATS header block (`NATS/1.0[ status[ description]]\\r\\nKey: Value\\r\\n...\\r\\n`)
    as a dict, leniently (see the module doc): malformed lines are skipped, never raised."""
    text = block.decode(errors="replace")
    if text.startswith(_VERSION_LINE) and text.endswith("\r\n\r\n") and text.count("\r\n") == 3:
        # The common block: no status, one header (a publisher's Nats-Msg-Id).
        found = _header_line(text[len(_VERSION_LINE):-4])
        return {} if found is None else {found[0]: found[1]}
    lines = text.split("\r\n")
    headers: dict[str, str] = {}
    first = lines[0]
    if first.startswith(HEADER_VERSION):
        status = first[len(HEADER_VERSION):].strip()
        if status:
            code, _, description = status.partition(" ")
            headers[STATUS_KEY] = code
            description = description.strip()
            if description:
                headers[DESCRIPTION_KEY] = description
        lines = lines[1:]
    for line in lines:
        found = _header_line(line)
        if found is not None:
            headers[found[0]] = found[1]
    return headers


def _header_line(line: str) -> tuple[str, str] | None:
    """(name, value) of a `Name: value` line; None for a malformed one (no colon, an empty
    name, whitespace in the name)."""
    key, colon, value = line.partition(":")
    key = key.strip()
    if colon and key and _SPACE.search(key) is None:
        return key, value.strip()
    return None


# -- encoders (client -> server) ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    """The CONNECT fields this client sends. Credentials come from the server URL."""

    name: str | None = None
    version: str = "0"
    user: str | None = None
    password: str | None = None
    auth_token: str | None = None
    verbose: bool = False
    pedantic: bool = False
    headers: bool = True
    no_responders: bool = True


def connect_command(options: ConnectOptions) -> bytes:
    """`CONNECT {json}\\r\\n`. Credentials are included only when set."""
    fields: dict[str, Any] = {
        "verbose": options.verbose,
        "pedantic": options.pedantic,
        "headers": options.headers,
        "no_responders": options.no_responders and options.headers,
        "protocol": PROTOCOL,
        "lang": LANG,
        "version": options.version,
    }
    if options.name is not None:
        fields["name"] = options.name
    if options.user is not None:
        fields["user"] = options.user
        fields["pass"] = options.password or ""
    if options.auth_token is not None:
        fields["auth_token"] = options.auth_token
    return b"CONNECT " + json.dumps(fields, separators=(",", ":")).encode() + CRLF


def _is_token(value: str) -> bool:
    """Non-empty and free of what separates NATS protocol fields (space, tab, CR, LF)."""
    return bool(value) and not any(sep in value for sep in _SEPARATORS)


def _token(value: str, what: str) -> str:
    if not _is_token(value):
        raise InvalidNatsSubject(value, what)
    return value


def sub_command(subject: str, sid: str | int, queue: str | None = None) -> bytes:
    """`SUB <subject> [queue] <sid>\\r\\n`. An empty queue means no queue group."""
    parts = [_token(subject, "subject")]
    if queue:
        parts.append(_token(queue, "queue group"))
    parts.append(_token(str(sid), "sid"))
    return ("SUB " + " ".join(parts)).encode("utf-8", "surrogateescape") + CRLF


def unsub_command(sid: str | int, max_msgs: int | None = None) -> bytes:
    """`UNSUB <sid> [max_msgs]\\r\\n`: stop now, or after `max_msgs` more messages."""
    text = "UNSUB " + _token(str(sid), "sid")
    if max_msgs is not None:
        if max_msgs < 0:
            raise ValueError(f"max_msgs must be >= 0, not {max_msgs}")
        text += f" {max_msgs}"
    return text.encode() + CRLF


def pub_commands(messages: Sequence[tuple[str, bytes]]) -> bytes:
    """`PUB <subject> <#bytes>\\r\\n<payload>\\r\\n` for each (subject, payload), as one bytes.

    Subjects are checked all at once (their join must hold no field separator: space, tab,
    CR, LF), so a bad subject can never inject a protocol line. Other characters, even
    non-UTF-8 bytes of a reply subject kept as surrogates by the parser, go out as they came.
    """
    if _accelerated is not None:
        encoded: bytes | None = _accelerated.pub_commands(messages)
        if encoded is not None:
            return encoded  # the same bytes, from C (which declines what it would not check)
    return pub_commands_python(messages)


def pub_commands_python(messages: Sequence[tuple[str, bytes]]) -> bytes:
    """`pub_commands` in Python alone (what it falls back on when C declines or is absent)."""
    if not messages:
        return b""
    subjects = [subject for subject, _ in messages]
    joined = "".join(subjects)
    if "" in subjects or " " in joined or "\t" in joined or "\r" in joined or "\n" in joined:
        raise InvalidNatsSubject(next(s for s in subjects if not _is_token(s)))
    return b"".join([b"PUB %s %d\r\n%s\r\n" % (subject.encode("utf-8", "surrogateescape"),
                                                 len(payload), payload)
                     for subject, payload in messages])


def pong_command() -> bytes:
    """The answer to a server PING."""
    return PONG


def ping_command() -> bytes:
    """A PING: the server answers PONG after everything sent before it was processed."""
    return PING

