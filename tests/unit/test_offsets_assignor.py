"""The sticky assignor: complete, exclusive, balanced, sticky, deterministic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jetstream.offsets.assignor import assign
from jetstream.offsets.records import StreamPartition as SP


def partitions(stream: str, count: int) -> frozenset[SP]:
    return frozenset(SP(stream, p) for p in range(count))


def test_six_partitions_over_three_members_two_each() -> None:
    six = partitions("s", 6)
    target = assign({"a": six, "b": six, "c": six}, {})
    assert sorted(len(v) for v in target.values()) == [2, 2, 2]
    assert frozenset().union(*target.values()) == six


def test_a_joining_member_takes_only_what_balance_needs() -> None:
    six = partitions("s", 6)
    before = assign({"a": six, "b": six}, {})
    after = assign({"a": six, "b": six, "c": six}, before)
    moved = sum(len(before[m] - after[m]) for m in ("a", "b"))
    assert moved == 2 and len(after["c"]) == 2
    assert after["a"] <= before["a"] and after["b"] <= before["b"]


def test_a_leaving_member_only_frees_its_own() -> None:
    six = partitions("s", 6)
    before = assign({"a": six, "b": six, "c": six}, {})
    after = assign({"a": six, "b": six}, before)
    assert before["a"] <= after["a"] and before["b"] <= after["b"]


def test_members_get_only_streams_they_subscribe_to() -> None:
    x, y = partitions("x", 4), partitions("y", 2)
    target = assign({"a": x, "b": x | y}, {})
    assert target["a"] <= x
    assert y <= target["b"]
    assert target["a"] | target["b"] == x | y


member_ids = st.sampled_from(["m0", "m1", "m2", "m3", "m4"])


@st.composite
def situations(draw: st.DrawFn) -> tuple[dict[str, frozenset[SP]], dict[str, frozenset[SP]]]:
    streams = {"x": draw(st.integers(0, 8)), "y": draw(st.integers(0, 5))}
    everything = sorted(partitions("x", streams["x"]) | partitions("y", streams["y"]))
    members = draw(st.sets(member_ids, max_size=5))
    eligible = {m: frozenset(s for s in everything
                             if s.stream in draw(st.sets(st.sampled_from(["x", "y"]))))
                for m in members}
    previous = {m: frozenset(draw(st.sets(st.sampled_from(everything))) if everything else ())
                for m in draw(st.sets(member_ids))}
    return eligible, previous


@given(situations())
def test_every_eligible_partition_goes_to_exactly_one_eligible_member(
        situation: tuple[dict[str, frozenset[SP]], dict[str, frozenset[SP]]]) -> None:
    eligible, previous = situation
    target = assign(eligible, previous)
    assert set(target) == set(eligible)
    wanted = frozenset().union(*eligible.values()) if eligible else frozenset()
    given_out = [sp for share in target.values() for sp in share]
    assert sorted(given_out) == sorted(wanted)  # each once
    for member, share in target.items():
        assert share <= eligible[member]
    assert assign(eligible, previous) == target  # deterministic


@given(situations())
def test_same_subscriptions_differ_by_at_most_one(
        situation: tuple[dict[str, frozenset[SP]], dict[str, frozenset[SP]]]) -> None:
    eligible, previous = situation
    if not eligible:
        return
    same = frozenset().union(*eligible.values())
    target = assign(dict.fromkeys(eligible, same), previous)
    sizes = [len(share) for share in target.values()]
    assert max(sizes) - min(sizes) <= 1


@given(st.integers(0, 12), st.sets(member_ids, min_size=1),
       st.lists(st.sampled_from(["m0", "m1", "m2", "m3", "m4", None]), max_size=12))
def test_members_keep_what_they_held_as_far_as_their_share_allows(
        count: int, members: set[str], holders: list[str | None]) -> None:
    everything = partitions("s", count)
    previous: dict[str, set[SP]] = {}
    for p, holder in enumerate(holders[:count]):  # a valid earlier assignment: disjoint
        if holder is not None:
            previous.setdefault(holder, set()).add(SP("s", p))
    target = assign(dict.fromkeys(members, everything),
                    {m: frozenset(v) for m, v in previous.items()})
    for member in members:
        kept = frozenset(previous.get(member, ()))
        # nothing it held is swapped for something it did not hold
        assert len(target[member] & kept) == min(len(kept), len(target[member]))
