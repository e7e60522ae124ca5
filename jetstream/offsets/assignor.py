"""The sticky assignor: which member of a consumer group should consume which partition.

Theory of operation (pure: no IO, no clock): every member may be given the partitions of the
streams it subscribes to (`eligible`). The target keeps every partition where it is (the
member's previous share, as far as it is still eligible: a consumer keeps its caches and its
position), gives each partition nobody holds to the eligible member with the fewest, then
evens out: while some partition's holder has at least two more than another member eligible
for it, the partition moves to the one with the fewest — taken from the most loaded member
first, so a member that holds no more than its share keeps it. Each move lowers the sum of
squared shares, so it ends; when every member subscribes to the same streams, shares then differ by
at most one. Ties go to the smaller member id, so the result depends only on the input.

The target is what the coordinator aims for, not what it hands out: a partition moves to its
new member only once the old one has confirmed it stopped (jetstream.offsets.group).
"""

from __future__ import annotations

from collections.abc import Mapping

from jetstream.offsets.records import StreamPartition


def assign(eligible: Mapping[str, frozenset[StreamPartition]],
           previous: Mapping[str, frozenset[StreamPartition]]
           ) -> dict[str, frozenset[StreamPartition]]:
    """The target: member -> its partitions. Every partition some member is eligible for
    goes to exactly one eligible member."""
    members = sorted(eligible)
    candidates: dict[StreamPartition, list[str]] = {}
    for member in members:
        for sp in eligible[member]:
            candidates.setdefault(sp, []).append(member)
    shares: dict[str, set[StreamPartition]] = {m: set() for m in members}
    holder: dict[StreamPartition, str] = {}
    for member in members:  # stickiness: keep what is still allowed, once
        for sp in sorted(previous.get(member, frozenset()) & eligible[member]):
            if sp not in holder:
                holder[sp] = member
                shares[member].add(sp)
    for sp in sorted(set(candidates) - set(holder)):
        member = min(candidates[sp], key=lambda m: (len(shares[m]), m))
        holder[sp] = member
        shares[member].add(sp)
    while _move_one(shares, holder, candidates):
        pass
    return {m: frozenset(shares[m]) for m in members}


def _move_one(shares: dict[str, set[StreamPartition]], holder: dict[StreamPartition, str],
              candidates: Mapping[StreamPartition, list[str]]) -> bool:
    """Move one partition from the most loaded member that has one some eligible member
    holds at least two fewer than; False when there is none (balanced)."""
    for owner in sorted(shares, key=lambda m: (-len(shares[m]), m)):
        for sp in sorted(shares[owner]):
            best = min(candidates[sp], key=lambda m: (len(shares[m]), m))
            if len(shares[best]) + 1 < len(shares[owner]):
                shares[owner].discard(sp)
                shares[best].add(sp)
                holder[sp] = best
                return True
    return False
