"""The two systems bench/scale.py compares, behind one interface (`System`): ours (three
brokers and a nats-server, bench.replication.OurCluster, with one client) and NATS JetStream
(a 3-node cluster, jetstream.natsd.NatsCluster, with one nats-py connection). Each says
which processes to measure, creates and publishes its own way, tells which partitions it
serves (from its monitoring ports: see `Ours.unserved` and `Peer.unserved`), and kills,
restarts and stops its own processes, by PID."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import nats
from nats.aio.client import Client as NatsClient

import jetstream
from bench.common import JsonObject
from bench.replication import OurCluster, eventually
from bench.scale_figures import js_unserved, led_partitions, not_led, short_isr
from jetstream.client import StreamInfo
from jetstream.natsd import NatsCluster, NatsServer
from jetstream.server.process import BrokerProcess

BROKERS = 3
PAYLOAD = b"x" * 128
#: The probe stream of a failover: the most replicas two surviving nodes can hold.
PROBE = ("probe", "scale.probe")
PROBE_REPLICAS = 2
PROBE_TIMEOUT_S = 2.0
PUBLISH_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 10.0
#: Stream updates in flight at once (fsync_as_peer).
UPDATES_AT_ONCE = 16
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


Probe = Callable[[], Awaitable[bool | None]]


class System(Protocol):
    """What `streams_run` does to a cluster, the same way on both systems."""

    def pids(self) -> dict[str, int]: ...
    def broker_names(self) -> list[str]: ...
    def nats_server(self) -> NatsServer: ...
    async def warm_up(self, deadline_s: float) -> None: ...
    async def create(self, name: str, subject: str) -> None: ...
    async def publish(self, subject: str) -> None: ...
    async def fsync_as_peer(self, names: Sequence[str]) -> bool: ...
    async def unserved(self, expected: Mapping[str, int], full: bool) -> list[str] | None: ...
    async def find_metadata_leader(self) -> str: ...
    def survivor_probe(self) -> contextlib.AbstractAsyncContextManager[Probe]: ...
    async def kill_metadata_leader(self) -> None: ...
    async def start_killed(self, deadline_s: float) -> None: ...
    async def stop_all(self) -> None: ...
    async def start_all(self, deadline_s: float) -> None: ...


def _http_text(url: str) -> str | None:
    """A monitoring endpoint's answer (ours /metrics, /streams; nats-server /jsz), or None
    while the process cannot answer."""
    try:
        with _HTTP.open(url, timeout=HTTP_TIMEOUT_S) as response:
            return bytes(response.read()).decode()
    except OSError:
        return None


def _http_json(url: str) -> JsonObject | None:
    text = _http_text(url)
    try:
        view: JsonObject | None = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return view


class Ours:
    """OurCluster with one client of ours (socket API and NATS)."""

    def __init__(self, cluster: OurCluster, client: jetstream.Client) -> None:
        self.cluster = cluster
        self.client = client
        self._killed: BrokerProcess | None = None
        self._describer = 0

    def pids(self) -> dict[str, int]:
        return {**{f"broker{b.broker_id}": b.pid for b in self.cluster.brokers},
                "nats": self.cluster.nats.pid}

    def broker_names(self) -> list[str]:
        return [f"broker{b.broker_id}" for b in self.cluster.brokers]

    def nats_server(self) -> NatsServer:
        return self.cluster.nats

    async def warm_up(self, deadline_s: float) -> None:
        # Opens the client's NATS connection: an unacked message nobody reads.
        await self.client.publish("scale.warmup", b"", ack_policy="none")

    async def create(self, name: str, subject: str, partitions: int = 1) -> None:
        await self.client.create_stream(name, subject, partitions=partitions,
                                        replication_factor=BROKERS, min_isr=2)

    async def publish(self, subject: str) -> None:
        await self.client.publish(subject, PAYLOAD, timeout=PUBLISH_TIMEOUT_S)

    async def fsync_as_peer(self, names: Sequence[str]) -> bool:
        """Every stream to fsync `interval` (each second; JetStream's default syncs every
        two minutes), from the default `always` (fsync before the ack)."""
        limit = asyncio.Semaphore(UPDATES_AT_ONCE)

        async def update(name: str) -> None:
            async with limit:
                await self.client.update_stream(name, fsync="interval")

        await asyncio.gather(*(update(name) for name in names))
        return True

    async def unserved(self, expected: Mapping[str, int], full: bool) -> list[str] | None:
        """The partitions of `expected` (stream -> partitions) no broker runs the leader
        role of (each broker's /metrics lists those, cheaply), then, with `full`, those the
        metadata shows with a short ISR (GET /streams of one broker, which describes every
        stream: dear, so only once all are led). None while a broker cannot answer."""
        texts = await asyncio.gather(*(asyncio.to_thread(_http_text, f"{b.http_url}/metrics")
                                       for b in self.cluster.brokers))
        if any(text is None for text in texts):
            return None
        led: set[tuple[str, int]] = set().union(*(led_partitions(t or "") for t in texts))
        missing = not_led(led, expected)
        if missing or not full:
            return missing
        self._describer = (self._describer + 1) % len(self.cluster.brokers)  # spread the cost
        listing = await asyncio.to_thread(
            _http_json, f"{self.cluster.brokers[self._describer].http_url}/streams")
        if listing is None:
            return None
        return short_isr([StreamInfo.from_dict(s) for s in listing["streams"]], expected)

    async def find_metadata_leader(self) -> str:
        leader = await asyncio.to_thread(self.cluster.metadata_leader)
        if leader is None:
            raise RuntimeError("no broker names a metadata leader")
        self._killed = self.cluster.by_id(leader)
        return f"broker{leader}"

    @contextlib.asynccontextmanager
    async def survivor_probe(self) -> AsyncIterator[Probe]:
        assert self._killed is not None
        survivors = ",".join(b.address for b in self.cluster.brokers if b is not self._killed)
        async with jetstream.connect(survivors, request_timeout_s=PROBE_TIMEOUT_S) as client:

            async def created() -> bool:  # eventually() retries on our errors
                await client.create_stream(*PROBE, replication_factor=PROBE_REPLICAS,
                                           min_isr=1)
                return True

            yield created

    async def kill_metadata_leader(self) -> None:
        assert self._killed is not None
        await asyncio.to_thread(self._killed.kill)  # SIGKILL by PID, reaped

    async def start_killed(self, deadline_s: float) -> None:
        assert self._killed is not None
        self._killed.start(wait=False)
        await asyncio.to_thread(self._killed.wait_ready, deadline_s)

    async def stop_all(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(b.stop) for b in self.cluster.brokers))

    async def start_all(self, deadline_s: float) -> None:
        for broker in self.cluster.brokers:
            broker.start(wait=False)
        for broker in self.cluster.brokers:  # ready only together, once a majority runs
            await asyncio.to_thread(broker.wait_ready, deadline_s)

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, work: Path) -> AsyncIterator[Ours]:
        async with OurCluster(work) as cluster, \
                jetstream.connect(cluster.live_addresses()) as client:
            yield cls(cluster, client)


async def _quiet(*_args: object) -> None:
    """nats-py prints connection errors unless given callbacks; servers die on purpose here."""


class Peer:
    """A 3-node JetStream cluster (NatsCluster) with one nats-py connection."""

    def __init__(self, cluster: NatsCluster, nc: NatsClient) -> None:
        self.cluster = cluster
        self.js = nc.jetstream(timeout=PUBLISH_TIMEOUT_S)
        self._killed: NatsServer | None = None

    def pids(self) -> dict[str, int]:
        return {s.name: s.pid for s in self.cluster.servers}

    def broker_names(self) -> list[str]:
        return [s.name for s in self.cluster.servers]

    def nats_server(self) -> NatsServer:
        return self.cluster.servers[0]

    async def warm_up(self, deadline_s: float) -> None:
        async def placed() -> bool | None:
            try:
                await self.js.add_stream(name="warmup", subjects=["scale.warmup"],
                                         num_replicas=BROKERS, storage="file")
                await self.js.delete_stream("warmup")
            except Exception:  # "no suitable peers for placement" while peers show up
                return None
            return True

        await eventually(placed, "a JetStream R3 stream can be placed", deadline_s)

    async def create(self, name: str, subject: str) -> None:
        await self.js.add_stream(name=name, subjects=[subject], num_replicas=BROKERS,
                                 storage="file")

    async def publish(self, subject: str) -> None:
        await self.js.publish(subject, PAYLOAD, timeout=PUBLISH_TIMEOUT_S)

    async def fsync_as_peer(self, names: Sequence[str]) -> bool:
        """Already so: this is the peer."""
        return False

    async def unserved(self, expected: Mapping[str, int], full: bool) -> list[str] | None:
        """See scale_figures.js_unserved, from each live server's monitor port (not the
        JetStream API: its requests wait out their timeout while there is no meta leader,
        which would blur the time of a restart); None while no server answers."""
        urls = {s.name: f"{s.monitor_url}/jsz?streams=true&config=true"
                for s in self.cluster.servers}
        views = await asyncio.gather(*(asyncio.to_thread(_http_json, url)
                                       for url in urls.values()))
        if all(view is None for view in views):
            return None
        reports = {name: [detail for account in (view or {}).get("account_details") or []
                          for detail in account.get("stream_detail") or []]
                   for name, view in zip(urls, views, strict=True)}
        return js_unserved(reports, expected, current=full)

    async def find_metadata_leader(self) -> str:
        leader = await asyncio.to_thread(self.cluster.meta_leader)
        self._killed = next((s for s in self.cluster.servers if s.name == leader), None)
        if self._killed is None:
            raise RuntimeError(f"no JetStream meta leader ({leader!r})")
        return self._killed.name

    @contextlib.asynccontextmanager
    async def survivor_probe(self) -> AsyncIterator[Probe]:
        nc = await nats.connect([s.url for s in self.cluster.servers if s is not self._killed],
                                error_cb=_quiet)
        js = nc.jetstream(timeout=PROBE_TIMEOUT_S)

        async def created() -> bool | None:
            try:
                await js.add_stream(name=PROBE[0], subjects=[PROBE[1]],
                                    num_replicas=PROBE_REPLICAS, storage="file")
            except Exception:  # a timeout or an API error while there is no meta leader
                return None
            return True

        try:
            yield created
        finally:
            await nc.close()

    async def kill_metadata_leader(self) -> None:
        assert self._killed is not None
        await asyncio.to_thread(self._killed.kill)  # SIGKILL by PID, reaped

    async def start_killed(self, deadline_s: float) -> None:
        assert self._killed is not None
        await asyncio.to_thread(self._killed.start)

    async def stop_all(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(s.stop) for s in self.cluster.servers))

    async def start_all(self, deadline_s: float) -> None:
        for server in self.cluster.servers:  # all at once, as ours
            server.launch()
        for server in self.cluster.servers:
            await asyncio.to_thread(server.wait_ready)

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, work: Path) -> AsyncIterator[Peer]:
        async with NatsCluster(work, BROKERS) as cluster:
            nc = await nats.connect(cluster.urls, error_cb=_quiet, disconnected_cb=_quiet,
                                    reconnected_cb=_quiet, closed_cb=_quiet)
            try:
                yield cls(cluster, nc)
            finally:
                await nc.close()
