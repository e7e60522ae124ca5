"""The broker process: wiring and lifecycle.

Theory of operation: a broker raises its open-file limit and sizes the pool its partition
files share (jetstream.server.files), connects to NATS (or starts an embedded nats-server on
loopback), opens its metadata (jetstream.raft_meta: local for one broker, Raft in a
cluster), and builds its services, each in the module of its concern:
- roles (jetstream.server.roles): the partition leaders and followers, reconciled with the
  metadata after every change, behind the epoch fence (jetstream.server.epoch_fence); one
  scheduler (jetstream.server.scheduler) runs the background work of the partitions it
  leads when it is due;
- reads (jetstream.server.fetch): Fetch, the offset lookups and the segment listing;
- stream admin and descriptions (jetstream.server.admin);
- the cluster services (jetstream.server.cluster): Raft, failover, leadership hand-over.
Then it serves the socket API and the HTTP API. Neither knows this module: the socket API
gets one dispatch table from request type to handler (`_dispatcher`: adding an operation is
one line there), the HTTP API the stream admin, through the interfaces of
jetstream.server.api. Both therefore behave the same.

Cluster mode (`cluster` set): the broker takes roles only once it has caught up with the
metadata leader, registered, and renewed the leader epochs it held before this start.

Stopping (SIGTERM, SIGINT or `stop()`): in cluster mode, first hand the partitions it leads
over to in-sync followers; stop taking roles, stop accepting requests, stop ingest and finish
the acks of what was received, close the logs (clean recovery point), stop the embedded NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from jetstream.datastreams.service import DatastreamService
from jetstream.errors import InsecureListener
from jetstream.natsd import NatsServer
from jetstream.protocol import messages as m
from jetstream.raft_meta.changes import StateRestored, touched
from jetstream.raft_meta.fsm import Command, RegisterBroker
from jetstream.raft_meta.local import LocalMetadata
from jetstream.raft_meta.model import BrokerInfo
from jetstream.raft_meta.raft import RaftMetadata
from jetstream.security.guard import exposures, refusal
from jetstream.security.tls import client_ssl, reload_all, server_ssl
from jetstream.server.acl_admin import AclAdmin
from jetstream.server.admin import Admin
from jetstream.server.api import Dispatcher, at_once, on
from jetstream.server.bulk_gets import ACCELERATED as BULK_GETS
from jetstream.server.bulk_gets import BulkGets
from jetstream.server.cleaner import CleanerService
from jetstream.server.cluster import Cluster
from jetstream.server.config import BrokerConfig
from jetstream.server.coordinator import Coordinators
from jetstream.server.disk import DiskMonitor
from jetstream.server.epoch_fence import EpochFence
from jetstream.server.fetch import Reads
from jetstream.server.files import OpenFiles
from jetstream.server.gatekeeper import Gatekeeper, peer_credentials
from jetstream.server.http_api import HttpServer
from jetstream.server.http_groups import BrokerClient
from jetstream.server.integrity import Integrity
from jetstream.server.kv import KeyValue
from jetstream.server.long_lived import LongLivedObjects
from jetstream.server.metrics import BrokerMetrics
from jetstream.server.mirror_api import MirrorCopies
from jetstream.server.nats_dial import NatsAuth
from jetstream.server.nats_port import NatsPort, connect_nats
from jetstream.server.offsets_stream import OffsetsStream
from jetstream.server.roles import IO_THREADS, Roles
from jetstream.server.scheduler import Scheduler
from jetstream.server.socket_api import SocketApi
from jetstream.server.thread_pool import started_pool
from jetstream.stream.checkpoint import fsync_dir, write_atomic
from jetstream.stream.reserve import DiskReserve
from jetstream.tasks import cancel_and_wait

log = logging.getLogger(__name__)

READY_FILE = "broker.json"
#: Written once a stop closed and synced every log; removed (durably) at the next start.
CLEAN_STOP_FILE = "clean-stop"
#: How long a broker waits before reconciling its roles again after a failed attempt.
RECONCILE_RETRY_S = 1.0


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.metrics = BrokerMetrics()
        self.http_port = -1
        self.nats_url = ""
        self._nats_server: NatsServer | None = None
        self._nats: NatsPort | None = None
        self._cluster: Cluster | None = None
        self._reserve = DiskReserve(self.data_dir, config.disk_reserve_bytes)
        self._roles: Roles | None = None
        #: Set by the process that runs the broker and owns its heap (jetstream.cli).
        self.long_lived: LongLivedObjects | None = None
        self._cleaner: CleanerService | None = None
        self._kv: KeyValue | None = None
        self._coordinators: Coordinators | None = None
        self._integrity: Integrity | None = None
        self._socket_api: SocketApi | None = None
        self._http: HttpServer | None = None
        self._broker_client: BrokerClient | None = None
        self._datastreams: DatastreamService | None = None
        self._failover_task: asyncio.Task[None] | None = None
        self._reconciling: asyncio.Task[None] | None = None
        self._disk = DiskMonitor(self.data_dir, config.disk_high_watermark_percent)
        self._disk_task: asyncio.Task[None] | None = None
        self._executor = started_pool(IO_THREADS, "jetstream-io")
        self._scheduler = Scheduler(self._executor)
        self._stop = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Start, then run until `stop()` or SIGTERM/SIGINT."""
        await self.start(stop_on_signals=True)
        await self.run_until_stopped()

    async def run_until_stopped(self) -> None:
        self._stop_on_signals()
        try:
            await self._stop.wait()
        finally:
            await self.shutdown()

    def stop(self) -> None:
        self._stop.set()

    def _stop_on_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stop.set)

    async def start(self, *, stop_on_signals: bool = False) -> None:
        """Start serving. `stop_on_signals`: SIGTERM and SIGINT stop it from before it writes
        its ready file (a broker alone in its process; `run_until_stopped` installs them
        too)."""
        self._check_exposure()
        # Build (and so check) every TLS context before anything starts: a bad certificate
        # is a clear startup error, not a failure of the first connection.
        for tls in (self.config.socket_tls, self.config.http_tls):
            server_ssl(tls)
        for tls in (self.config.peer_tls, self.config.nats_tls):
            client_ssl(tls)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload_tls)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self._reserve.ensure():
            log.warning("no room for the %d-byte disk reserve in %s", self._reserve.size_bytes,
                        self.data_dir)
        stopped_cleanly = self._take_clean_stop()
        files = OpenFiles.start(self.config.open_files_max)
        fence = EpochFence(self.data_dir, self._executor)
        nats_port = self._nats = await self._connect_nats()
        if self.config.cluster_members:
            self._cluster = Cluster(self.config, self.data_dir / "meta", self._reserve)
            metadata: LocalMetadata | RaftMetadata = self._cluster.metadata
        else:
            metadata = LocalMetadata(self.data_dir / "meta", self._reserve)
        self._disk.refresh()
        self._disk_task = asyncio.create_task(self._watch_disk(), name="disk")
        self._scheduler.start()
        roles = self._roles = Roles(self.config, self.data_dir, metadata, self._cluster,
                                    nats_port, fence, self._executor, self._scheduler,
                                    self._disk, pool=files.pool)
        roles.long_lived = self.long_lived
        cluster = self._cluster
        integrity = self._integrity = Integrity(
            self.config, roles, cluster.address_of if cluster is not None else None,
            cluster.hand_over_to if cluster is not None else None)
        roles.read_around, roles.damage_found = integrity.read_around, integrity.found
        if self._cluster is not None:
            metadata.add_listener(self._on_metadata_change)  # before any await
        cleaner = self._cleaner = CleanerService(
            roles.replicas, threads=self.config.cleaner_threads,
            buffer_bytes=self.config.cleaner_buffer_bytes,
            backoff_ms=self.config.cleaner_backoff_ms, rolled=roles.segment_rolled)
        kv = self._kv = KeyValue(roles, self._executor, files.pool,
                                 interval_ms=self.config.key_index_interval_ms,
                                 map_size_bytes=self.config.key_index_bytes_max,
                                 wait_ms_max=self.config.fetch_wait_ms_max)
        offsets = OffsetsStream(self.config, metadata, self._cluster, roles)
        coordinators = self._coordinators = Coordinators(self.config, metadata, roles, kv,
                                                         offsets, self._executor)
        admin = Admin(self.config, metadata, self._cluster, roles, self.metrics,
                      self.nats_url, nats_port, cleaner, kv, coordinators, self._disk,
                      integrity, files)
        gate = Gatekeeper(self.config, metadata, self.metrics)
        acls = AclAdmin(metadata)
        # Datastreams (jetstream.datastreams): management, coordinator, tasks.
        cluster_ = self._cluster
        datastreams = self._datastreams = DatastreamService(
            self.config.broker_id, metadata,
            cluster_.live_brokers if cluster_ is not None else lambda: (self.config.broker_id,),
            cluster_.address_of if cluster_ is not None else lambda _b: None,
            self._own_address, client_ssl(self.config.peer_tls))
        admin.datastreams = datastreams
        dispatcher = self._dispatcher(admin, roles, kv, offsets, coordinators, acls)
        self._socket_api = SocketApi(self.config, self.metrics, dispatcher, gate,
                                     BulkGets(kv) if BULK_GETS else None)
        await self._socket_api.start()
        if self.config.http_port >= 0:
            self._broker_client = BrokerClient(self._own_address,
                                               client_ssl(self.config.peer_tls),
                                               peer_credentials(self.config))
            self._http = HttpServer(self.config, admin, self._broker_client, gate, acls,
                                    metrics=self.metrics)
            self.http_port = await self._http.start()
        me = BrokerInfo(self.config.broker_id, self.config.host, self._socket_api.port,
                        max(self.http_port, 0))
        if self._cluster is not None:
            await self._cluster.join(me)
            await self._cluster.renew_leaderships(stopped_cleanly=stopped_cleanly)
            self._failover_task = asyncio.create_task(self._cluster.failover_loop(),
                                                      name="failover")
        else:
            if metadata.state.brokers.get(me.id) != me:
                await metadata.propose(RegisterBroker(me))
            metadata.add_listener(self._on_metadata_change)
        # After a clean stop its followers start once it is ready; after a crash before:
        # recovering thousands of logs takes seconds, and a leader whose follower has not
        # started for replica_lag_ms_max shrinks its ISR (measured: every ISR full again
        # after 20-29 s instead of 10-12 s at 1,000 partitions when they started after).
        await roles.enable(hold_followers=stopped_cleanly)
        if self._cluster is not None:
            await self._cluster.lead_again()
        cleaner.start()
        kv.start()
        coordinators.start()
        await integrity.start()
        datastreams.start()
        if stop_on_signals:  # before it says it is ready: a stop from then on is clean
            self._stop_on_signals()
        ready = json.dumps(self.describe_self()).encode()
        self._reserve.write(lambda: write_atomic(self.data_dir / READY_FILE, ready))
        log.info("broker %d ready: %s", self.config.broker_id, self.describe_self())
        roles.follow()
        self._reconcile_soon(roles)  # the follower roles held since `enable`

    def _take_clean_stop(self) -> bool:
        """Whether the last run stopped cleanly; the mark is removed, durably, before
        anything is written (a crash of this run must not look clean to the next)."""
        mark = self.data_dir / CLEAN_STOP_FILE
        if not mark.exists():
            return False
        mark.unlink()
        fsync_dir(self.data_dir)
        return True

    def _check_exposure(self) -> None:
        """Refuse to start with a listener off loopback that lacks its protection, unless
        `insecure` (jetstream.security.guard)."""
        found = exposures(self.config)
        if not found:
            return
        if not self.config.insecure:
            raise InsecureListener(refusal(found), field=found[0].missing[0].split("/")[0])
        for exposure in found:
            log.error("INSECURE (--insecure): %s; anyone who reaches it can %s", exposure,
                      "run code in this broker" if exposure.listener == "metadata Raft"
                      else "read, write and delete every stream")

    def reload_tls(self) -> None:
        """SIGHUP: read every certificate, key and CA file again; new connections use them,
        open ones carry on. A bad file keeps the old certificate and is logged."""
        failures = reload_all(time.time())
        self.metrics.tls_reloads_total += 1
        if failures:
            self.metrics.tls_reload_failures_total += 1

    async def _watch_disk(self) -> None:
        """Refresh the disk's fill level every disk_check_ms; take the reserve back once
        the disk has room again. In a cluster, a full disk hands this broker's leaderships
        to in-sync followers with room."""
        was_full = self._disk.full
        while True:
            await asyncio.sleep(self.config.disk_check_ms / 1000)
            try:
                await asyncio.to_thread(self._disk.refresh)
            except OSError as exc:
                log.warning("cannot read the data disk's usage: %s", exc)
                continue
            if self._disk.full != was_full:
                was_full = self._disk.full
                log.warning("data disk %s: %s", self.data_dir, self._disk.describe())
            if not self._disk.full and not self._reserve.held:
                await asyncio.to_thread(self._reserve.ensure)
            roles = self._roles
            if self._disk.full and self._cluster is not None and roles is not None \
                    and roles.enabled:
                self._cluster.hand_over_from_full_disk(roles.led())

    def _dispatcher(self, admin: Admin, roles: Roles, kv: KeyValue, offsets: OffsetsStream,
                    groups: Coordinators, acls: AclAdmin) -> Dispatcher:
        """The socket API's table: which service answers each request type."""
        reads = Reads(self.config, roles)
        cluster = self._cluster
        return Dispatcher(dict([
            on(m.FetchRequest, reads.fetch),
            on(m.OffsetForTimestampRequest, reads.offset_for_timestamp),
            on(m.ListSegmentsRequest, reads.list_segments),
            on(m.EndOffsetForEpochRequest, reads.end_offset_for_epoch),
            on(m.ReplicaFetchRequest, roles.sessions.fetch),
            on(m.ReplicaRangeRequest, admin.integrity.replica_range),
            on(m.ScrubRequest, admin.on_scrub),
            on(m.FragmentsRequest, admin.on_fragments),
            on(m.RegistersRequest, admin.on_registers),
            on(m.DatastreamRequest, self._datastreams_handler()),
            on(m.MirrorAppendRequest, MirrorCopies(admin.leader_for).append),
            on(m.MetadataRequest, admin.on_metadata),
            on(m.ListStreamsRequest, admin.on_list_streams),
            on(m.CreateStreamRequest, admin.on_create_stream),
            on(m.DeleteStreamRequest, admin.on_delete_stream),
            on(m.UpdateStreamRequest, admin.on_update_stream),
            on(m.GetRequest, kv.get),
            on(m.KeysRequest, kv.keys),
            on(m.FindCoordinatorRequest, offsets.find_coordinator),
            on(m.GroupHeartbeatRequest, groups.heartbeat),
            on(m.CommitOffsetRequest, groups.commit),
            on(m.FetchOffsetRequest, groups.fetch),
            on(m.ResetOffsetsRequest, groups.reset),
            on(m.DeleteGroupRequest, groups.delete_group),
            on(m.ListGroupsRequest, groups.list_groups),
            on(m.DescribeGroupRequest, groups.describe),
            on(m.ReportLeaderFailureRequest,
               cluster.on_report_request if cluster is not None else _no_failover),
            on(m.AclListRequest, acls.on_list),
            on(m.AclAddRequest, acls.on_add),
            on(m.AclRemoveRequest, acls.on_remove),
        ]), immediate=dict([
            at_once(m.GetRequest, kv.get_now),
        ]))

    def _datastreams_handler(self) -> Any:
        assert self._datastreams is not None
        return self._datastreams.handle

    async def _connect_nats(self) -> NatsPort:
        urls = self.config.nats_urls
        if not urls:
            (self.data_dir / "nats").mkdir(exist_ok=True)
            self._nats_server = NatsServer(self.data_dir / "nats", name="embedded-nats",
                                           port=self.config.nats_port)
            await self._nats_server.astart()
            urls = [self._nats_server.url]
        self.nats_url = ",".join(urls)
        config = self.config
        auth = NatsAuth(config.nats_user or None, config.nats_password or None,
                        config.nats_token or None, config.nats_creds or None)
        return await connect_nats(urls, f"jetstream-broker-{config.broker_id}",
                                  tls=client_ssl(config.nats_tls), auth=auth,
                                  fast=config.nats_client == "fast")

    def _own_address(self) -> str:
        assert self._socket_api is not None
        return f"{self.config.host}:{self._socket_api.port}"

    def describe_self(self) -> dict[str, Any]:
        port = self._socket_api.port if self._socket_api is not None else 0
        return {"broker_id": self.config.broker_id, "pid": os.getpid(), "host": self.config.host,
                "port": port, "http_port": self.http_port, "nats_url": self.nats_url,
                "data_dir": str(self.data_dir), "tls": self.config.socket_tls is not None,
                "http_tls": self.config.http_tls is not None}

    async def shutdown(self, *, hand_over: bool = True) -> None:
        """Stop. In a cluster, first hand this broker's leaderships to in-sync followers,
        unless `hand_over` is False (the whole cluster is stopping: `jetstream dev`)."""
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / READY_FILE).unlink()
        if self._datastreams is not None:
            await self._datastreams.stop(hand_off=hand_over)
        roles = self._roles
        if self._cluster is not None and roles is not None and roles.enabled and hand_over:
            await self._cluster.mark_shutting_down()  # before it looks at what it leads
            await self._cluster.hand_over(sorted(roles.leaders))
        if roles is not None:
            await roles.stop_followers()
        await cancel_and_wait(self._failover_task)
        await cancel_and_wait(self._disk_task)
        if self._socket_api is not None:
            await self._socket_api.stop()
        if self._http is not None:
            await self._http.stop()
        if self._broker_client is not None:
            await self._broker_client.close()
        if self._coordinators is not None:
            await self._coordinators.stop()
        if self._integrity is not None:
            await self._integrity.stop()
        if self._cleaner is not None:
            await self._cleaner.stop()
        if self._kv is not None:
            await self._kv.stop()
        if self._cluster is not None:
            # The next start loads this dump instead of replaying the journal; the syncs of
            # stop_all below make it durable with the logs.
            await self._cluster.metadata.compact()
        if roles is not None:
            await roles.stop_all()  # every log closed and synced: a clean stop
            self._reserve.write(lambda: write_atomic(self.data_dir / CLEAN_STOP_FILE, b""))
        await self._scheduler.stop()
        if self._cluster is not None:
            await self._cluster.close()
        if self._nats is not None:
            with contextlib.suppress(Exception):
                await self._nats.close()
        if self._nats_server is not None:
            await self._nats_server.astop()
        self._executor.shutdown(wait=True)

    def _on_metadata_change(self, command: Command | StateRestored, result: object) -> None:
        change = touched(command, result)
        if self._coordinators is not None and change.streams_changed:
            self._coordinators.on_metadata_change(change)
        roles = self._roles
        if roles is None or not roles.enabled:
            return  # enabling reconciles everything
        roles.changed(change)
        self._reconcile_soon(roles)

    def _reconcile_soon(self, roles: Roles) -> None:
        """Reconcile the pending changes in a task (one at a time: it loops while there are)."""
        if self._reconciling is None or self._reconciling.done():
            self._reconciling = asyncio.get_running_loop().create_task(self._reconcile(roles))
            self._reconciling.add_done_callback(_log_failure)

    async def _reconcile(self, roles: Roles) -> None:
        """Reconcile the roles with the metadata while changes are pending (one task: the
        changes applied meanwhile are coalesced); after a failure (an IO error half-way) try
        again, so a broker never stays in roles the metadata no longer gives it."""
        while roles.enabled and roles.pending:
            try:
                await roles.reconcile()
                continue
            except Exception:
                log.exception("reconcile failed: again in %.1f s", RECONCILE_RETRY_S)
            await asyncio.sleep(RECONCILE_RETRY_S)


async def _no_failover(request: m.ReportLeaderFailureRequest) -> m.EmptyResponse:
    """A single broker has no followers to report a leader, nor a failover to run."""
    return m.EmptyResponse()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("reconcile failed", exc_info=task.exception())
