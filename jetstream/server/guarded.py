"""The partition leader's guard (jetstream.idempotence) in the broker: rebuilt from the log
when leadership starts, and the expectations a publish carries, read from its envelope
fields, its NATS headers or an HTTP request.

Theory of operation: the leader opens a guard pass for every append that needs one (a
publish with expectations, or any append to a compacted stream, whose keys the guard
tracks), judges the append's publishes in order, appends what was admitted and commits the
pass; no await separates the judging from the append, so no other append can come between.
Plain NATS publishers speak through headers:

    Nats-Msg-Id                     message id (NATS JetStream's header)
    Jetstream-Expected-Offset       the offset the message must land at
    Nats-Expected-Last-Sequence     the same (JetStream's spelling: its last sequence N is
                                    our log end offset N)
    Jetstream-Check-Registers       a label selector the registers must match
    Jetstream-Union-Registers       `name=value,...` set with the message
    Jetstream-Subtract-Registers    `name=value,...` removed (where equal) with the message
    Jetstream-Producer-Id / -Epoch / -Sequence   an idempotent producer's stamp

A message that carries `Jetstream-Producer` or `Jetstream-Registers` itself is refused: those
headers are the log's record of the guard's decisions.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

from jetstream.errors import JetstreamError, ProtocolError
from jetstream.idempotence import headers as h
from jetstream.idempotence.dedupe import GuardLimits
from jetstream.idempotence.guard import (
    Duplicate,
    Expectations,
    Guard,
    Pass,
    ProducerSequence,
    Refused,
)
from jetstream.idempotence.replay import rebuild, scan_keys
from jetstream.protocol.envelope import Envelope
from jetstream.protocol.names import Selector, parse_selector
from jetstream.raft_meta.model import StreamConfig
from jetstream.server.config import BrokerConfig
from jetstream.stream.format import Record
from jetstream.stream.log import Log, wall_clock_ms

_log = logging.getLogger(__name__)

#: After a failed read of the log's tail, the guard's next try.
LOAD_RETRY_S = 1.0

EXPECTED_OFFSET = "Jetstream-Expected-Offset"
NATS_EXPECTED_LAST_SEQUENCE = "Nats-Expected-Last-Sequence"
CHECK_REGISTERS = "Jetstream-Check-Registers"
UNION_REGISTERS = "Jetstream-Union-Registers"
SUBTRACT_REGISTERS = "Jetstream-Subtract-Registers"
PRODUCER_ID = "Jetstream-Producer-Id"
PRODUCER_EPOCH = "Jetstream-Producer-Epoch"
PRODUCER_SEQUENCE = "Jetstream-Producer-Sequence"
PRODUCER_RESUME = "Jetstream-Producer-Resume"
#: Headers that ask something of the partition, and those a publisher may not set.
ASKING = frozenset({h.MSG_ID, EXPECTED_OFFSET, NATS_EXPECTED_LAST_SEQUENCE, CHECK_REGISTERS,
                    UNION_REGISTERS, SUBTRACT_REGISTERS, PRODUCER_ID, PRODUCER_EPOCH,
                    PRODUCER_SEQUENCE, PRODUCER_RESUME})
_WATCHED = ASKING | h.RESERVED


def limits_for(stream: StreamConfig, config: BrokerConfig) -> GuardLimits:
    return GuardLimits(duplicate_window_ms=stream.duplicate_window_ms,
                       ids_max=config.dedupe_ids_max,
                       producers_max=config.dedupe_producers_max,
                       sequences_max=config.dedupe_sequences_max,
                       keys_max=config.expectation_keys_max)


class PartitionGuard:
    """A leader's guard: None until `load` rebuilt it from the log. A leader serves at once
    (`serve`) and reads its guard from the log when an append first needs it: one with
    expectations, or any on a stream that tracks keys (`must_wait`); that append waits for
    it (`loaded`), and plain appends meanwhile carry nothing the guard would remember, so a
    broker starting thousands of leaders reads no log for those that never see an
    expectation. On a compacted stream `load` reads the log's tail only; then
    `load_older_keys` reads the keys of the older records, and until it has, a key
    expectation waits for it (`keys_loaded`)."""

    def __init__(self, stream: StreamConfig, config: BrokerConfig) -> None:
        self._stream = stream
        self._config = config
        self.guard: Guard | None = None
        self._source: tuple[Log, Executor | None, str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loaded = asyncio.Event()
        self._older_keys = asyncio.Event()
        self._older_keys.set()

    def serve(self, log: Log, executor: Executor | None, name: str) -> None:
        """The leader serves from now on: appends the guard must judge wait for it, and the
        first of them has it read from `log` (a task named `name`)."""
        self._source = (log, executor, name)

    def must_wait(self, has_expectations: bool) -> bool:
        """An append the guard must judge comes before the guard is loaded."""
        return self._source is not None and self.guard is None and (
            has_expectations or self._stream.cleanup_policy.compacts)

    async def loaded(self) -> None:
        """Until the guard is loaded (read from the log now if nothing asked before), or
        `release` (the leader stops: then `guard` may still be None)."""
        if self._task is None and self._source is not None and not self._loaded.is_set():
            log, executor, name = self._source
            self._task = asyncio.create_task(self._load_until_done(log, executor), name=name)
        await self._loaded.wait()

    def release(self) -> None:
        """The leader stops: no more loading, and every `loaded` waiter goes."""
        if self._task is not None:
            self._task.cancel()
        self._loaded.set()

    async def _load_until_done(self, log: Log, executor: Executor | None) -> None:
        """`load`, tried again after a failure (an IO error reading the log) until it
        succeeded or the leader stops (cancelling it); then the older keys, if any."""
        while True:
            try:
                await self.load(log, executor)
                break
            except Exception:
                _log.exception("%s: reading the log's tail for the guard failed: again in "
                               "%.1f s", log.directory, LOAD_RETRY_S)
                await asyncio.sleep(LOAD_RETRY_S)
        if self.keys_pending:
            await self.load_older_keys(log, executor)

    async def load(self, log: Log, executor: Executor | None) -> None:
        """Rebuild from the log (in a worker thread: it reads the log's tail)."""
        limits = limits_for(self._stream, self._config)
        guard = await asyncio.get_running_loop().run_in_executor(
            executor, functools.partial(rebuild, log, limits, wall_clock_ms(),
                                        track_keys=self._stream.cleanup_policy.compacts))
        if guard.track_keys and guard.keys_from > log.log_start_offset:
            self._older_keys.clear()
        self.guard = guard
        self._loaded.set()

    @property
    def keys_pending(self) -> bool:
        """The keys of records older than the tail `load` read are not known yet."""
        return not self._older_keys.is_set()

    async def keys_loaded(self) -> None:
        """Until `load_older_keys` ended (learned them, failed or was cancelled)."""
        await self._older_keys.wait()

    async def load_older_keys(self, log: Log, executor: Executor | None) -> None:
        """Read the keys of the records before the tail `load` read (in a worker thread) and
        hand them to the guard: from then on it judges key expectations on every key."""
        try:
            guard = self.guard
            if guard is None or not self.keys_pending:
                return
            start, end = log.log_start_offset, guard.keys_from
            older = await asyncio.get_running_loop().run_in_executor(
                executor, scan_keys, log, start, end)
            if guard.learn_older_keys(older, start, end):
                _log.info("%s: keys of offsets [%d, %d) learned (%d keys)", log.directory,
                          start, end, len(older))
        finally:
            self._older_keys.set()

    def reconfigure(self, stream: StreamConfig, log: Log) -> None:
        self._stream = stream
        guard = self.guard
        if guard is None:
            return
        limits = limits_for(stream, self._config)
        guard.limits = guard.ids.limits = guard.producers.limits = limits
        compacts = stream.cleanup_policy.compacts
        if compacts and not guard.track_keys:  # keys written so far are not known
            guard.keys_from = log.log_end_offset
        guard.track_keys = compacts

    @property
    def ready(self) -> bool:
        """Loaded from the log: the guard judges appends."""
        return self.guard is not None

    @property
    def registers(self) -> dict[str, str]:
        return dict(self.guard.registers) if self.guard is not None else {}

    def needed(self, has_expectations: bool) -> bool:
        return self.guard is not None and (has_expectations or self.guard.track_keys)

    def begin(self, log: Log) -> Pass:
        assert self.guard is not None
        return self.guard.begin(log.log_end_offset, log.log_start_offset, wall_clock_ms())


# -- what a publish asks -------------------------------------------------------------------------


def from_nats_headers(headers: Mapping[str, str]) -> Expectations | str | None:
    """The expectations in a plain message's NATS headers; None when it has none, the
    message id alone when that is all (the common case, judged by `Pass.admit_id`). Raises
    ProtocolError for a malformed one."""
    if _WATCHED.isdisjoint(headers):
        return None
    if len(headers) == 1 and h.MSG_ID in headers:
        return h.check_msg_id(headers[h.MSG_ID])
    producer = None
    if PRODUCER_ID in headers:
        producer = (headers[PRODUCER_ID], _int(headers, PRODUCER_EPOCH, 0),
                    _int(headers, PRODUCER_SEQUENCE, None), _bool(headers, PRODUCER_RESUME))
    expected = _int(headers, EXPECTED_OFFSET, None)
    alias = _int(headers, NATS_EXPECTED_LAST_SEQUENCE, None)
    if expected is not None and alias is not None and expected != alias:
        raise ProtocolError(f"{EXPECTED_OFFSET} and {NATS_EXPECTED_LAST_SEQUENCE} disagree",
                            field=EXPECTED_OFFSET)
    return expectations(
        headers, msg_id=headers.get(h.MSG_ID), producer=producer,
        expected_offset=expected if expected is not None else alias,
        check_registers=headers.get(CHECK_REGISTERS),
        union_registers=_labels(headers, UNION_REGISTERS),
        subtract_registers=_labels(headers, SUBTRACT_REGISTERS))


def from_envelope(envelope: Envelope) -> Expectations | None:
    """The expectations of an envelope (its fields; a `Nats-Msg-Id` record header counts as
    its message id)."""
    return expectations(
        envelope.headers, msg_id=envelope.msg_id, producer=envelope.producer,
        expected_offset=envelope.expected_offset,
        expected_key_offset=envelope.expected_last_offset_for_key,
        check_registers=envelope.check_registers,
        union_registers=envelope.union_registers,
        subtract_registers=envelope.subtract_registers)


def expectations(record_headers: Mapping[str, Any], *, msg_id: str | None = None,
                 producer: Sequence[Any] | None = None,
                 expected_offset: int | None = None, expected_key_offset: int | None = None,
                 check_registers: str | None = None,
                 union_registers: Mapping[str, str] | None = None,
                 subtract_registers: Mapping[str, str] | None = None) -> Expectations | None:
    """Checked expectations (None when there are none). Raises ProtocolError."""
    reserved = h.RESERVED.intersection(record_headers) if record_headers else None
    if reserved:
        name = min(reserved)
        raise ProtocolError(f"header {name} is the log's own: a publisher cannot set it",
                            field=name)
    if msg_id is None and h.MSG_ID in record_headers:
        header = record_headers[h.MSG_ID]
        msg_id = header.decode(errors="replace") if isinstance(header, bytes) else header
    if msg_id is not None:
        h.check_msg_id(msg_id)
    stamp = None
    if producer is not None:
        h.check_stamp(producer)
        stamp = ProducerSequence(*producer)
    for name, value, low in (("expected_offset", expected_offset, 0),
                             ("expected_last_offset_for_key", expected_key_offset, -1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < low):
            raise ProtocolError(f"{name} must be an integer of at least {low}", field=name)
    selector = _selector(check_registers) if check_registers is not None else None
    union = (h.check_registers(union_registers, "union_registers")
             if union_registers else None)
    subtract = (h.check_registers(subtract_registers, "subtract_registers")
                if subtract_registers else None)
    if (msg_id is None and stamp is None and expected_offset is None
            and expected_key_offset is None and selector is None and not union
            and not subtract):
        return None
    return Expectations(msg_id, stamp, expected_offset, expected_key_offset, selector, union,
                        subtract)


@functools.lru_cache(maxsize=256)
def _selector(text: str) -> Selector:
    try:
        return parse_selector(text, "check_registers")
    except JetstreamError as exc:
        raise ProtocolError(str(exc), field="check_registers") from None


def _int(headers: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = headers.get(name)
    if text is None:
        return default
    try:
        return int(text.strip())
    except ValueError:
        raise ProtocolError(f"header {name} must be an integer, got {text!r}",
                            field=name) from None


def _bool(headers: Mapping[str, str], name: str) -> bool:
    text = headers.get(name, "false").strip().lower()
    if text not in ("true", "false"):
        raise ProtocolError(f"header {name} must be true or false, got {text!r}", field=name)
    return text == "true"


def _labels(headers: Mapping[str, str], name: str) -> dict[str, str] | None:
    text = headers.get(name)
    if text is None:
        return None
    labels: dict[str, str] = {}
    for item in text.split(","):
        label, sep, value = item.strip().partition("=")
        if not sep:
            raise ProtocolError(f"header {name} must be name=value,..., got {text!r}",
                                field=name)
        labels[label.strip()] = value.strip()
    return labels


def judge_direct(guarded: PartitionGuard, log: Log, records: list[Record],
                 expect: Expectations | None) -> int | tuple[list[Record], Pass | None]:
    """Judge one publish of `records` that did not come through NATS, whose expectations
    are `expect` (those of its records' headers included; None: it has none): the original
    offset of a retry, or the records to append (with the guard's headers) and the pass to
    commit after the append. Raises the refusal."""
    if not guarded.needed(expect is not None):
        return records, None
    guard_pass = guarded.begin(log)
    keys = [r.key for r in records]
    if expect is None:
        guard_pass.plain(keys)
        return records, guard_pass
    verdict = guard_pass.admit(expect, keys)
    if isinstance(verdict, Duplicate):
        guard_pass.commit()  # the producer sequence a duplicate in order moved on
        return verdict.offset
    if isinstance(verdict, Refused):
        raise verdict.error
    out = list(records)
    out[0] = out[0]._replace(headers={**out[0].headers, **verdict.first_headers})
    out[-1] = out[-1]._replace(headers={**out[-1].headers, **verdict.last_headers})
    return out, guard_pass


def from_http(headers: Mapping[str, str], body: Mapping[str, Any],
              records: list[Record]) -> Expectations | None:
    """The expectations of an HTTP append: the NATS header names as HTTP headers (any case),
    or the same fields as the envelope's in the JSON body. Raises ProtocolError."""
    asked = {name: headers[name] for name in _WATCHED if name in headers}
    from_headers = from_nats_headers(asked) if asked else None
    if isinstance(from_headers, str):
        from_headers = Expectations(from_headers)
    from_body = expectations(
        records[0].headers, msg_id=body.get("msg_id"), producer=body.get("producer"),
        expected_offset=body.get("expected_offset"),
        expected_key_offset=body.get("expected_last_offset_for_key"),
        check_registers=body.get("check_registers"),
        union_registers=body.get("union_registers"),
        subtract_registers=body.get("subtract_registers"))
    if from_headers is not None and from_body is not None:
        raise ProtocolError("give expectations as headers or in the body, not both",
                            field="expectations")
    return from_headers or from_body
