"""The client's cache of cluster metadata: brokers, streams, their partitions and leaders.

Theory of operation: the cache holds what the last Metadata (or ListStreams) answer said,
and nothing else: it never guesses. Requests are routed by it (routing.py), and publishing
picks partitions by it (partitioner.py), so it keeps an index of the streams by subject next
to the streams by name. It is a plain object without IO: the router fills it from answers
and says when (`now`, a monotonic time in seconds), and `is_stale` tells whether an answer
is older than the age the client tolerates. An answer about one stream (`put_stream`) or its
absence (`drop_stream`) corrects that stream alone, in the index too: a client creating its
n-th stream does not rebuild an index of n (which made each create cost more than the last).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jetstream.client.types import BrokerInfo, PartitionInfo, StreamInfo
from jetstream.errors import UnknownPartition


class ClusterMetadata:
    """Brokers by id and streams by name (and subject), as of the last answer."""

    def __init__(self) -> None:
        self.brokers: dict[int, BrokerInfo] = {}
        #: The broker leading the metadata as of the last refresh; None when unknown.
        self.metadata_leader: int | None = None
        self._streams: dict[str, StreamInfo] = {}
        self._by_subject: dict[str, list[StreamInfo]] = {}
        #: When the streams were last read in full (monotonic seconds).
        self.updated_at = float("-inf")

    def broker_list(self) -> list[BrokerInfo]:
        """The brokers, by id."""
        return [self.brokers[i] for i in sorted(self.brokers)]

    def set_brokers(self, brokers: Iterable[Mapping[str, Any]]) -> None:
        self.brokers = {b["id"]: BrokerInfo.from_dict(b) for b in brokers}

    def set_metadata_leader(self, broker_id: int) -> None:
        """The metadata leader an answer names; -1 (none known) becomes None."""
        self.metadata_leader = None if broker_id < 0 else broker_id

    def set_streams(self, streams: Iterable[StreamInfo], now: float) -> None:
        """Every stream there is, as an answer read at `now` says."""
        self._streams = {s.name: s for s in streams}
        self._index_subjects()
        self.updated_at = now

    def put_stream(self, stream: StreamInfo) -> None:
        self.drop_stream(stream.name)
        self._streams[stream.name] = stream
        on_subject = self._by_subject.setdefault(stream.subject, [])
        on_subject.insert(bisect.bisect(on_subject, stream.name, key=_name), stream)

    def drop_stream(self, name: str) -> None:
        old = self._streams.pop(name, None)
        if old is None:
            return
        on_subject = self._by_subject[old.subject]
        on_subject.pop(bisect.bisect_left(on_subject, name, key=_name))
        if not on_subject:
            del self._by_subject[old.subject]

    def stream(self, name: str) -> StreamInfo | None:
        return self._streams.get(name)

    def is_stale(self, now: float, max_age_s: float) -> bool:
        return now - self.updated_at > max_age_s

    def streams_on(self, subject: str) -> Sequence[StreamInfo]:
        """The streams reading exactly `subject`, by name."""
        return self._by_subject.get(subject, ())

    def partition_count(self, subject: str) -> int:
        """Partitions of the first stream (by name) reading exactly `subject` that has more
        than one; 1 when there is none."""
        for stream in self.streams_on(subject):
            if stream.partition_count > 1:
                return stream.partition_count
        return 1

    def _index_subjects(self) -> None:
        by_subject: dict[str, list[StreamInfo]] = {}
        for stream in sorted(self._streams.values(), key=lambda s: s.name):
            by_subject.setdefault(stream.subject, []).append(stream)
        self._by_subject = by_subject


def _name(stream: StreamInfo) -> str:
    return stream.name


def partition_of(stream: StreamInfo, partition: int) -> PartitionInfo:
    """Partition `partition` of `stream`. Raises UnknownPartition when it has no such one."""
    if not 0 <= partition < stream.partition_count:
        raise UnknownPartition(stream.name, partition)
    return stream.partitions[partition]
