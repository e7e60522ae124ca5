"""GET over the socket API on a real broker: the socket API answers a GET the key index
covers as it reads the frame (no task) and hands one that must wait for `min_offset` to a
task; pipelined on one connection, both kinds are answered with the right values and
correlation ids, a waiting GET holds up none behind it, refusals keep their codes and the
connection, and each request is counted once."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import jetstream
from jetstream.client import BrokerConnection, PublishMessage
from jetstream.errors import NotCompacted, OffsetNotIndexed, UnknownStream
from jetstream.protocol import messages as m
from jetstream.server.process import BrokerProcess
from tests.integration.test_broker import (
    _requests_total,
    conn,  # noqa: F401 (a fixture)
)

STREAM, SUBJECT, KEYS = "table", "table.in", 50
WAIT_MS = 20_000


async def get(connection: BrokerConnection, key: bytes, min_offset: int = -1,
              wait_ms: int = 0) -> m.GetResponse:
    answer = await connection.request(m.GetRequest(STREAM, 0, key, min_offset, wait_ms),
                                      timeout_s=WAIT_MS / 1000 + 10)
    return m.expect_response(answer, m.GetResponse)


async def test_pipelined_gets_at_once_and_after_a_wait(
        broker: BrokerProcess, conn: BrokerConnection) -> None:  # noqa: F811
    async with jetstream.connect(broker.address) as js, \
            httpx.AsyncClient(base_url=broker.http_url, timeout=10) as http:
        await js.create_stream(STREAM, SUBJECT, cleanup_policy="compact")
        await js.create_stream("plain", "plain.in")
        acks = await js.publish_batch([PublishMessage(SUBJECT, b"v%d" % k, b"k%d" % k)
                                       for k in range(KEYS)], ack_policy="leader")
        last = max(a.offset for a in acks)
        # Indexed through the last publish: every GET below is answered at once.
        assert (await get(conn, b"k0", last, WAIT_MS)).value == b"v0"

        before = await _requests_total(http)
        # A GET waiting for an offset not written yet, then many that need no wait.
        waiting = asyncio.ensure_future(get(conn, b"k0", last + 1, WAIT_MS))
        answers = await asyncio.gather(*(get(conn, b"k%d" % (i % (KEYS + 5)))
                                         for i in range(400)))
        for i, answer in enumerate(answers):
            k = i % (KEYS + 5)
            if k < KEYS:
                assert (answer.found, answer.value, answer.offset) == (
                    True, b"v%d" % k, acks[k].offset)
            else:  # never written
                assert (answer.found, answer.offset) == (False, -1)
            assert answer.covered_offset == last + 1
        assert not waiting.done()  # it held up none of them

        # Refusals answered at once, each with its code, and the connection carries on.
        with pytest.raises(OffsetNotIndexed) as not_indexed:
            await get(conn, b"k1", last + 5)  # no wait asked for
        assert (not_indexed.value.fields["min_offset"],
                not_indexed.value.fields["covered_offset"]) == (last + 5, last + 1)
        with pytest.raises(UnknownStream):
            await conn.request(m.GetRequest("nowhere", 0, b"k1"))
        with pytest.raises(NotCompacted):
            await conn.request(m.GetRequest("plain", 0, b"k1"))

        # The waiting GET is answered once its offset is committed and indexed.
        newer = await js.publish(SUBJECT, b"v0-new", key=b"k0", ack_policy="leader")
        assert newer is not None and newer.offset == last + 1
        answer = await waiting
        assert (answer.found, answer.value, answer.offset) == (True, b"v0-new", last + 1)
        assert (await get(conn, b"k1")).value == b"v1"
        # 1 waiting + 400 + 3 refused + 1: each counted once, whichever way it was answered.
        assert await _requests_total(http) - before == 405
