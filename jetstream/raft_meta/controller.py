"""The metadata leader's failover decisions, as a pure class.

Theory of operation: followers that get no answer from their partition leader for
`replica_leader_timeout_ms` report it to the metadata leader (`on_report`). The metadata
leader also knows which brokers are connected to the Raft group (`on_broker_seen`). A
partition's leader is replaced when a majority of its in-sync followers reported it within
`report_window_ms` for the current leader epoch, or when its broker has not been seen for
`broker_timeout_ms`. The new leader comes from the ISR only (every ISR member holds every
committed record), never from outside it, and never is a broker shutting down (it would
only hand the leadership on); the failed leader leaves the ISR. Decisions are
`ChangeLeader` commands, compare-and-set on the epoch the reports were about, so a decision
made on stale state is refused by the state machine rather than applied.

Work per `decide` is proportional to what may have failed, not to the number of
partitions: the partitions reported since the last call, those waiting for a live in-sync
replica to take over (or for the metadata to reach a reported epoch), and those led by a
broker not seen within `broker_timeout_ms` (an index of partitions by leader, rebuilt from
the state only while some broker is gone and the state changed). With every broker alive
and no report pending, nothing is examined. `examined` and `indexed` count the partitions
looked at, for /metrics.

Time comes in as `now_ms`; nothing here does IO.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from jetstream.raft_meta.fsm import ChangeLeader, MetadataState
from jetstream.raft_meta.model import PartitionState

#: Most partitions with reports kept at once; older reports go first.
REPORTS_MAX = 100_000


@dataclass(slots=True)
class _Reports:
    leader_epoch: int
    reporters: dict[int, int] = field(default_factory=dict)  # broker id -> time reported


class FailoverController:
    def __init__(self, *, report_window_ms: int, broker_timeout_ms: int) -> None:
        self.report_window_ms = report_window_ms
        self.broker_timeout_ms = broker_timeout_ms
        self._reports: dict[tuple[str, int], _Reports] = {}
        self._last_seen: dict[int, int] = {}
        #: Partitions a decision was made for, by epoch: not decided twice.
        self._decided: dict[tuple[str, int], int] = {}
        #: Partitions reported since the last decision round, and partitions to look at
        #: again at the next one (bounded by REPORTS_MAX and the partitions of dead brokers).
        self._reported: set[tuple[str, int]] = set()
        self._waiting: set[tuple[str, int]] = set()
        #: Partitions by leader, as of metadata version `_index_version` (-1: none).
        self._index: dict[int, list[tuple[str, int]]] = {}
        self._index_version = -1
        #: Partitions examined by `decide`, and read while rebuilding the index.
        self.examined = 0
        self.indexed = 0

    def on_broker_seen(self, broker_id: int, now_ms: int) -> None:
        self._last_seen[broker_id] = now_ms

    def on_report(self, stream: str, partition: int, leader_epoch: int, reporter: int,
                  now_ms: int) -> None:
        """Broker `reporter` gets no answer from the leader of `stream/partition` at
        `leader_epoch`."""
        key = (stream, partition)
        reports = self._reports.get(key)
        if reports is None or reports.leader_epoch < leader_epoch:
            if len(self._reports) >= REPORTS_MAX:
                self._reports.pop(next(iter(self._reports)))
            reports = self._reports[key] = _Reports(leader_epoch)
        if reports.leader_epoch == leader_epoch:
            reports.reporters[reporter] = now_ms
            if len(self._reported) < REPORTS_MAX:
                self._reported.add(key)

    def decide(self, state: MetadataState, now_ms: int) -> list[ChangeLeader]:
        """Leader changes to propose now."""
        keys = self._reported | self._waiting
        self._reported = set()
        dead = [b for b in state.brokers if not self._alive(b, now_ms)]
        if dead:
            led = self._led_by(state)
            for broker in dead:
                keys.update(led.get(broker, ()))
        decisions = []
        for key in sorted(keys):  # in a deterministic order
            self.examined += 1
            partition = state.partitions.get(key)
            self._waiting.discard(key)
            if partition is None or self._decided.get(key) == partition.leader_epoch:
                continue
            if self._leader_failed(partition, now_ms):
                new_leader = self.choose_leader(partition, now_ms, state.shutting_down)
                if new_leader is None:
                    self._waiting.add(key)  # no live ISR member yet: look again next time
                    continue
                decisions.append(ChangeLeader(partition.stream, partition.partition,
                                              partition.leader_epoch, new_leader))
                self._decided[key] = partition.leader_epoch
            elif self._reported_ahead(partition, now_ms):
                self._waiting.add(key)  # reports about an epoch the state has not reached
        return decisions

    def _led_by(self, state: MetadataState) -> dict[int, list[tuple[str, int]]]:
        """The partitions each broker leads in `state` (rebuilt when the state changed)."""
        if self._index_version != state.version:
            self._index.clear()
            for key, partition in state.partitions.items():
                self._index.setdefault(partition.leader, []).append(key)
            self._index_version = state.version
            self.indexed += len(state.partitions)
        return self._index

    def _reported_ahead(self, partition: PartitionState, now_ms: int) -> bool:
        reports = self._reports.get((partition.stream, partition.partition))
        return reports is not None and reports.leader_epoch > partition.leader_epoch and any(
            now_ms - at <= self.report_window_ms for at in reports.reporters.values())

    def _leader_failed(self, partition: PartitionState, now_ms: int) -> bool:
        if not self._alive(partition.leader, now_ms):
            return True
        reports = self._reports.get((partition.stream, partition.partition))
        if reports is None or reports.leader_epoch != partition.leader_epoch:
            return False
        followers = [b for b in partition.isr if b != partition.leader]
        recent = [b for b in followers
                  if now_ms - reports.reporters.get(b, -10**18) <= self.report_window_ms]
        return bool(followers) and len(recent) * 2 > len(followers)

    def _alive(self, broker_id: int, now_ms: int) -> bool:
        seen = self._last_seen.get(broker_id)
        # A broker never seen since this controller started gets a grace period from the
        # first decision: the metadata leader may just have been elected.
        if seen is None:
            self._last_seen[broker_id] = now_ms
            return True
        return now_ms - seen <= self.broker_timeout_ms

    def choose_leader(self, partition: PartitionState, now_ms: int,
                      shutting_down: Collection[int] = ()) -> int | None:
        """The next leader: an ISR member other than the failed leader, alive and not
        `shutting_down`, in the order of the replica list (the preferred replicas first).
        None when there is none: the partition stays unavailable rather than lose committed
        records (a whole cluster that stops leaves each leadership where it was)."""
        for broker in partition.replicas:
            if broker != partition.leader and broker in partition.isr and \
                    broker not in shutting_down and self._alive(broker, now_ms):
                return broker
        return None

    def retry(self, stream: str, partition: int) -> None:
        """A decision was not committed (no metadata majority, a timeout): decide again on
        the next call if the leader is still failed."""
        self._decided.pop((stream, partition), None)
        self._waiting.add((stream, partition))

    def forget(self, stream: str, partition: int) -> None:
        self._reports.pop((stream, partition), None)
        self._decided.pop((stream, partition), None)
        self._waiting.discard((stream, partition))
