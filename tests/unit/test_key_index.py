"""The LMDB key index of compacted partitions: what get and keys answer against a model dict,
replays, long keys, paging, persistence, and damage or another stream version wiping it."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.compaction.key_index import (
    KEYS_LIMIT_MAX,
    KeyIndex,
    KeyIndexFull,
    encode_entry,
    lmdb_key,
    newest_entries,
)
from jetstream.stream import format as fmt
from jetstream.stream.format import NO_HEADERS, StoredRecord

LONG = b"L" * 500  # over SHORT_KEY_MAX: stored hashed


def rec(offset: int, key: bytes | None, value: bytes | None,
        headers: dict[str, bytes] | None = None) -> StoredRecord:
    return StoredRecord(offset, 1000 + offset, value, key, headers or NO_HEADERS, "s", 0)


keys = st.sampled_from([b"a", b"ab", b"b", b"", b"\x00", LONG, LONG + b"x"])
ops = st.lists(st.tuples(st.none() | keys, st.none() | st.binary(max_size=20),
                         st.dictionaries(st.text(max_size=3), st.binary(max_size=3),
                                         max_size=2)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(batch=ops, replay=st.integers(0, 60))
def test_get_and_keys_follow_a_model(tmp_path_factory: pytest.TempPathFactory,
                                     batch: list[tuple[bytes | None, bytes | None,
                                                       dict[str, bytes]]],
                                     replay: int) -> None:
    index = KeyIndex.open(tmp_path_factory.mktemp("idx"), created_version=1)
    records = [rec(i, k, v, h) for i, (k, v, h) in enumerate(batch)]
    model: dict[bytes, StoredRecord] = {}
    for r in records:
        if r.key is not None:
            model[r.key] = r
    index.apply(records[:len(records) // 2], len(records) // 2)
    index.apply(records[len(records) // 2:], len(records))
    index.apply(records[:replay], len(records))  # a replay changes nothing
    try:
        for key in [b"a", b"ab", b"b", b"", b"\x00", LONG, LONG + b"x", b"zz"]:
            got = index.get(key)
            want = model.get(key)
            if want is None:
                assert got is None
            else:
                assert got is not None
                assert (got.offset, got.timestamp_ms, got.value, dict(got.headers)) == (
                    want.offset, want.timestamp_ms, want.value, dict(want.headers))
        live = {k for k, r in model.items() if r.value is not None}
        assert set(index.keys(limit=100)) == live
        assert set(index.keys(prefix=b"a", limit=100)) == {k for k in live
                                                            if k.startswith(b"a")}
        assert index.covered_offset == len(records)
    finally:
        index.close()


records_in_batches = st.lists(st.lists(
    st.tuples(st.none() | keys, st.none() | st.binary(max_size=12),
              st.dictionaries(st.text(max_size=3), st.binary(max_size=3), max_size=2),
              st.sampled_from(["", "s.x"]), st.integers(0, 3)),
    min_size=1, max_size=8), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(batches=records_in_batches, cut=st.integers(0, 60))
def test_entries_cut_from_the_bytes_are_what_decoding_would_give(
        batches: list[list[tuple[bytes | None, bytes | None, dict[str, bytes], str, int]]],
        cut: int) -> None:
    data, base = b"", 0
    for batch in batches:
        # Increasing offset deltas with gaps, as compaction leaves them.
        deltas = [d - 1 for d in itertools.accumulate(gap + 1 for *_, gap in batch)]
        data += fmt.encode_batch(base, 2, [fmt.Record(v, k, h, s, 1000 + base)
                                           for k, v, h, s, _ in batch], 1000, deltas)
        base += deltas[-1] + 1
    newest: dict[bytes, StoredRecord] = {}
    for record in fmt.decode_batches(data, min_offset=cut):
        if record.key is not None:
            newest[record.key] = record
    assert newest_entries(data, cut) == {lmdb_key(key): (r.offset, encode_entry(r))
                                         for key, r in newest.items()}


def test_paging_with_after_and_limit(tmp_path: Path) -> None:
    index = KeyIndex.open(tmp_path, created_version=1)
    index.apply([rec(i, b"k%03d" % i, b"v") for i in range(250)] + [rec(250, b"k007", None)],
                251)
    pages, after = [], None
    while True:
        page = index.keys(prefix=b"k", after=after, limit=100)
        if not page:
            break
        pages.append(page)
        after = page[-1]
    flat = [k for page in pages for k in page]
    assert flat == [b"k%03d" % i for i in range(250) if i != 7]
    assert [len(p) for p in pages] == [100, 100, 49]
    with pytest.raises(ValueError):
        index.keys(limit=KEYS_LIMIT_MAX + 1)
    index.close()


def test_it_persists_and_is_wiped_for_another_stream_or_damage(tmp_path: Path) -> None:
    index = KeyIndex.open(tmp_path / "i", created_version=3)
    assert index.rebuilt_reason == "new index"
    index.apply([rec(0, b"k", b"v")], 1)
    index.close()
    again = KeyIndex.open(tmp_path / "i", created_version=3)
    assert again.rebuilt_reason is None
    assert again.get(b"k") is not None and again.covered_offset == 1
    assert again.stats().entries == 1
    again.close()
    other = KeyIndex.open(tmp_path / "i", created_version=4)  # the stream was created again
    assert other.rebuilt_reason is not None and other.get(b"k") is None
    assert other.covered_offset == 0
    other.close()
    (tmp_path / "i" / "data.mdb").write_bytes(b"garbage" * 1000)
    damaged = KeyIndex.open(tmp_path / "i", created_version=4)
    assert damaged.rebuilt_reason is not None and damaged.covered_offset == 0
    damaged.apply([rec(0, b"k", b"w")], 1)
    entry = damaged.get(b"k")
    assert entry is not None and entry.value == b"w"
    damaged.close()


def test_needs_rebuild_when_it_covers_more_than_the_log(tmp_path: Path) -> None:
    index = KeyIndex.open(tmp_path, created_version=1)
    index.apply([rec(i, b"k", b"v") for i in range(10)], 10)
    assert not index.needs_rebuild(10)
    assert index.needs_rebuild(7)
    index.reset()
    assert index.covered_offset == 0 and index.get(b"k") is None
    index.close()


def test_a_full_index_is_a_clear_error(tmp_path: Path) -> None:
    index = KeyIndex.open(tmp_path, created_version=1, map_size_bytes=64 * 1024)
    with pytest.raises(KeyIndexFull):
        index.apply([rec(i, b"key-%d" % i, b"v" * 200) for i in range(2000)], 2000)
    assert index.covered_offset == 0  # the failed batch left nothing behind
    index.close()


def test_readers_run_beside_a_writer(tmp_path: Path) -> None:
    index = KeyIndex.open(tmp_path, created_version=1)
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for i in range(200):
                index.apply([rec(i * 10 + j, b"k%d" % j, b"%d" % i) for j in range(10)],
                            i * 10 + 10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def read() -> None:
        last = -1
        try:
            while not done.is_set():
                entry = index.get(b"k3")
                if entry is not None:
                    assert entry.offset >= last
                    last = entry.offset
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read)
                                                  for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    entry = index.get(b"k3")
    assert entry is not None and entry.value == b"199"
    index.close()
