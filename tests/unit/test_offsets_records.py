"""The records of `__offsets`: keys that sort by group, values that round-trip, and bad bytes
that are CorruptRecord, never another exception."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.errors import CorruptRecord
from jetstream.offsets import records as r
from jetstream.offsets.records import StreamPartition as SP

names = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
sps = st.builds(SP, names, st.integers(0, 1023))


@given(names, sps)
def test_offset_keys_parse_back_and_sit_under_their_group(group: str, sp: SP) -> None:
    key = r.offset_key(group, sp)
    assert r.parse_offset_key(key) == (group, sp)
    assert key.startswith(r.group_offsets_prefix(group))
    assert r.parse_group_key(key) is None
    assert r.parse_group_key(r.group_key(group)) == group
    assert r.parse_offset_key(r.group_key(group)) is None


@given(st.builds(r.CommittedOffset, st.integers(0, 2**63 - 1), st.text(max_size=50),
                 st.integers(0, 2**62), st.integers(-1, 2**31), st.integers(0, 2**62)))
def test_offsets_round_trip(value: r.CommittedOffset) -> None:
    assert r.decode_offset(r.encode_offset(value)) == value


members = st.builds(r.StoredMember, names, st.text(max_size=20), st.integers(0, 2**31),
                    st.integers(0, 2**31), st.integers(1, 10**6),
                    st.lists(names, max_size=3).map(tuple),
                    st.frozensets(sps, max_size=5))


@given(st.builds(r.StoredGroup, st.integers(0, 2**31), st.lists(members, max_size=4)
                 .map(tuple)))
def test_groups_round_trip(group: r.StoredGroup) -> None:
    assert r.decode_group(r.encode_group(group)) == group


@pytest.mark.parametrize("data", [b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"v": 99}),
                                  msgpack.packb({"v": 1}), msgpack.packb({"v": 1, "offset": "x"})])
def test_bad_bytes_are_corrupt_records(data: bytes) -> None:
    with pytest.raises(CorruptRecord):
        r.decode_offset(data)
    with pytest.raises(CorruptRecord):
        r.decode_group(data)


def test_a_group_maps_to_one_partition_in_range() -> None:
    partitions = {r.coordinator_partition(f"group-{i}", 16) for i in range(200)}
    assert partitions <= set(range(16)) and len(partitions) == 16
    assert r.coordinator_partition("billing", 16) == r.coordinator_partition("billing", 16)
