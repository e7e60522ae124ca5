"""Messages about a partition's fragments in its fragment store (tiered storage).

Theory of operation: FRAGMENTS goes to a partition's leader, which answers the fragments its
index holds (from the store's listings and its own verified uploads) and the partition's
extents: what is readable from the store and what is on its disk. With `prune`, the leader
first deletes the fragments that end at or before `before_offset` (or, with `before_ms`, the
oldest fragments modified before that time) from the store, and its local segments below the
same cut: the history before it is gone everywhere.

    op         request header                         response header
    FRAGMENTS  stream, partition, prune=false,         stream, partition, broker_id,
               before_offset=-1, before_ms=-1          extents: {...}, fragments: [{begin,
                                                       end, size_bytes, compression, url,
                                                       ...}], pruned: [...]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from jetstream.protocol.base import Request, Response
from jetstream.protocol.fields import (
    BROKER_ID_MAX,
    OFFSET_MAX,
    PARTITION_MAX,
    as_list,
    as_map,
    bad,
    check_bool,
    check_int,
    check_stream,
)
from jetstream.protocol.frames import Op

#: Most fragments one answer lists (at 64 MiB a fragment, 6 PiB of a partition).
FRAGMENTS_MAX = 100_000
#: Latest time a prune may name: 1e15 ms is past the year 33000.
TIME_MS_MAX = 10**15


@dataclass(frozen=True, slots=True)
class FragmentsResponse(Response):
    stream: str
    partition: int
    broker_id: int
    extents: dict[str, Any]
    fragments: list[dict[str, Any]]
    pruned: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("broker_id", self.broker_id, 0, BROKER_ID_MAX)
        as_map("extents", self.extents)
        for name in ("fragments", "pruned"):
            entries = as_list(name, getattr(self, name))
            if len(entries) > FRAGMENTS_MAX:
                raise bad(name, f"more than {FRAGMENTS_MAX}")
            for i, entry in enumerate(entries):
                as_map(f"{name}[{i}]", entry)


@dataclass(frozen=True, slots=True)
class FragmentsRequest(Request):
    """The partition's fragments; with `prune`, delete those before the cut first."""

    op: ClassVar[Op] = Op.FRAGMENTS
    response_type: ClassVar[type[Response]] = FragmentsResponse
    stream: str
    partition: int
    prune: bool = False
    before_offset: int = -1
    before_ms: int = -1

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_bool("prune", self.prune)
        check_int("before_offset", self.before_offset, -1, OFFSET_MAX)
        check_int("before_ms", self.before_ms, -1, TIME_MS_MAX)
        if self.prune and (self.before_offset < 0) == (self.before_ms < 0):
            raise bad("before_offset", "or before_ms (one of them) names where a prune cuts")


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (FragmentsRequest,)
