"""GETs answered in bulk (jetstream.server.bulk_gets and its C part) against the usual way:
the frames `take` cuts from a buffer decode to the requests the frame decoder gives for
them, frame by frame, whatever else is in the stream; `encode_gets` writes the bytes that
encode_response gives for the GetResponse the key index and the KV handler make of an
entry; the key index's raw entries are what `get` reads."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jetstream.compaction.key_index import SHORT_KEY_MAX, KeyIndex, decode_entry, encode_entry
from jetstream.errors import FrameError
from jetstream.protocol import frames
from jetstream.protocol import messages as m
from jetstream.protocol.codec import decode_request, encode_request
from jetstream.protocol.frames import (
    PREFIX,
    REQUEST_FRAME_BYTES_MAX,
    RESPONSE_HEADER_BYTES_MAX,
    FrameDecoder,
    Kind,
    Op,
)
from jetstream.server import bulk_gets
from jetstream.stream.format import StoredRecord

pytestmark = pytest.mark.skipif(not bulk_gets.ACCELERATED,
                                reason="jetstream/server/_gets_c.c is not built")

FIELDS = ("stream", "partition", "key", "min_offset", "max_wait_ms", "read_replica")


def raw_frame(cid: int, kind: int, op: int, header: bytes, payload: bytes = b"") -> bytes:
    return PREFIX.pack(10 + len(header) + len(payload), cid, kind, op, len(header)) + header \
        + payload


def fixmap(entries: list[tuple[str, bytes]]) -> bytes:
    """A fixmap of fixstr keys and already encoded values (a key may come twice)."""
    out = bytes([0x80 | len(entries)])
    for name, value in entries:
        out += msgpack.packb(name) + value
    return out


#: Per field: values GetRequest accepts, and values it refuses (or of another type).
values = {
    "stream": (st.sampled_from(["table", "a", "A-b_9", "x" * 64]),
               st.one_of(st.sampled_from(["", "x" * 65, "bad name", "tablé", "a.b"]),
                         st.integers(0, 5))),
    "partition": (st.one_of(st.integers(0, 3), st.just(2**31 - 1)),
                  st.one_of(st.sampled_from([2**31, -1, 2**40]), st.booleans(),
                            st.just("0"))),
    "key": (st.one_of(st.binary(max_size=300), st.just(b"k" * 65_536)),
            st.one_of(st.just(b"k" * 65_537), st.text(max_size=3), st.none())),
    "min_offset": (st.one_of(st.integers(-1, 10**6), st.just(2**63 - 1)),
                   st.one_of(st.sampled_from([-2, -129, 2**63]), st.none())),
    "max_wait_ms": (st.one_of(st.integers(0, 100), st.just(60_000)),
                    st.one_of(st.sampled_from([60_001, -1]), st.booleans())),
    "read_replica": (st.booleans(), st.sampled_from([0, 1, None])),
}


def value_of(draw: st.DrawFn, name: str) -> object:
    """Mostly a value GetRequest accepts, one time in five one it refuses."""
    good, wrong = values[name]
    return draw(wrong if draw(st.integers(0, 4)) == 0 else good)


@st.composite
def get_headers(draw: st.DrawFn) -> bytes:
    """A GET header: usually a map of some of the fields, some values wrong, sometimes an
    unknown field, a field twice, or another encoding of the same map."""
    names = draw(st.lists(st.sampled_from(FIELDS), unique=True, min_size=0, max_size=6))
    if draw(st.integers(0, 4)) > 0:  # mostly the required three
        names = list(dict.fromkeys(["stream", "partition", "key", *names]))
    entries = [(n, msgpack.packb(value_of(draw, n), use_bin_type=True)) for n in names]
    twist = draw(st.integers(0, 9))
    if twist == 0:
        entries.append(("other", msgpack.packb(1)))
    elif twist == 1 and entries:
        entries.append(entries[0])
    elif twist == 2:  # the same map as map16, and with a str8 key
        return b"\xde" + struct.pack(">H", len(entries)) + b"".join(
            msgpack.packb(n) + v for n, v in entries)
    elif twist == 3 and entries:
        entries[0] = ("", entries[0][1])
        return fixmap(entries)
    header = fixmap(entries)
    if twist == 4:
        header += b"\x00"  # bytes after the map
    elif twist == 5:
        header = header[:draw(st.integers(0, max(len(header) - 1, 0)))]
    return header


@st.composite
def usual_get(draw: st.DrawFn) -> m.GetRequest:
    return m.GetRequest(draw(st.sampled_from(["table", "t-2", "x" * 64])),
                        draw(st.integers(0, 2**31 - 1)), draw(st.binary(max_size=300)),
                        draw(st.integers(-1, 2**63 - 1)), draw(st.integers(0, 60_000)),
                        draw(st.booleans()))


@st.composite
def frame_streams(draw: st.DrawFn) -> tuple[bytes, set[int]]:
    """Frames in a row, and the correlation ids of those made by encode_request from a
    GetRequest (the bulk path must take these)."""
    out, usual = b"", set()
    for cid in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 7))
        if kind <= 2:
            out += encode_request(cid, draw(usual_get()))
            usual.add(cid)
        elif kind <= 4:
            out += raw_frame(cid, Kind.REQUEST, Op.GET, draw(get_headers()))
        elif kind == 5:  # another op, a response, a payload, a kind that does not exist
            op, k, payload = draw(st.sampled_from([(Op.FETCH, Kind.REQUEST, b""),
                                                   (Op.GET, Kind.RESPONSE, b""),
                                                   (Op.GET, Kind.REQUEST, b"p"),
                                                   (Op.GET, 9, b"")]))
            out += raw_frame(cid, k, op, fixmap([("stream", msgpack.packb("table"))]), payload)
        elif kind == 6:
            out += encode_request(cid, m.FetchRequest("table", 0, 0, 1024, 0))
        else:  # a length over the limit, or a header longer than its frame
            out += draw(st.sampled_from([
                struct.pack(">I", REQUEST_FRAME_BYTES_MAX + 1) + b"\x00" * 10,
                PREFIX.pack(12, cid, Kind.REQUEST, Op.GET, 5) + b"\x80\x80"]))
    if draw(st.booleans()):
        out = out[:draw(st.integers(0, len(out)))]
    return out, usual


def outcome(frame: frames.Frame) -> tuple[int, Any]:
    try:
        return frame.correlation_id, decode_request(frame)
    except Exception as exc:
        return frame.correlation_id, (type(exc), str(exc))


def usual_way(data: bytes, chunk: int) -> tuple[list[tuple[int, Any]], str | None]:
    decoder = FrameDecoder(frame_bytes_max=REQUEST_FRAME_BYTES_MAX)
    out: list[tuple[int, Any]] = []
    try:
        for start in range(0, len(data), chunk):
            decoder.feed(data[start:start + chunk])
            for frame in decoder:  # one at a time: those before a FrameError are kept
                out.append(outcome(frame))  # noqa: PERF401
    except FrameError as exc:
        return out, str(exc)
    return out, None


def bulk_way(data: bytes, chunk: int, limit: int) -> tuple[list[tuple[int, Any]], str | None,
                                                           set[int]]:
    decoder = FrameDecoder(frame_bytes_max=REQUEST_FRAME_BYTES_MAX)
    out: list[tuple[int, Any]] = []
    taken: set[int] = set()
    try:
        for start in range(0, len(data), chunk):
            decoder.feed(data[start:start + chunk])
            while True:
                calls = bulk_gets.take(decoder, limit)
                if calls:
                    assert len(calls) <= limit
                    for call in calls:
                        frame = bulk_gets.as_frame(call)
                        cid, request = outcome(frame)
                        assert isinstance(request, m.GetRequest), request
                        out.append((cid, request))
                        taken.add(cid)
                    continue
                frame = decoder.next_frame()
                if frame is None:
                    break
                out.append(outcome(frame))
    except FrameError as exc:
        return out, str(exc), taken
    return out, None, taken


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame_streams(), st.sampled_from([1, 7, 64, 1 << 20]), st.integers(1, 4))
def test_taken_gets_are_the_requests_the_frame_decoder_gives(
        stream: tuple[bytes, set[int]], chunk: int, limit: int) -> None:
    data, usual = stream
    expected, expected_error = usual_way(data, chunk)
    got, error, taken = bulk_way(data, chunk, limit)
    assert got == expected
    assert error == expected_error
    # Every whole GET encode_request made went the bulk way.
    decoded = {cid for cid, _ in expected}
    assert usual & decoded <= taken


@pytest.mark.parametrize(("field", "accepted", "refused"), [
    ("stream", "x" * 64, "x" * 65),
    ("partition", 2**31 - 1, 2**31),
    ("key", b"k" * 65_000, "k"),  # (a longer key does not fit a request's header)
    ("min_offset", -1, -2),
    ("min_offset", 2**63 - 1, 2**63),
    ("max_wait_ms", 60_000, 60_001),
    ("max_wait_ms", 0, -1),
])
def test_each_bound_is_where_get_request_puts_it(field: str, accepted: object,
                                                 refused: object) -> None:
    """A value at the bound is taken and decodes as taken; the next one is left to the
    frame decoder, whose request refuses it."""
    fields: dict[str, object] = {"stream": "table", "partition": 0, "key": b"k"}
    for value, taken in ((accepted, True), (refused, False)):
        header = msgpack.packb({**fields, field: value}, use_bin_type=True)
        data = raw_frame(1, Kind.REQUEST, Op.GET, header)
        assert bulk_way(data, len(data), 4)[0] == usual_way(data, len(data))[0]
        assert bool(bulk_way(data, len(data), 4)[2]) is taken


def test_the_decoder_tells_the_front_frame_s_kind_and_op_once_its_prefix_is_in() -> None:
    get = encode_request(7, m.GetRequest("table", 0, b"k"))
    decoder = FrameDecoder(frame_bytes_max=REQUEST_FRAME_BYTES_MAX)
    decoder.feed(get[:PREFIX.size - 1])
    assert not decoder.front_is(Kind.REQUEST, Op.GET)
    decoder.feed(get[PREFIX.size - 1:PREFIX.size])
    assert decoder.front_is(Kind.REQUEST, Op.GET)
    assert not decoder.front_is(Kind.REQUEST, Op.FETCH)
    assert not decoder.front_is(Kind.RESPONSE, Op.GET)
    decoder.feed(get[PREFIX.size:] + encode_request(8, m.FetchRequest("table", 0, 0, 1024, 0)))
    assert decoder.next_frame() is not None
    assert decoder.front_is(Kind.REQUEST, Op.FETCH)


def test_take_leaves_a_frame_cut_short_and_resumes_with_it() -> None:
    whole = encode_request(7, m.GetRequest("table", 0, b"k"))
    decoder = FrameDecoder(frame_bytes_max=REQUEST_FRAME_BYTES_MAX)
    decoder.feed(whole + whole[:-1])
    assert [c[0] for c in bulk_gets.take(decoder)] == [7]
    assert decoder.buffered_bytes == len(whole) - 1
    assert bulk_gets.take(decoder) == []
    decoder.feed(whole[-1:])
    assert bulk_gets.take(decoder) == [(7, "table", 0, b"k", -1, 0, False)]
    assert decoder.buffered_bytes == 0


# -- answers ----------------------------------------------------------------------------------

header_names = st.one_of(st.sampled_from(["a", "Content-Type", "x" * 40, "n" * 300]),
                         st.text(max_size=4))


@st.composite
def entries(draw: st.DrawFn) -> tuple[bytes, bytes | None]:
    """(the key asked for, its raw index entry or None)."""
    key = draw(st.one_of(st.binary(min_size=1, max_size=20),
                         st.just(b"L" * (SHORT_KEY_MAX + 1))))
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return key, None
    value = draw(st.one_of(st.none(), st.binary(max_size=300), st.just(b"v" * 70_000)))
    headers = draw(st.dictionaries(header_names, st.binary(max_size=300), max_size=4))
    offset = draw(st.one_of(st.integers(0, 2**63 - 1), st.sampled_from([0, 127, 128, 65536])))
    timestamp = draw(st.one_of(st.integers(-2**63, 2**63 - 1),
                               st.sampled_from([-1, -33, -129, -32769, 1_700_000_000_000])))
    stored_key = key[:-1] + b"M" if kind == 1 else key  # a hashed one: another key's
    raw = encode_entry(StoredRecord(offset, timestamp, value, stored_key, headers, "", 0))
    if kind == 2:  # cut short
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif kind == 3:  # an offset below -1
        raw = struct.pack(">q", draw(st.integers(-2**63, -2))) + raw[8:]
    elif kind == 4:  # a header name twice
        count = struct.unpack_from(">H", raw, 25)[0]
        raw = raw[:25] + struct.pack(">H", count + 2) + raw[27:] + \
            2 * (b"\x00\x01a" + struct.pack(">I", 1) + b"x")
    return key, raw


def reference(cid: int, key: bytes, raw: bytes | None, covered: int) -> bytes:
    """What the usual way answers: KeyIndex.get, then KeyValue._lookup, then encoding."""
    entry, stored = decode_entry(raw) if raw is not None else (None, None)
    if entry is None or (stored is not None and stored != key):
        response = m.GetResponse(False, covered_offset=covered)
    else:
        response = m.GetResponse(True, entry.value is None, entry.offset, entry.timestamp_ms,
                                 entry.value, dict(entry.headers), covered)
    return m.encode_response(cid, Op.GET, response)


def declines(key: bytes, raw: bytes | None, header_max: int, usual: bytes | None) -> bool:
    """Whether encode_gets leaves the entry to the Python code: laid out past its end, an
    offset under -1, a header name not ASCII or twice, or a header over `header_max`."""
    if raw is None:
        return False
    if len(raw) < 27:
        return True
    offset, _ts, flags, key_len, value_len, count = struct.unpack_from(">qqBIIH", raw)
    p = 27
    if flags & 2:
        if key_len > len(raw) - p:
            return True
        if raw[p:p + key_len] != key:
            return False  # another key's entry: not found
        p += key_len
    if value_len > len(raw) - p or offset < -1 or count > 64:
        return True
    p += value_len
    names = set()
    for _ in range(count):
        if len(raw) - p < 2:
            return True
        (n,) = struct.unpack_from(">H", raw, p)
        name = raw[p + 2:p + 2 + n]
        if n > len(raw) - p - 2 or not name.isascii() or name in names:
            return True
        names.add(name)
        p += 2 + n
        if len(raw) - p < 4:
            return True
        (v,) = struct.unpack_from(">I", raw, p)
        if v > len(raw) - p - 4:
            return True
        p += 4 + v
    assert usual is not None
    return len(usual) - PREFIX.size > header_max


def split(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        out.append(data[pos:pos + 4 + length])
        pos += 4 + length
    assert pos == len(data)
    return out


@settings(max_examples=500, deadline=None)
@given(st.lists(entries(), max_size=8), st.integers(0, 2**63 - 1),
       st.sampled_from([RESPONSE_HEADER_BYTES_MAX, 200]))
def test_encoded_answers_are_what_the_usual_way_sends(
        items: list[tuple[bytes, bytes | None]], covered: int, header_max: int) -> None:
    from jetstream.server import _gets_c  # the skip mark covers its absence
    cids = [i * 1000 + 1 for i in range(len(items))]
    keys = [key for key, _ in items]
    raws = [raw for _, raw in items]
    data, declined = _gets_c.encode_gets(cids, keys, raws, covered, header_max)
    usual: list[bytes | None] = []
    for cid, key, raw in zip(cids, keys, raws, strict=True):
        try:
            usual.append(reference(cid, key, raw, covered))
        except Exception:  # the usual way refuses it (an offset under -1, a cut entry)
            usual.append(None)
    expected = [i for i in range(len(items))
                if declines(keys[i], raws[i], header_max, usual[i])]
    assert declined == expected
    assert split(data) == [usual[i] for i in range(len(items)) if i not in declined]


def test_raw_entries_are_what_get_reads(tmp_path: Path) -> None:
    index = KeyIndex.open(tmp_path / "keys.lmdb", created_version=1)
    long_key = b"L" * (SHORT_KEY_MAX + 5)
    index.apply([StoredRecord(3, 10, b"1", b"a", {"h": b"x"}, "", 0),
                 StoredRecord(4, 11, None, long_key, {}, "", 0)], 5)
    asked = [b"a", long_key, b"never", long_key[:-1] + b"M"]
    raws = index.raw_entries(asked)
    assert [raw is not None for raw in raws] == [True, True, False, False]
    for key, raw in zip(asked[:2], raws[:2], strict=True):
        assert raw is not None
        assert decode_entry(raw)[0] == index.get(key)


# -- the bulk path's choices ------------------------------------------------------------------


class FakeKeyValue:
    """A KeyValue of two readable partitions, ("table", 0) covering 10 and ("table", 1)
    covering 3, whose index holds b"k" (offset 2) and whose partition 1 cannot be read."""

    def __init__(self) -> None:
        self.reads: list[tuple[tuple[str, int], list[bytes]]] = []

    def readable(self, stream: str, partition: int, read_replica: bool
                 ) -> tuple[tuple[str, int], object, int] | None:
        if stream != "table" or read_replica:
            return None
        return (stream, partition), object(), {0: 10, 1: 3}[partition]

    def raw_entries(self, key: tuple[str, int], log_: object, keys: list[bytes]
                    ) -> list[bytes | None]:
        self.reads.append((key, keys))
        if key[1] == 1:
            raise OSError("the index cannot be read")
        entry = encode_entry(StoredRecord(2, 5, b"v", b"k", {}, "", 0))
        return [entry if k == b"k" else None for k in keys]


def test_answer_groups_by_partition_and_leaves_the_rest_to_the_usual_way() -> None:
    kv = FakeKeyValue()
    bulk = bulk_gets.BulkGets(kv)  # type: ignore[arg-type]
    calls: list[bulk_gets.GetCall] = [
        (1, "table", 0, b"k", -1, 0, False),
        (2, "other", 0, b"k", -1, 0, False),      # not readable here
        (3, "table", 0, b"absent", 9, 0, False),  # min_offset 9 < covered 10: answered
        (4, "table", 0, b"k", 10, 500, False),    # waits for offset 10
        (5, "table", 1, b"k", -1, 0, False),      # its index cannot be read
        (6, "table", 0, b"k", -1, 0, True),       # read_replica: not readable here
    ]
    data, rest = bulk.answer(calls)
    assert split(data) == [reference(1, b"k", kv.raw_entries(("table", 0), None, [b"k"])[0], 10),
                           reference(3, b"absent", None, 10)]
    assert sorted(call[0] for call in rest) == [2, 4, 5, 6]
    assert kv.reads[0] == (("table", 0), [b"k", b"absent"])  # one read for the partition

    asked: list[m.GetRequest] = []

    def refuse(request: m.GetRequest) -> bool:
        asked.append(request)
        return False

    data, rest = bulk.answer(calls[:1] + calls[2:3], refuse)
    assert (data, [c[0] for c in rest]) == (b"", [1, 3])
    assert asked == [m.GetRequest("table", 0, b"k")]  # asked once for the partition
