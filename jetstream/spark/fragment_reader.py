"""Reading one partition's offset range straight from its fragments in the fragment store.

Theory of operation: a Spark task may get a `FragmentSplit` instead of segment files: the
offsets [start, end) of one partition below its leader's local log start, the URL of the
stream's fragment store and the names of the fragments holding them, in offset order
(jetstream.spark.store_planning plans them from the leader's fragment index). The task opens
the store with the brokers' store library (jetstream.tiered.store, obstore: credentials and
endpoint from the executor's environment, like the brokers'), downloads each fragment and
reads it as its kind says:
- a segment fragment is decompressed and its SHA-256 checked against its name (a corrupt
  object is CORRUPT_FRAGMENT naming its URL, never wrong rows), then decoded by the source's
  decoder (jetstream.spark.arrow_decode, CRC of every batch when `verify`), a few MiB at a
  time: the bytes are a segment file's;
- a Parquet fragment (a store Spark's own Parquet reader cannot reach, such as `s3://`
  without hadoop-aws) is read with pyarrow, its rows cut to [start, end) and the timestamp
  bounds.
Fragments only hold committed records, so nothing at or past `end` (fixed at planning) is
returned. A fragment gone from the store since planning (a prune, retention, a lifecycle
rule) raises `FragmentGone` with the first offset not read: the caller Fetches the rest from
the leader, which says DATA_LOSS if the history is gone. A store that cannot be reached does
the same when the split allows it (`fall_back`, readFrom auto), else it is
FRAGMENT_STORE_UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

import jetstream.spark.arrow_decode as arrow_decode
from jetstream.errors import FragmentStoreUnavailable
from jetstream.tiered.names import FragmentKind, FragmentName

if TYPE_CHECKING:
    from jetstream.tiered.store import FragmentStore

# The store library, codecs and pyarrow's Parquet reader are imported by the tasks that read
# fragments only: every Spark task imports this module (its planned tasks name the type).

#: Bytes of segment batches decoded at once (as jetstream.spark.segment_reader reads them).
DECODE_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class FragmentSplit:
    """Offsets [start, end) of a partition and the fragments of `store` holding them, in
    offset order without a gap."""

    stream: str
    partition: int
    start: int
    end: int
    store: str
    fragments: tuple[FragmentName, ...]
    #: Read from the leader when the store cannot be reached (readFrom auto).
    fall_back: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"bad offset range [{self.start}, {self.end})")
        at = self.start
        for name in self.fragments:
            if not name.begin <= at < name.end:
                raise ValueError(f"fragments {[(f.begin, f.end) for f in self.fragments]} "
                                 f"do not hold [{self.start}, {self.end}) without a gap")
            at = name.end
        if at < self.end:
            raise ValueError(f"fragments end at {at}, before {self.end}")


class FragmentGone(Exception):
    """The split is not readable from the store from `offset` on: read the rest from the
    leader."""

    def __init__(self, split: FragmentSplit, offset: int, reason: str) -> None:
        super().__init__(f"{split.stream}/{split.partition} from offset {offset}: {reason}")
        self.offset = offset


def read_fragments(split: FragmentSplit, columns: Sequence[str], *,
                   timestamp_min_ms: int | None = None, timestamp_max_ms: int | None = None,
                   verify: bool = True) -> Iterator[pa.RecordBatch]:
    """The split's rows with exactly `columns` (see the module docstring)."""
    from jetstream.tiered import codec
    from jetstream.tiered.store import FragmentStore

    try:
        store = FragmentStore(split.store)
    except OSError as exc:  # a `file://` store's directory cannot be made
        raise _unreachable(split, split.start,
                           FragmentStoreUnavailable(split.store, str(exc))) from exc
    offset = split.start
    for name in split.fragments:
        end = min(name.end, split.end)
        payload = _download(store, name, split, offset)
        if name.kind is FragmentKind.PARQUET:
            yield from _parquet_rows(payload, columns, offset, end, timestamp_min_ms,
                                     timestamp_max_ms)
        else:
            data = codec.decode(name, payload, store.url_of(name))
            yield from _segment_rows(data, split, columns, offset, end, timestamp_min_ms,
                                     timestamp_max_ms, verify)
        offset = end


def _download(store: FragmentStore, name: FragmentName, split: FragmentSplit,
              offset: int) -> bytes:
    from obstore.exceptions import NotFoundError

    try:
        return store.get(store.key(name))
    except (NotFoundError, FileNotFoundError):
        raise FragmentGone(split, offset, f"{store.url_of(name)} is gone") from None
    except FragmentStoreUnavailable as exc:
        raise _unreachable(split, offset, exc) from exc


def _unreachable(split: FragmentSplit, offset: int, exc: FragmentStoreUnavailable
                 ) -> Exception:
    """What a task raises when the store cannot be reached: FragmentGone (read the rest
    from the leader) when the split may fall back, else the store's error."""
    return FragmentGone(split, offset, str(exc)) if split.fall_back else exc


def _segment_rows(data: bytes, split: FragmentSplit, columns: Sequence[str], offset: int,
                  end: int, timestamp_min_ms: int | None, timestamp_max_ms: int | None,
                  verify: bool) -> Iterator[pa.RecordBatch]:
    view = memoryview(data)
    position = 0
    chunk = DECODE_BYTES
    while offset < end and position < len(view):
        decoded = arrow_decode.decode(
            view[position:position + chunk], stream=split.stream, partition=split.partition,
            columns=columns, start=offset, end=end, timestamp_min_ms=timestamp_min_ms,
            timestamp_max_ms=timestamp_max_ms, verify=verify)
        if decoded.consumed == 0:
            if position + chunk >= len(view):
                raise ValueError(f"{split.stream}/{split.partition}: a fragment ends in a "
                                 f"partial batch at byte {position}")
            chunk *= 2  # one batch larger than a chunk
            continue
        chunk = DECODE_BYTES
        position += decoded.consumed
        if decoded.next_offset is not None:
            offset = decoded.next_offset
        if decoded.batch.num_rows:
            yield decoded.batch


def _parquet_rows(payload: bytes, columns: Sequence[str], start: int, end: int,
                  timestamp_min_ms: int | None, timestamp_max_ms: int | None
                  ) -> Iterator[pa.RecordBatch]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(payload))
    wanted = pc.and_(pc.greater_equal(table["offset"], start), pc.less(table["offset"], end))
    micros = table["timestamp"].cast(pa.int64())
    if timestamp_min_ms is not None:
        wanted = pc.and_(wanted, pc.greater_equal(micros, timestamp_min_ms * 1000))
    if timestamp_max_ms is not None:
        wanted = pc.and_(wanted, pc.less_equal(micros, timestamp_max_ms * 1000))
    rows = table.filter(wanted).select(list(columns)).cast(arrow_decode.arrow_schema(columns))
    yield from rows.to_batches()
