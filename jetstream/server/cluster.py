"""The cluster side of a broker: Raft metadata, failover, ISR proposals, leadership hand-over.

Theory of operation: with `cluster` set, every broker runs a RaftMetadata on its own Raft
address (the others are its partners). A broker waits until its metadata has caught up with
a leader before it registers itself (RegisterBroker, retried while no leader commits it) and
before it takes any partition role, so it never acts on a stale replay of its journal. Then
it gives up every leader epoch it held before this start (`renew_leaderships`): each
partition it still leads moves to a new epoch, led by another live in-sync replica if any,
or by itself again when it stopped cleanly (every log closed and synced: nothing it appended
was lost, so no follower holds more than it does).

Failover is decided on the metadata leader's broker only: a FailoverController (pure) is fed
every FAILOVER_TICK_MS with the brokers whose Raft connection is up (and this one), and with
the reports of followers whose leader went silent (REPORT_LEADER_FAILURE, or a direct call
when the reporter is this broker). Its ChangeLeader decisions are proposed in the background;
the compare-and-set on the leader epoch makes a stale decision a harmless refusal.

Leader and ISR changes go to the metadata in batches (jetstream.server.metadata_batches): the
decisions of one failover tick, the partitions a starting or stopping broker hands over, and
the ISR changes its partition leaders propose while an earlier batch is in flight each make
one Raft entry, however many partitions they concern. A broker
that loses metadata leadership drops its controller; the next one starts fresh (brokers never
seen get a grace period of `broker_timeout_ms`).

Preferred leaders: with `auto_leader_rebalance`, the metadata leader's failover loop also
runs, every `leader_imbalance_check_interval_ms`, a round of jetstream.raft_meta.rebalance:
leaderships that failovers, stops or full disks moved away go back to their first replica
once it is live and in sync, for brokers above the imbalance percentage (at most
REBALANCE_CHANGES_MAX a round; a round cut short is followed by the next at once).

Graceful stop (Kafka's controlled shutdown): the broker first marks itself shutting down in
the metadata (ControlledShutdown): from then on no leadership goes to it, not by hand-over,
failover or preferred-leader round, and the state machine refuses a leader change naming
it. It waits up to `controlled_shutdown_wait_ms` for the other live brokers to be marked
too (brokers stopped together mark themselves within moments of each other). Then each
partition it leads is handed to its first in-sync follower in replica order that is live
and not shutting down (ChangeLeader), waited for, before the broker leaves. Brokers that
stop together so keep their leaderships instead of passing them around (each would start
the roles it is handed as it stops, and start again with more than its share). A starting
broker marks itself too (`join`) and keeps the mark while it renews its leaderships and
starts its roles; it takes the mark off (`lead_again`) once its leader roles run at the new
epochs. Other brokers start no follower of a partition whose leader is marked (its epoch is
about to change): they start them, at the new epochs, when the mark comes off.

A full disk: at each of the broker's disk checks, while its data disk is above the high
watermark, each partition it leads is handed to an in-sync follower that has room, once per
leader epoch (jetstream.isr.disk_full decides; the proposals run in the background).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from jetstream.client.connection import BrokerConnection
from jetstream.errors import (
    JetstreamError,
    MetadataUnavailable,
    UnknownPartition,
    UnknownStream,
)
from jetstream.isr.disk_full import FullDiskHandOver, LedPartition, successors
from jetstream.isr.leader import ProposeIsr
from jetstream.protocol import messages as m
from jetstream.raft_meta.controller import FailoverController
from jetstream.raft_meta.fsm import (
    BrokerShuttingDown,
    ChangeIsr,
    ChangeIsrs,
    ChangeLeader,
    ChangeLeaders,
    Command,
    ControlledShutdown,
    ItemOutcome,
    RegisterBroker,
    StaleMetadataEpoch,
)
from jetstream.raft_meta.model import BrokerInfo, PartitionState
from jetstream.raft_meta.raft import RaftMetadata
from jetstream.raft_meta.rebalance import preferred_leader_changes
from jetstream.security.tls import client_ssl
from jetstream.server.config import BrokerConfig
from jetstream.server.gatekeeper import peer_credentials
from jetstream.server.metadata_batches import Batch, Batcher
from jetstream.server.peer_links import PeerLinks
from jetstream.stream.reserve import DiskReserve
from jetstream.tasks import cancel_and_wait

log = logging.getLogger(__name__)

FAILOVER_TICK_MS = 200
#: Most preferred-leader changes proposed by one rebalance round.
REBALANCE_CHANGES_MAX = 500
#: How long a starting broker waits for the metadata to catch up with a leader.
READY_TIMEOUT_S = 120.0
RETRY_S = 0.2
REPORT_TIMEOUT_S = 2.0
#: Longest wait for the metadata to commit a stopping broker's ControlledShutdown mark.
MARK_TIMEOUT_S = 2.0
#: How often a stopping broker looks whether the other live brokers are marked too.
SHUTDOWN_POLL_S = 0.01
LIVE_POLL_S = 0.05
#: How long a create waits for every partition's leader broker to serve it.
SERVED_WAIT_S = 10.0
#: Pauses between its checks: short at first (a leader elsewhere usually serves within a
#: few ms of the create's commit), then every 50 ms.
SERVED_POLLS_S = (0.002, 0.005, 0.01, 0.02, 0.05)


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class Cluster:
    """The cluster services of one broker (see the module docstring)."""

    def __init__(self, config: BrokerConfig, directory: Path,
                 reserve: DiskReserve | None = None) -> None:
        members = config.cluster_members
        assert members, "not a cluster"
        self.config = config
        self.broker_id = config.broker_id
        self.raft_ids = {address: bid for bid, address in members.items()}
        partners = [a for bid, a in members.items() if bid != config.broker_id]
        self.metadata = RaftMetadata(
            directory, members[config.broker_id], partners, broker_id=config.broker_id,
            broker_ids=self.raft_ids, password=config.metadata_password or None,
            routes=config.raft_route_map, reserve=reserve)
        self.size = len(members)
        self._controller: FailoverController | None = None
        self._full_disk = FullDiskHandOver(config.broker_id)
        self._tasks: set[asyncio.Task[object]] = set()
        #: Kept-open connections to the other brokers (served checks, failure reports).
        self.peers = PeerLinks(self._dial)
        self._isr_changes = Batcher[ChangeIsr]("isr", ChangeIsrs, self._propose_batch)
        self._leader_changes = Batcher[ChangeLeader]("leader", ChangeLeaders,
                                                     self._propose_batch)
        #: Failover rounds run as the metadata leader, and the partitions they examined.
        self.failover_ticks = 0
        self.failover_examined = 0
        self.failover_indexed = 0
        #: When the next preferred-leader round is due (monotonic ms; None: a full interval
        #: after this broker became the metadata leader), and the changes rounds proposed.
        self._rebalance_due_ms: int | None = None
        self.rebalance_rounds = 0
        self.rebalance_changes = 0

    # -- start -----------------------------------------------------------------------------------

    async def join(self, me: BrokerInfo) -> None:
        """Wait for the metadata to catch up with a leader, then register this broker and
        mark it as shutting down, until `lead_again`: no leadership goes to it, and no
        follower of what it leads starts, while its leaderships still have the epochs of
        its last run (followers would start at those, fail and report it).

        The mark is proposed even when it is there already, and waited for: once it is
        applied here, so is everything committed before it. pysyncobj calls a broker caught
        up once it applied what the leader says is committed, but a leader elected as the
        whole cluster starts again may not know yet how far its log was committed (Raft
        learns that only when an entry of the new term commits): a broker that went on
        from there could see a state without its own leaderships and resume their old
        epochs."""
        await self.metadata.wait_ready(READY_TIMEOUT_S)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            registered = self.metadata.state.brokers.get(me.id) == me
            command = ControlledShutdown(me.id, True) if registered else RegisterBroker(me)
            await self._propose_until(command, deadline)
            if registered:
                return

    async def lead_again(self) -> None:
        """Take off the mark `join` set: this broker's leader roles run at their new epochs,
        so leaderships may go to it and the followers of what it leads start."""
        await self._propose_until(ControlledShutdown(self.broker_id, False),
                                  time.monotonic() + READY_TIMEOUT_S)

    async def _propose_until(self, command: Command, deadline: float) -> None:
        """Propose `command` and wait until it is applied here, again while the metadata is
        unavailable, until `deadline` (monotonic s) passes (then MetadataUnavailable)."""
        while True:
            try:
                await self.metadata.propose(command)
                return
            except MetadataUnavailable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(RETRY_S)

    async def renew_leaderships(self, *, stopped_cleanly: bool = False) -> None:
        """Move every partition this starting broker still leads to a new leader epoch.

        A broker never resumes a leader epoch it held before it stopped: a crash may have
        cost it writes that its followers hold (appended but not yet fsynced under any fsync
        policy: followers fetch up to the leader's log end), and appending again at that
        epoch would make two different histories of one epoch, which truncation by epoch
        cannot tell apart. After a crash the new leader is another in-sync replica whose
        broker is up (it holds everything committed), else this broker at the next epoch.
        After a clean stop (`stopped_cleanly`: its logs hold everything it appended) it is
        this broker at the next epoch: no leadership moves, so a whole cluster that starts
        again does not first start every partition's roles one way, then switch them."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        before = {key: p.leader_epoch for key, p in self.metadata.state.partitions.items()
                  if p.leader == self.broker_id}
        while True:
            partitions = self.metadata.state.partitions
            led = [partitions[key] for key, epoch in before.items()
                   if key in partitions and partitions[key].leader_epoch == epoch]
            if not led:
                return
            live = self.leader_candidates()
            changes = []
            for p in led:
                others = [r for r in self._successors(p) if r in live]
                leader = others[0] if others and not stopped_cleanly else self.broker_id
                log.info("%s/%d: led at epoch %d before this start: handing it to broker %d "
                         "at the next epoch", p.stream, p.partition, p.leader_epoch, leader)
                changes.append(ChangeLeader(p.stream, p.partition, p.leader_epoch, leader))
            outcomes = await self._change_leaders(changes)
            for outcome in outcomes:
                if isinstance(outcome, PartitionState | StaleMetadataEpoch | UnknownStream
                              | UnknownPartition | BrokerShuttingDown):
                    continue  # done, changed (or deleted) meanwhile, or chosen again
                if not isinstance(outcome, MetadataUnavailable):
                    raise outcome
            if any(isinstance(o, MetadataUnavailable) for o in outcomes):
                if time.monotonic() > deadline:
                    raise next(o for o in outcomes if isinstance(o, MetadataUnavailable))
                await asyncio.sleep(RETRY_S)

    # -- ISR proposals ---------------------------------------------------------------------------

    async def propose_isr(self, stream: str, partition: int, decision: ProposeIsr) -> bool | None:
        """True: committed; False: refused (never applied); None: outcome unknown. Proposed
        in a batch with the other partitions' changes (see the module docstring)."""
        outcome = await self._isr_changes.submit(
            ChangeIsr(stream, partition, decision.expected_epoch, decision.isr))
        if isinstance(outcome, PartitionState):
            return True
        if isinstance(outcome, StaleMetadataEpoch):
            return False
        if isinstance(outcome, MetadataUnavailable):
            log.warning("ISR change of %s/%d: %s", stream, partition, outcome)
            return None
        log.warning("ISR change of %s/%d refused: %s", stream, partition, outcome)
        return False

    async def _propose_batch(self, batch: Batch) -> tuple[ItemOutcome, ...]:
        outcomes: tuple[ItemOutcome, ...] = await self.metadata.propose(batch)
        return outcomes

    async def _change_leaders(self, changes: list[ChangeLeader]) -> list[ItemOutcome]:
        """Propose the leader changes (in batches); each one's outcome."""
        return list(await asyncio.gather(*(self._leader_changes.submit(c) for c in changes)))

    # -- failover --------------------------------------------------------------------------------

    async def failover_loop(self) -> None:
        """Run forever: on the metadata leader, decide and propose leader changes."""
        while True:
            await asyncio.sleep(FAILOVER_TICK_MS / 1000)
            if not self.metadata.is_leader:
                self._controller = None
                self._rebalance_due_ms = None
                continue
            controller = self._controller_now()
            now = now_ms()
            for broker in self.live_brokers():
                controller.on_broker_seen(broker, now)
            examined, indexed = controller.examined, controller.indexed
            decisions = controller.decide(self.metadata.state, now)
            self.failover_ticks += 1
            self.failover_examined += controller.examined - examined
            self.failover_indexed += controller.indexed - indexed
            if decisions:  # one proposal for the round (jetstream.server.metadata_batches)
                self._spawn(self._propose_leaders(decisions))
            elif self.config.auto_leader_rebalance:
                self._rebalance(now)

    def _rebalance(self, now: int) -> None:
        """A preferred-leader round, when one is due (never in a tick that failed over)."""
        interval = self.config.leader_imbalance_check_interval_ms
        if self._rebalance_due_ms is None:
            self._rebalance_due_ms = now + interval
        if now < self._rebalance_due_ms:
            return
        changes = preferred_leader_changes(
            self.metadata.state, self.live_brokers(),
            self.config.leader_imbalance_per_broker_percentage, REBALANCE_CHANGES_MAX)
        self.rebalance_rounds += 1
        self.rebalance_changes += len(changes)
        self._rebalance_due_ms = now + (0 if len(changes) >= REBALANCE_CHANGES_MAX
                                        else interval)
        if changes:
            log.info("preferred leaders: %d partitions go back to their first replica",
                     len(changes))
            self._spawn(self._propose_uncommitted(changes))

    def _controller_now(self) -> FailoverController:
        if self._controller is None:
            self._controller = FailoverController(
                report_window_ms=2 * self.config.replica_leader_timeout_ms,
                broker_timeout_ms=self.config.broker_timeout_ms)
        return self._controller

    async def _propose_leaders(self, decisions: list[ChangeLeader]) -> None:
        for decision in decisions:
            log.info("failover: %s/%d at epoch %d -> leader %d", decision.stream,
                     decision.partition, decision.expected_epoch, decision.leader)
        for decision in await self._propose_uncommitted(decisions):
            if self._controller is not None:
                self._controller.retry(decision.stream, decision.partition)

    async def _propose_uncommitted(self, changes: list[ChangeLeader]) -> list[ChangeLeader]:
        """Propose the leader changes; those not committed, each logged. A
        StaleMetadataEpoch counts as done: someone else changed the partition first,
        nothing is left to decide."""
        outcomes = await self._change_leaders(changes)
        uncommitted = []
        for change, outcome in zip(changes, outcomes, strict=True):
            if not isinstance(outcome, PartitionState | StaleMetadataEpoch):
                log.warning("leader change %s not committed: %s", change, outcome)
                uncommitted.append(change)
        return uncommitted

    async def on_report_request(self, request: m.ReportLeaderFailureRequest
                                ) -> m.EmptyResponse:
        """The socket API's handler of REPORT_LEADER_FAILURE."""
        self.on_report(request)
        return m.EmptyResponse()

    def on_report(self, request: m.ReportLeaderFailureRequest) -> None:
        if self.metadata.is_leader:
            self._controller_now().on_report(request.stream, request.partition,
                                             request.leader_epoch, request.reporter, now_ms())

    async def report_leader_failure(self, stream: str, partition: int, epoch: int) -> bool:
        """Tell the metadata leader that this broker gets no answer from a partition leader;
        False when there is no metadata leader to tell or it could not be reached."""
        request = m.ReportLeaderFailureRequest(stream, partition, epoch, self.broker_id)
        leader = self.metadata.leader_broker_id
        log.info("reporting leader of %s/%d at epoch %d to broker %s", stream, partition,
                 epoch, leader)
        if leader is None:
            return False
        if leader == self.broker_id:
            self.on_report(request)
            return self.metadata.is_leader
        address = self.address_of(leader)
        if address is None:
            return False
        await self.peers.request(address, request)
        return True

    def _dial(self, address: str) -> BrokerConnection:
        return BrokerConnection(address, client_id=f"broker-{self.broker_id}",
                                connect_timeout_s=REPORT_TIMEOUT_S,
                                request_timeout_s=REPORT_TIMEOUT_S,
                                tls=client_ssl(self.config.peer_tls),
                                credentials=peer_credentials(self.config))

    async def wait_served(self, stream: str, led_here: Callable[[str, int], bool],
                          timeout_s: float = SERVED_WAIT_S) -> bool:
        """Until every partition of `stream` is served by the broker the metadata names its
        leader (its leader role runs there: subscribed to NATS, answering fetches), so that
        a publish right after a create finds it; False when `timeout_s` passed first. Other
        brokers are asked with METADATA (a leader describes its partitions' offsets), again
        after 2, 5, 10, 20 ms, then every 50 ms."""
        deadline = time.monotonic() + timeout_s
        pauses = iter(SERVED_POLLS_S)
        while waiting := await self._unserved(stream, led_here):
            if time.monotonic() > deadline:
                log.warning("%s: partitions %s not served by their leaders within %.0f s",
                            stream, sorted(waiting)[:10], timeout_s)
                return False
            await asyncio.sleep(next(pauses, SERVED_POLLS_S[-1]))
        return True

    async def _unserved(self, stream: str, led_here: Callable[[str, int], bool]) -> set[int]:
        by_leader: dict[int, set[int]] = {}
        for p in self.metadata.state.stream_partitions(stream):
            if not (p.leader == self.broker_id and led_here(stream, p.partition)):
                by_leader.setdefault(p.leader, set()).add(p.partition)
        waiting: set[int] = set()
        for leader, partitions in by_leader.items():
            address = self.address_of(leader) if leader != self.broker_id else None
            if address is None:
                waiting |= partitions
                continue
            try:
                answer = await self.peers.request(address, m.MetadataRequest([stream]))
            except (JetstreamError, OSError):
                waiting |= partitions
                continue
            assert isinstance(answer, m.MetadataResponse)
            served = {entry["partition"] for described in answer.streams
                      for entry in described.get("partitions", [])
                      if entry.get("leader") == leader and "high_watermark" in entry}
            waiting |= partitions - served
        return waiting

    def live_brokers(self) -> tuple[int, ...]:
        """This broker and those whose metadata Raft connection to it is up."""
        up = {self.raft_ids[a] for a, status in self.metadata.status()["partners"].items()
              if status == "up" and a in self.raft_ids}
        return tuple(sorted(up | {self.broker_id}))

    def leader_candidates(self) -> set[int]:
        """The live brokers that are not shutting down: those a leadership may go to."""
        return set(self.live_brokers()) - self.metadata.state.shutting_down.keys()

    async def wait_live(self, count: int) -> tuple[int, ...]:
        """The live brokers, once there are `count` of them or `broker_timeout_ms` passed
        (connections to partners come up shortly after a start: a stream created then should
        not be refused for brokers that are merely still connecting)."""
        deadline = time.monotonic() + self.config.broker_timeout_ms / 1000
        while len(live := self.live_brokers()) < count and time.monotonic() < deadline:
            await asyncio.sleep(LIVE_POLL_S)
        return live

    def address_of(self, broker_id: int) -> str | None:
        """Where to dial a broker's socket API: its route if one is set, else its address."""
        route = self.config.peer_route_map.get(broker_id)
        if route is not None:
            return route
        info = self.metadata.state.brokers.get(broker_id)
        return None if info is None else info.address

    # -- stop ------------------------------------------------------------------------------------

    async def mark_shutting_down(self) -> None:
        """Mark this broker shutting down in the metadata (see the module docstring), then
        wait up to `controlled_shutdown_wait_ms` while some other live broker is not marked:
        brokers stopped together mark themselves within moments of each other, and one
        that handed over before the others were marked would give them leaderships to
        start as they stop. A metadata that cannot commit the mark in time is logged (the
        hand-over that follows would not commit either)."""
        try:
            await self.metadata.propose(ControlledShutdown(self.broker_id, True),
                                        timeout=MARK_TIMEOUT_S)
        except MetadataUnavailable as exc:
            log.warning("controlled shutdown not marked in the metadata: %s", exc)
            return
        deadline = time.monotonic() + self.config.controlled_shutdown_wait_ms / 1000
        while self.leader_candidates() and time.monotonic() < deadline:
            await asyncio.sleep(SHUTDOWN_POLL_S)

    async def hand_over(self, led: list[tuple[str, int]]) -> None:
        """Move the leadership of each partition in `led` to an in-sync follower that is
        live (its metadata Raft connection is up, as for Kafka's controlled shutdown): a
        proposal naming a broker that is gone would make the partition unavailable if it
        committed, and one made without a quorum may sit in the Raft log and commit later.
        A successor that began to shut down meanwhile refuses it: the leadership stays."""
        changes = []
        live = self.leader_candidates()
        for stream, partition in led:
            state = self.metadata.state.partitions.get((stream, partition))
            if state is None or state.leader != self.broker_id:
                continue
            candidates = [b for b in self._successors(state) if b in live]
            if candidates:
                changes.append(ChangeLeader(stream, partition, state.leader_epoch,
                                            candidates[0]))
        kept = sum(await asyncio.gather(*(self._hand_over_one(change) for change in changes)))
        if kept:
            log.info("%d leaderships kept: the brokers to take them are shutting down too",
                     kept)

    def hand_over_from_full_disk(self, led: list[LedPartition]) -> None:
        """The data disk is full: hand the partitions in `led` (led here) to in-sync
        followers with room, once per leader epoch (in the background)."""
        for decision in self._full_disk.decide(True, led):
            log.warning("%s/%d: the data disk is full: handing the leadership at epoch %d to "
                        "broker %d", decision.stream, decision.partition,
                        decision.leader_epoch, decision.leader)
            self._spawn(self._hand_over_one(ChangeLeader(
                decision.stream, decision.partition, decision.leader_epoch, decision.leader)))

    async def _hand_over_one(self, change: ChangeLeader) -> bool:
        """Propose the change; whether it was refused because its broker is shutting down
        (any other failure is logged)."""
        outcome = await self._leader_changes.submit(change)
        if isinstance(outcome, BrokerShuttingDown):
            return True
        if isinstance(outcome, JetstreamError):
            log.warning("hand-over of %s/%d failed: %s", change.stream, change.partition,
                        outcome)
        return False

    async def hand_over_to(self, stream: str, partition: int,
                           successors: tuple[int, ...]) -> None:
        """Move the partition's leadership from this broker to the first of `successors`
        that is in the ISR (a replica known to hold a healthy copy of damaged data)."""
        state = self.metadata.state.partitions.get((stream, partition))
        if state is None or state.leader != self.broker_id:
            return
        candidates = [r for r in successors if r in state.isr and r != self.broker_id]
        if not candidates:
            log.warning("%s/%d: no in-sync replica to hand over to", stream, partition)
            return
        await self._hand_over_one(ChangeLeader(stream, partition, state.leader_epoch,
                                               candidates[0]))

    def _successors(self, state: PartitionState) -> list[int]:
        """The partition's in-sync replicas other than this broker, in replica order: the
        brokers it may hand its leadership to."""
        return successors(state.replicas, state.isr, self.broker_id)

    async def close(self) -> None:
        await self.peers.close()
        await self._isr_changes.close()
        await self._leader_changes.close()
        await cancel_and_wait(*self._tasks)
        await self.metadata.close()

    def render_metrics(self) -> list[str]:
        """Prometheus lines: the metadata batches proposed, the failover rounds and the
        partitions they examined."""
        lines = []
        for name, kind, text in (
                ("batches_total", "counter",
                 "Leader or ISR change proposals (one Raft entry each), by kind."),
                ("batch_items_total", "counter", "Partitions changed by the batches."),
                ("batch_items_max", "gauge", "Partitions in the largest batch.")):
            lines += [f"# HELP jetstream_metadata_{name} {text}",
                      f"# TYPE jetstream_metadata_{name} {kind}"]
            for batcher in (self._isr_changes, self._leader_changes):
                lines.append(f'jetstream_metadata_{name}{{kind="{batcher.kind}"}} '
                             f"{batcher.metrics.value(name)}")
        for name, value, text in (
                ("ticks", self.failover_ticks, "Failover rounds run as the metadata leader."),
                ("partitions_examined", self.failover_examined,
                 "Partitions the failover rounds examined."),
                ("partitions_indexed", self.failover_indexed,
                 "Partitions read to index them by leader (while a broker is gone).")):
            lines += [f"# HELP jetstream_failover_{name}_total {text}",
                      f"# TYPE jetstream_failover_{name}_total counter",
                      f"jetstream_failover_{name}_total {value}"]
        for name, value, text in (
                ("rounds", self.rebalance_rounds,
                 "Preferred-leader rounds run as the metadata leader."),
                ("changes", self.rebalance_changes,
                 "Leaderships the rounds proposed to give back to their first replica.")):
            lines += [f"# HELP jetstream_leader_rebalance_{name}_total {text}",
                      f"# TYPE jetstream_leader_rebalance_{name}_total counter",
                      f"jetstream_leader_rebalance_{name}_total {value}"]
        lines += [("# HELP jetstream_cluster_peer_links_opened_total Connections to other "
                   "brokers opened for cluster requests (kept open and shared)."),
                  "# TYPE jetstream_cluster_peer_links_opened_total counter",
                  f"jetstream_cluster_peer_links_opened_total {self.peers.opened}"]
        return lines

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
