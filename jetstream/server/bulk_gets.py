"""GET requests answered in bulk: a run of GET frames taken from a connection's buffer at once,
looked up in one LMDB transaction per partition, and answered with one write.

Theory of operation: a client reading a KV table pipelines GETs, and each one the usual way
(frame decoder, typed request, handler, typed response, encoder) costs tens of
microseconds of Python, many times the lookup itself. When the C part
(jetstream/server/_gets_c.c) is built, the socket API hands this module the front of its
receive buffer: `take` cuts every whole GET request frame of the usual shape from it
(`take_gets`: the six fields of GetRequest, each checked as GetRequest checks it), and
`answer` groups them by partition, asks the key index handler (jetstream.server.kv) once per
partition whether the index may answer here now, reads every key's entry in one read
transaction and writes all the response frames at once (`encode_gets`: the bytes
encode_response gives for the GetResponse the usual way makes).

Anything else goes the usual way, which stays the reference: a frame `take` leaves is
decoded by the frame decoder, and a call `answer` does not answer (a partition not led here,
an index that does not cover `min_offset` yet, a principal the gatekeeper would refuse, an
entry `encode_gets` declines) is handed back to become a frame again (`as_frame`), whose
request the socket API decodes, answers, waits for or refuses as it does any other.
Differential tests hold both ways to the same frames and answers.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from jetstream.protocol import frames
from jetstream.protocol.fields import FETCH_WAIT_MS_MAX, OFFSET_MAX, PARTITION_MAX
from jetstream.protocol.frames import RESPONSE_HEADER_BYTES_MAX, FrameDecoder, Kind, Op
from jetstream.protocol.kv import KEY_BYTES_MAX, GetRequest
from jetstream.server.kv import KeyValue

_gets_c: ModuleType | None
try:
    from jetstream.server import _gets_c
except ImportError:  # built without a C compiler: every GET goes the usual way
    _gets_c = None

#: Whether GETs are answered in bulk (the C part is built).
ACCELERATED = _gets_c is not None

#: A GET taken from a frame: (correlation_id, stream, partition, key, min_offset,
#: max_wait_ms, read_replica).
GetCall = tuple[int, str, int, bytes, int, int, bool]
#: Whether the connection's principal may send a request now (the gatekeeper's `may_now`).
MayNow = Callable[[GetRequest], bool]

#: Most GETs taken from a buffer at once (one answer of the connection's queue).
TAKEN_MAX = 256
_BOUNDS = (PARTITION_MAX, KEY_BYTES_MAX, OFFSET_MAX, FETCH_WAIT_MS_MAX)


def as_frame(call: GetCall) -> frames.Frame:
    """The frame `call` was taken from, as the frame decoder gives it (every field present:
    decoding gives the same request)."""
    cid, stream, partition, key, min_offset, max_wait_ms, read_replica = call
    return frames.Frame(cid, Kind.REQUEST, Op.GET, {
        "stream": stream, "partition": partition, "key": key, "min_offset": min_offset,
        "max_wait_ms": max_wait_ms, "read_replica": read_replica})


def take(decoder: FrameDecoder, limit: int = TAKEN_MAX) -> list[GetCall]:
    """The GETs at the front of `decoder`'s buffer, at most `limit`, taken out of it (none
    without the C part)."""
    calls: list[GetCall] = []
    if _gets_c is not None:
        take_gets = _gets_c.take_gets
        decoder.take_with(lambda buf, pos: take_gets(
            buf, pos, decoder.frame_bytes_max, decoder.header_bytes_max, limit, calls,
            _BOUNDS))
    return calls


class BulkGets:
    def __init__(self, kv: KeyValue) -> None:
        if _gets_c is None:
            raise RuntimeError("bulk GETs need jetstream/server/_gets_c.c built")
        self._kv = kv
        self._encode = _gets_c.encode_gets
        self.take = take

    def answer(self, calls: list[GetCall], may_now: MayNow | None = None
               ) -> tuple[bytes, list[GetCall]]:
        """The response frames of the calls answered here, joined, and the calls left for the
        usual way. `may_now`: the connection's gatekeeper check, when requests are
        authenticated or authorized."""
        groups: dict[tuple[str, int, bool], list[GetCall]] = {}
        for call in calls:
            group = groups.get((call[1], call[2], call[6]))
            if group is None:
                groups[(call[1], call[2], call[6])] = [call]
            else:
                group.append(call)
        answered: list[bytes] = []
        rest: list[GetCall] = []
        for (stream, partition, read_replica), group in groups.items():
            readable = self._kv.readable(stream, partition, read_replica)
            if readable is None or (may_now is not None and not may_now(
                    GetRequest(stream, partition, group[0][3], read_replica=read_replica))):
                rest += group
                continue
            key, log_, covered = readable
            ready = [call for call in group if call[4] < covered]
            if len(ready) < len(group):  # waits for min_offset, or refused: the usual way
                rest += [call for call in group if call[4] >= covered]
            if not ready:
                continue
            keys = [call[3] for call in ready]
            try:
                raws = self._kv.raw_entries(key, log_, keys)
            except Exception:  # an index that cannot be read: the usual way refuses each
                rest += ready
                continue
            data, declined = self._encode([call[0] for call in ready], keys, raws, covered,
                                          RESPONSE_HEADER_BYTES_MAX)
            answered.append(data)
            rest += [ready[i] for i in declined]
        return b"".join(answered), rest
