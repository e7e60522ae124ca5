"""The order and pace of the ingest connection's dial attempts (nats_dial.Dialer), with a
fake dial: no sockets."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from jetstream.server.nats_dial import Dialer, ServerAddress
from jetstream.server.nats_errors import NatsConnectFailed, NatsConnectionClosed, NatsUnsupported

SERVERS = [ServerAddress("a", 1), ServerAddress("b", 2), ServerAddress("c", 3)]


class FakeDial:
    """Refuses every server but those in `accept`; records the attempts."""

    def __init__(self, accept: Iterable[str] = (), unsupported: Iterable[str] = ()) -> None:
        self.accept = set(accept)
        self.unsupported = set(unsupported)
        self.tried: list[str] = []

    async def __call__(self, server: ServerAddress) -> None:
        self.tried.append(server.host)
        if server.host in self.unsupported:
            raise NatsUnsupported(f"{server} requires TLS")
        if server.host not in self.accept:
            raise ConnectionRefusedError(f"{server} refused")


def dialer(dial: FakeDial, attempts_max: int | None = None) -> Dialer:
    return Dialer(SERVERS, dial, wait_s=0.001, wait_max_s=0.002, attempts_max=attempts_max)


async def test_first_dial_tries_in_order_and_keeps_the_one_that_accepted() -> None:
    dial = FakeDial(accept={"b"})
    d = dialer(dial)
    await d.dial_first()
    assert (dial.tried, d.index) == (["a", "b"], 1)


async def test_first_dial_lists_every_servers_reason() -> None:
    with pytest.raises(NatsConnectFailed) as caught:
        await dialer(FakeDial()).dial_first()
    assert [reason.split(": ")[0] for reason in caught.value.reasons] == [
        str(server) for server in SERVERS]


async def test_first_dial_stops_at_a_server_that_needs_tls() -> None:
    dial = FakeDial(accept={"c"}, unsupported={"b"})
    with pytest.raises(NatsUnsupported):
        await dialer(dial).dial_first()
    assert dial.tried == ["a", "b"]


async def test_redial_goes_round_robin_from_the_server_after_the_lost_one() -> None:
    dial = FakeDial(accept={"a"})
    d = dialer(dial)
    await d.dial_first()
    dial.tried.clear()
    found = await d.redial(lambda: False)
    # b and c first (a was just lost), then a again: three attempts.
    assert found == (SERVERS[0], 3) and dial.tried == ["b", "c", "a"]


async def test_redial_gives_up_after_attempts_max() -> None:
    dial = FakeDial()
    with pytest.raises(NatsConnectionClosed, match="after 5 attempts"):
        await dialer(dial, attempts_max=5).redial(lambda: False)
    assert dial.tried == ["b", "c", "a", "b", "c"]


async def test_redial_stops_when_the_connection_is_closing() -> None:
    dial = FakeDial()
    rounds = iter([False, False, True])
    assert await dialer(dial).redial(lambda: next(rounds)) is None
    assert dial.tried == ["b", "c", "a"] * 2


def test_a_dialer_needs_a_server() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Dialer([], FakeDial(), wait_s=1, wait_max_s=1, attempts_max=None)
