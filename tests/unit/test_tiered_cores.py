"""Tiered storage's pure parts: fragment names, the codec, the fragment index, the offload
planner and the stream settings."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jetstream.errors import CorruptFragment, InvalidStreamConfig
from jetstream.raft_meta.model import StreamConfig
from jetstream.tiered import codec
from jetstream.tiered.index import FragmentIndex, StoredFragment, resolve
from jetstream.tiered.names import (
    BadFragmentName,
    Compression,
    FragmentKind,
    FragmentName,
    parse_key,
    partition_prefix,
)
from jetstream.tiered.planner import (
    LocalRetention,
    SegmentInfo,
    TotalRetention,
    cut_for_time,
    fragments_below,
    plan_offload,
    retention_cut,
)
from jetstream.tiered.settings import StoreRetention, settings_of

SHA = "ab" * 32
NOW = 10_000_000


def name(begin: int, end: int, sha: str = SHA, epoch: int = 0,
         compression: Compression = Compression.NONE) -> FragmentName:
    return FragmentName(begin, end, "orders", 3, epoch, sha, compression)


def frag(begin: int, end: int, size: int = 100, modified: int = 0, sha: str = SHA
         ) -> StoredFragment:
    return StoredFragment(name(begin, end, sha), size, modified)


# -- names ------------------------------------------------------------------------------------


def test_a_name_is_self_describing() -> None:
    n = name(0x10, 0x2a, epoch=7, compression=Compression.ZSTD)
    assert n.key("tier/a") == (f"tier/a/orders/3/0000000000000010-000000000000002a-7-{SHA}"
                               ".seg.zst")
    assert n.key("") == f"orders/3/{n.file_name}"
    assert parse_key(n.key("tier/a"), "tier/a") == n
    assert partition_prefix("/tier/a/", "orders", 3) == "tier/a/orders/3/"
    assert partition_prefix("", "orders", 3) == "orders/3/"


@given(begin=st.integers(0, 2**63), length=st.integers(1, 2**40),
       epoch=st.integers(0, 2**32 - 1), sha=st.binary(min_size=32, max_size=32),
       compression=st.sampled_from(list(Compression)), stream=st.from_regex(
           r"[A-Za-z0-9_-]{1,64}", fullmatch=True), partition=st.integers(0, 1023),
       prefix=st.sampled_from(["", "p", "a/b/c"]))
def test_names_round_trip(begin: int, length: int, epoch: int, sha: bytes,
                          compression: Compression, stream: str, partition: int,
                          prefix: str) -> None:
    n = FragmentName(begin, begin + length, stream, partition, epoch, sha.hex(), compression)
    assert parse_key(n.key(prefix), prefix) == n


@pytest.mark.parametrize("key", [
    "orders/3/readme.txt",
    f"orders/3/0000000000000010-0000000000000010-0-{SHA}.seg",  # empty range
    f"orders/3/0000000000000010-000000000000002A-0-{SHA}.seg",  # upper-case hex
    f"orders/3/0000000000000010-000000000000002a-01-{SHA}.seg",  # leading zero epoch
    f"orders/3/0000000000000010-000000000000002a-0-{SHA}.gz",
    f"orders/03/0000000000000010-000000000000002a-0-{SHA}.seg",
    f"orders/0000000000000010-000000000000002a-0-{SHA}.seg",
    f"other/orders/3/0000000000000010-000000000000002a-0-{SHA}.seg",
])
def test_other_keys_are_not_fragments(key: str) -> None:
    # The last one is a fragment name, under another prefix than the store's.
    with pytest.raises(BadFragmentName):
        parse_key(key, "x" if key.startswith("other/") else "")


# -- codec ------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", list(Compression))
def test_codec_round_trips_and_checks_the_digest(compression: Compression) -> None:
    data = b"segment bytes " * 1000
    encoded = codec.encode(data, compression)
    assert encoded.sha256 == codec.sha256_hex(data) and encoded.raw_bytes == len(data)
    if compression is not Compression.NONE:
        assert len(encoded.payload) < len(data)
    n = name(0, 10, encoded.sha256, compression=compression)
    assert codec.decode(n, encoded.payload, "s3://b/k") == data
    damaged = bytearray(encoded.payload)
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(CorruptFragment) as info:
        codec.decode(n, bytes(damaged), "s3://b/k")
    assert info.value.code == "CORRUPT_FRAGMENT" and info.value.url == "s3://b/k"


# -- index ------------------------------------------------------------------------------------


def test_overlaps_are_resolved_by_coverage() -> None:
    a, b, c, d = frag(0, 100), frag(50, 150, sha="cd" * 32), frag(90, 120), frag(0, 40)
    useful, redundant = resolve([c, b, d, a])
    assert useful == [a, b] and set(redundant) == {c, d}
    index = FragmentIndex([a, b, c, d])
    assert index.covering(10) == a and index.covering(49) == a
    assert index.covering(50) == b and index.covering(99) == b  # reaches furthest
    assert index.covering(100) == b and index.covering(150) is None
    assert index.covers(0, 150) and not index.covers(0, 151)
    assert index.start_offset(150) == 0 and index.start_offset(200) == 200
    assert index.end_offset == 150 and len(index) == 4


def test_gaps_bound_the_contiguous_start() -> None:
    index = FragmentIndex([frag(0, 10), frag(20, 30), frag(30, 40)])
    assert index.start_offset(40) == 20
    assert index.covering(15) is None and not index.covers(5, 25)


def test_a_listing_replaces_the_index_but_keeps_newer_uploads() -> None:
    index = FragmentIndex([frag(0, 10), frag(10, 20)])
    since = index.generation
    index.add(frag(20, 30))  # uploaded while the listing ran
    index.replace_listing([frag(10, 20), frag(100, 110)], since)  # (0, 10) was pruned
    assert [(f.begin, f.end) for f in index.fragments] == [(10, 20), (20, 30), (100, 110)]
    index.replace_listing([frag(10, 20)], index.generation)  # a later listing is the truth
    assert [(f.begin, f.end) for f in index.fragments] == [(10, 20)]
    index.remove([name(10, 20)])
    assert index.fragments == [] and index.end_offset is None


_FRAGMENTS = st.builds(lambda begin, length, sha, parquet: StoredFragment(
    FragmentName(begin, begin + length, "orders", 3, 0, sha, Compression.NONE,
                 FragmentKind.PARQUET if parquet else FragmentKind.SEGMENT), 100, 0),
    st.integers(0, 60), st.integers(1, 30), st.sampled_from(["ab" * 32, "cd" * 32]),
    st.booleans())


@given(st.lists(_FRAGMENTS, max_size=12), st.lists(_FRAGMENTS, max_size=12),
       st.integers(0, 100))
@example([frag(0, 30)], [frag(10, 30, sha="cd" * 32), frag(30, 40)], 20)  # ends where one ends
def test_adds_give_the_index_a_listing_of_the_same_fragments_would(
        listed: list[StoredFragment], added: list[StoredFragment], offset: int) -> None:
    """An add past the end extends the coverage without resolving it again; any other add
    resolves it: either way the same index as one built from all of them, and a snapshot
    taken before is not changed."""
    index = FragmentIndex(listed)
    before = index.snapshot()
    frozen = (before.fragments, before.redundant, before.parquet.useful)
    for order in (sorted(added, key=lambda f: (f.begin, -f.end)), added):  # in order, any
        for fragment in order:
            index.add(fragment)
        whole = FragmentIndex(listed + added)
        assert index.fragments == whole.fragments
        assert sorted(index.redundant, key=str) == sorted(whole.redundant, key=str)
        assert index.parquet.useful == whole.parquet.useful
        assert sorted(index.parquet.redundant, key=str) == sorted(whole.parquet.redundant,
                                                                  key=str)
        for at in range(0, 100, 7):
            assert index.covering(at) == whole.covering(at)
            assert index.parquet.covering(at) == whole.parquet.covering(at)
    assert (before.fragments, before.redundant, before.parquet.useful) == frozen
    kept = set(index.ending_after(offset))
    assert kept == {f for f in listed + added if f.end > offset}


# -- planner ----------------------------------------------------------------------------------


def segs(*ranges: tuple[int, int], size: int = 1000, ts: int = 0) -> list[SegmentInfo]:
    return [SegmentInfo(b, e, size, ts) for b, e in ranges]


def test_offload_takes_committed_sealed_segments_not_in_the_store() -> None:
    sealed = segs((0, 10), (10, 20), (20, 30), (30, 40))
    index = FragmentIndex([frag(0, 10)])
    plan = plan_offload(sealed, 500, 30, index, LocalRetention(None, None), NOW)
    assert [s.base_offset for s in plan.uploads] == [10, 20]  # 30..40 is not committed
    assert plan.delete_below is None and plan.backlog_bytes == 2000
    plan = plan_offload(sealed, 500, 40, index, LocalRetention(None, None), NOW, uploads_max=1)
    assert [s.base_offset for s in plan.uploads] == [10] and plan.backlog_bytes == 3000


def test_local_deletion_needs_the_store_and_a_local_limit() -> None:
    sealed = segs((0, 10), (10, 20), (20, 30), ts=NOW - 5000)
    index = FragmentIndex([frag(0, 10), frag(10, 20)])
    by_age = plan_offload(sealed, 0, 30, index, LocalRetention(1000, None), NOW)
    assert by_age.delete_below == 20  # (20, 30) is not in the store yet
    young = plan_offload(sealed, 0, 30, index, LocalRetention(10_000, None), NOW)
    assert young.delete_below is None
    by_size = plan_offload(sealed, 500, 30, index, LocalRetention(None, 2500), NOW)
    assert by_size.delete_below == 10  # 3500 -> 2500 bytes after the first
    gap = FragmentIndex([frag(10, 20)])
    assert plan_offload(sealed, 0, 30, gap, LocalRetention(1, None), NOW).delete_below is None


def test_store_retention_cuts_the_oldest_fragments() -> None:
    index = FragmentIndex([frag(0, 10, 100, NOW - 9000), frag(10, 20, 100, NOW - 5000),
                           frag(20, 30, 100, NOW - 100), frag(5, 8)])
    assert retention_cut(index, 0, 40, TotalRetention(6000, None, None), NOW) == 10
    assert retention_cut(index, 300, 40, TotalRetention(None, 450, None), NOW) == 20
    assert retention_cut(index, 0, 40, TotalRetention(None, None, 25), NOW) == 20
    assert retention_cut(index, 0, 40, TotalRetention(None, None, None), NOW) is None
    assert [(f.begin, f.end) for f in fragments_below(index, 10)] == [(0, 10), (5, 8)]
    assert cut_for_time(index, NOW - 4000) == 20 and cut_for_time(index, 0) is None


# -- settings ---------------------------------------------------------------------------------


def test_stream_settings_are_checked_and_updatable() -> None:
    config = StreamConfig("s", "s.>", fragment_store="s3://bucket/tier",
                          fragment_compression="zstd",  # type: ignore[arg-type]
                          local_retention_bytes=1 << 20)
    settings = settings_of(config)
    assert settings is not None and settings.fragment_compression is Compression.ZSTD
    assert settings.fragment_store_retention is StoreRetention.DELETE
    assert StreamConfig.from_dict(config.to_dict()) == config
    updated = config.updated({"fragment_store_retention": "external",
                              "local_retention_ms": 60_000})
    assert updated.fragment_store_retention is StoreRetention.EXTERNAL
    assert settings_of(StreamConfig("s", "s.>")) is None


@pytest.mark.parametrize(("fields", "field"), [
    ({"fragment_store": "http://bucket/x"}, "fragment_store"),
    ({"fragment_store": "s3:///nobucket"}, "fragment_store"),
    ({"fragment_store": "file://relative/path"}, "fragment_store"),
    ({"fragment_store": "s3://b/x?secret=1"}, "fragment_store"),
    ({"fragment_store": 5}, "fragment_store"),
    ({"fragment_store": "s3://b", "fragment_compression": "gzip"}, "fragment_compression"),
    ({"fragment_store": "s3://b", "fragment_store_retention": "never"},
     "fragment_store_retention"),
    ({"fragment_store": "s3://b", "local_retention_ms": 0}, "local_retention_ms"),
    ({"local_retention_bytes": 100}, "local_retention_bytes"),
])
def test_bad_settings_name_their_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidStreamConfig) as info:
        StreamConfig.from_dict({"name": "s", "subject": "s.>", **fields})
    assert info.value.code == "INVALID_STREAM_CONFIG" and info.value.fields["field"] == field
