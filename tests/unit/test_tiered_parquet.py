"""Parquet fragments (fragment_format parquet | both), on real logs and real stores (moto's S3
server and `file://`): each equals its segment fragment row for row, read back with pyarrow;
names pair the two kinds; row groups carry offset and timestamp statistics; local segments
wait for Parquet with both formats; a compacted stream gets Parquet only of cleaned
segments; retention takes Parquet fragments too."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jetstream.compaction import checkpoint as cleaner_checkpoint
from jetstream.errors import InvalidStreamConfig
from jetstream.raft_meta.model import StreamConfig
from jetstream.spark import arrow_decode
from jetstream.stream import format as fmt
from jetstream.stream.handles import HandlePool
from jetstream.stream.log import Log
from jetstream.tiered import codec, parquet
from jetstream.tiered.index import FragmentIndex, StoredFragment
from jetstream.tiered.names import (
    Compression,
    FragmentKind,
    FragmentName,
    parse_file_name,
)
from jetstream.tiered.offload import PassResult
from jetstream.tiered.partition_tier import PartitionTier, TierConfig
from jetstream.tiered.planner import TotalRetention, plan_parquet
from jetstream.tiered.reader import FragmentCache
from jetstream.tiered.settings import FragmentFormat, StoreRetention, TieredSettings
from jetstream.tiered.store import FragmentStore, StoreRegistry
from tests.unit.log_helpers import Clock, make

STREAM, PARTITION = "orders", 0
NO_RETENTION = TotalRetention(None, None, None)


def mixed_records(log: Log, count: int) -> None:
    """`count` records of every shape: keys and null keys, tombstones, headers, subjects,
    batches of differing sizes and epochs."""
    at = 0
    while at < count:
        per = 1 + at % 5
        records = [fmt.Record(
            None if (at + i) % 7 == 3 else f"value-{at + i}".encode() * (1 + (at + i) % 4),
            None if (at + i) % 5 == 0 else f"k{(at + i) % 11}".encode(),
            {"h": f"{at + i}".encode(), "e": b""} if (at + i) % 3 == 0 else fmt.NO_HEADERS,
            f"orders.{(at + i) % 4}", 1_700_000_000_000 + (at + i) * 1000)
            for i in range(per)]
        log.append(records, at // 100)
        at += per


def new_tier(url: str, tmp_path: Path, form: FragmentFormat, *,
             compression: Compression = Compression.ZSTD, local_bytes: int | None = None,
             compacted: bool = False) -> PartitionTier:
    cache = FragmentCache(tmp_path / "cache", 1 << 30, HandlePool(64), None)
    settings = TieredSettings(url, compression, None, local_bytes, StoreRetention.DELETE,
                              form, compacted)
    return PartitionTier(STREAM, PARTITION, settings, StoreRegistry(), cache, TierConfig(),
                         None)


def run_passes(tier: PartitionTier, log: Log, hw: int | None = None,
               total: TotalRetention = NO_RETENTION, passes: int = 8) -> None:
    for _ in range(passes):
        job = tier.prepare(log, log.log_end_offset if hw is None else hw, total, 0, 0)
        outcome = job()
        assert isinstance(outcome, PassResult)
        tier.finish(outcome, 0)
        if outcome.backlog_bytes <= 0:
            return


def by_kind(tier: PartitionTier, kind: FragmentKind) -> list[StoredFragment]:
    return [f for f in tier.index.all() if f.name.kind is kind]


def table_of(store: FragmentStore, fragment: StoredFragment) -> pa.Table:
    return pq.read_table(io.BytesIO(store.get(store.key(fragment.name))))


def segment_rows(store: FragmentStore, fragment: StoredFragment) -> pa.Table:
    """The rows of a segment fragment, decoded by the Spark source's decoder."""
    data = codec.decode(fragment.name, store.get(store.key(fragment.name)), "test")
    decoded = arrow_decode.decode(data, stream=STREAM, partition=PARTITION,
                                  columns=parquet.COLUMNS, start=fragment.begin,
                                  end=fragment.end)
    return pa.Table.from_batches([decoded.batch])


@pytest.fixture
def log(tmp_path: Path) -> Log:
    log = make(tmp_path / "log", Clock(), segment_bytes_max=8192)
    mixed_records(log, 600)
    assert len(log.segment_base_offsets) >= 6
    return log


@pytest.mark.parametrize("where", ["file", "s3"])
def test_parquet_fragment_equals_its_segment_row_for_row(log: Log, tmp_path: Path, where: str,
                                                         request: pytest.FixtureRequest
                                                         ) -> None:
    url = (f"file://{tmp_path / 'store'}" if where == "file"
           else request.getfixturevalue("s3_bucket") + "/history")
    tier = new_tier(url, tmp_path, FragmentFormat.BOTH)
    run_passes(tier, log)
    store = tier.store()
    segments, parquets = by_kind(tier, FragmentKind.SEGMENT), by_kind(tier, FragmentKind.PARQUET)
    sealed = log.segment_base_offsets[:-1]
    assert [f.begin for f in segments] == [f.begin for f in parquets] == sealed
    total = 0
    for segment, columns in zip(segments, parquets, strict=True):
        # Named like its segment fragment, with .parquet.
        assert columns.name == segment.name.as_parquet()
        assert store.key(columns.name).endswith(".parquet")
        assert store.key(columns.name)[:-len(".parquet")] == \
            store.key(segment.name).rsplit(".seg", 1)[0]
        table = table_of(store, columns)
        expected = segment_rows(store, segment)
        assert table.schema.equals(parquet.SCHEMA)
        assert table.num_rows == segment.end - segment.begin > 0
        assert table.to_pylist() == expected.to_pylist()
        total += table.num_rows
    assert total == log.segment_base_offsets[-1]  # every sealed offset
    # A listing by a fresh broker knows both kinds.
    fresh = FragmentIndex(store.list_partition(STREAM, PARTITION))
    assert [f.name for f in fresh.parquet.useful] == [f.name for f in parquets]
    assert [f.name for f in fresh.fragments] == [f.name for f in segments]


def test_every_row_of_the_log_and_what_the_rows_hold(log: Log, tmp_path: Path) -> None:
    tier = new_tier(f"file://{tmp_path / 'store'}", tmp_path, FragmentFormat.PARQUET,
                    compression=Compression.SNAPPY)
    run_passes(tier, log)
    store = tier.store()
    assert by_kind(tier, FragmentKind.SEGMENT) == []  # parquet only: no segment fragment
    table = pa.concat_tables([table_of(store, f) for f in by_kind(tier, FragmentKind.PARQUET)])
    rows = table.to_pylist()
    assert [r["offset"] for r in rows] == list(range(log.segment_base_offsets[-1]))
    records = {r.offset: r for r in _stored(log)}
    for row in rows:
        record = records[row["offset"]]
        assert (row["stream"], row["partition"]) == (STREAM, PARTITION)
        assert (row["key"], row["value"], row["subject"]) == (record.key, record.value,
                                                              record.subject)
        assert dict(row["headers"]) == dict(record.headers)
        assert int(row["timestamp"].timestamp() * 1000) == record.timestamp_ms
    epochs = [r["leader_epoch"] for r in rows]  # each batch's: appended at epoch offset//100
    assert epochs == sorted(epochs) and epochs[0] == 0 and epochs[-1] == rows[-1]["offset"] // 100


def test_row_groups_carry_offset_and_timestamp_statistics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 131_072)  # several groups, small data
    log = make(tmp_path / "log", Clock(), segment_bytes_max=64 << 20)
    batch = [fmt.Record(b"v", None, fmt.NO_HEADERS, "", 1_700_000_000_000 + i)
             for i in range(1000)]
    for _ in range(300):
        log.append(batch, 0)
    data, _next = log.read_bytes(0, log.size_bytes, log.log_end_offset)
    payload = parquet.segment_parquet(data, STREAM, PARTITION, 0, 300_000, Compression.ZSTD)
    meta = pq.read_metadata(io.BytesIO(payload))
    assert meta.num_row_groups == 3  # 300,000 rows in groups of at most 131,072
    first, last = meta.row_group(0), meta.row_group(2)
    names = [first.column(i).path_in_schema for i in range(first.num_columns)]
    offset, stamp = names.index("offset"), names.index("timestamp")
    assert (first.column(offset).statistics.min, first.column(offset).statistics.max) == (
        0, parquet.ROW_GROUP_ROWS - 1)
    assert last.column(offset).statistics.max == 299_999
    assert first.column(stamp).statistics.has_min_max
    assert not first.column(names.index("value")).statistics  # only the planned columns
    log.close()


def test_with_both_formats_local_segments_wait_for_parquet(log: Log, tmp_path: Path) -> None:
    # A compacted stream cleaned up to its third segment: segment fragments of every sealed
    # segment, Parquet of the cleaned ones only, so only those leave the disk.
    clean_to = log.segment_base_offsets[2]
    cleaner_checkpoint.write(log.directory, cleaner_checkpoint.CleanerCheckpoint(clean_to))
    tier = new_tier(f"file://{tmp_path / 'store'}", tmp_path, FragmentFormat.BOTH,
                    local_bytes=1, compacted=True)
    sealed_end = log.segment_base_offsets[-1]
    run_passes(tier, log)
    assert tier.index.covers(0, sealed_end)
    assert tier.index.parquet.end_offset == clean_to
    assert log.log_start_offset == clean_to
    cleaner_checkpoint.write(log.directory, cleaner_checkpoint.CleanerCheckpoint(sealed_end))
    run_passes(tier, log)
    assert tier.index.parquet.covers(0, sealed_end)
    assert log.log_start_offset == sealed_end


def test_compacted_stream_gets_parquet_of_cleaned_segments_only(log: Log, tmp_path: Path
                                                                ) -> None:
    clean_to = log.segment_base_offsets[2]
    cleaner_checkpoint.write(log.directory, cleaner_checkpoint.CleanerCheckpoint(clean_to))
    tier = new_tier(f"file://{tmp_path / 'store'}", tmp_path, FragmentFormat.PARQUET,
                    compacted=True)
    run_passes(tier, log)
    parquets = by_kind(tier, FragmentKind.PARQUET)
    assert parquets and parquets[-1].end == clean_to
    cleaner_checkpoint.write(log.directory, cleaner_checkpoint.CleanerCheckpoint(
        log.log_end_offset))
    run_passes(tier, log)
    assert tier.index.parquet.covers(0, log.segment_base_offsets[-1])


def test_retention_takes_parquet_fragments(log: Log, tmp_path: Path) -> None:
    tier = new_tier(f"file://{tmp_path / 'store'}", tmp_path, FragmentFormat.PARQUET)
    run_passes(tier, log)
    before = by_kind(tier, FragmentKind.PARQUET)
    run_passes(tier, log, total=TotalRetention(None, None, 300))
    after = by_kind(tier, FragmentKind.PARQUET)
    assert after and len(after) < len(before)
    assert all(log.log_end_offset - f.begin <= 300 for f in after)
    keys = {o.key for o in tier.store().list_keys("")}
    assert keys == {tier.store().key(f.name) for f in after}


def test_parquet_names_round_trip_and_pair_with_segments() -> None:
    name = FragmentName(0, 10, STREAM, 3, 7, "ab" * 32, Compression.ZSTD)
    twin = name.as_parquet()
    assert twin.file_name.endswith(".parquet") and twin.kind is FragmentKind.PARQUET
    assert parse_file_name(twin.file_name, STREAM, 3) == twin
    assert parse_file_name(name.file_name, STREAM, 3) == name
    index = FragmentIndex([StoredFragment(name, 1, 0), StoredFragment(twin, 1, 0)])
    assert index.covering(5) == StoredFragment(name, 1, 0)  # reads never get Parquet
    assert index.parquet.covering(5) == StoredFragment(twin, 1, 0)
    assert plan_parquet([], 10, index.parquet, None) == ((), 0)


def test_fragment_format_setting() -> None:
    config = StreamConfig("s", "s.*", fragment_store="file:///tmp/x", fragment_format="both")
    assert config.fragment_format is FragmentFormat.BOTH
    assert config.to_dict()["fragment_format"] == "both"
    assert config.updated({"fragment_format": "parquet"}).fragment_format is \
        FragmentFormat.PARQUET
    with pytest.raises(InvalidStreamConfig) as bad:
        StreamConfig("s", "s.*", fragment_store="file:///tmp/x", fragment_format="orc")
    assert bad.value.fields.get("field") == "fragment_format"
    with pytest.raises(InvalidStreamConfig) as refused:
        StreamConfig("s", "s.*", fragment_store="file:///tmp/x", fragment_format="parquet",
                     local_retention_bytes=10)
    assert refused.value.fields.get("field") == "local_retention_bytes"


def _stored(log: Log) -> list[fmt.StoredRecord]:
    from tests.unit.log_helpers import read_all
    return read_all(log)


def test_a_store_read_plan_cuts_ranges_at_the_parquet_run() -> None:
    from jetstream.spark.store_planning import partition_fragments, plan_store_read

    def entry(begin: int, end: int, form: str = "parquet") -> dict[str, object]:
        return {"begin": begin, "end": end, "leader_epoch": 0, "sha256": f"{begin:064x}",
                "format": form, "size_bytes": 1, "modified_ms": 0,
                "url": f"s3://b/p/{STREAM}/0/{begin}.parquet"}

    found = partition_fragments(STREAM, 0, [entry(0, 10), entry(10, 20), entry(30, 40),
                                            entry(0, 40, "segment")])
    assert found.stored_start(15) == 0 and found.stored_start(0) is None
    plan = plan_store_read({(STREAM, 0): (5, 35), (STREAM, 1): (0, 9), (STREAM, 2): (3, 3)},
                           {(STREAM, 0): found})
    [piece] = plan.pieces
    assert (piece.partition, piece.start, piece.end) == (0, 5, 20)  # up to the gap at 20
    assert piece.urls == (f"s3a://b/p/{STREAM}/0/0.parquet", f"s3a://b/p/{STREAM}/0/10.parquet")
    assert plan.tail == {(STREAM, 0): (20, 35), (STREAM, 1): (0, 9), (STREAM, 2): (3, 3)}
    short = plan_store_read({(STREAM, 0): (12, 15)}, {(STREAM, 0): found})
    assert [(p.start, p.end) for p in short.pieces] == [(12, 15)]
    assert short.tail == {(STREAM, 0): (15, 15)}


def test_overlapping_parquet_fragments_are_never_read_twice() -> None:
    from jetstream.spark.options import parse_read_options
    from jetstream.spark.store_planning import StorePlan, partition_fragments, plan_store_read
    from jetstream.spark.store_read import StoredHistory, tail_ranges

    def entry(begin: int, end: int) -> dict[str, object]:
        return {"begin": begin, "end": end, "leader_epoch": 0, "sha256": f"{begin:064x}",
                "format": "parquet", "size_bytes": 1, "modified_ms": 0,
                "url": f"file:///s/{STREAM}/0/{begin}.parquet"}

    # Two leaders cut segments differently: [0, 10) [10, 20) and [5, 25).
    found = partition_fragments(STREAM, 0, [entry(0, 10), entry(10, 20), entry(5, 25)])
    plan = plan_store_read({(STREAM, 0): (0, 30)}, {(STREAM, 0): found})
    [piece] = plan.pieces
    assert (piece.start, piece.end) == (0, 10)  # [5, 25) overlaps it: the run stops there
    assert plan.tail == {(STREAM, 0): (10, 30)}
    # A tail below the leader's local log start is Fetched (the leader's store serves it)
    # where no segment fragment is known (or with readFrom=brokers).
    options = parse_read_options({"brokers": "127.0.0.1:1", "stream": STREAM,
                                  "readFrom": "brokers"})
    below, rest = tail_ranges(StorePlan((), {(STREAM, 0): (10, 30), (STREAM, 1): (0, 5)}),
                              StoredHistory(local_starts={(STREAM, 0): 22}), options)
    assert [(t.partition, t.start, t.end, t.files) for t in below] == [(0, 10, 22, None)]
    assert rest.ranges == {(STREAM, 0): (22, 30), (STREAM, 1): (0, 5)}


def test_data_columns_are_dictionary_encoded_only_when_the_whole_dictionary_fits(
        tmp_path: Path) -> None:
    """Keys and values get a dictionary only when every distinct one fits in one dictionary
    page: never a column chunk half dictionary, half plain. Offsets and timestamps never."""
    log = make(tmp_path / "log", Clock(), segment_bytes_max=64 << 20)
    few = [fmt.Record(b"v" * 100, b"k%d" % (i % 7)) for i in range(1000)]
    for _ in range(20):
        log.append(few, 0)
    many = [fmt.Record(b"%0100d" % i, b"%064d" % i) for i in range(20_000)]
    log.append(many, 0)
    encodings: dict[str, dict[str, bool]] = {}
    for name, begin, end in (("few", 0, 20_000), ("many", 20_000, 40_000)):
        data, _next = log.read_bytes(begin, 64 << 20, end)
        payload = parquet.segment_parquet(data, STREAM, PARTITION, begin, end,
                                          Compression.SNAPPY)
        group = pq.read_metadata(io.BytesIO(payload)).row_group(0)
        encodings[name] = {group.column(i).path_in_schema: group.column(i).has_dictionary_page
                           for i in range(group.num_columns)}
        assert pq.read_table(io.BytesIO(payload)).column("key").to_pylist() == [
            r.key for r in (few * 20 if name == "few" else many)]
    assert encodings["few"]["key"] and encodings["few"]["value"]
    # 20,000 distinct 64 B keys and 100 B values: about 1.4 and 2.0 MiB of dictionary.
    assert not encodings["many"]["key"] and not encodings["many"]["value"]
    for columns in encodings.values():
        assert columns["stream"] and columns["subject"] and columns["leader_epoch"]
        assert columns["headers.key_value.key"] and not columns["headers.key_value.value"]
        assert not columns["offset"] and not columns["timestamp"]
    log.close()
