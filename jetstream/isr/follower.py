"""Follower log truncation by leader epoch (Kafka KIP-101, with the KIP-279 iteration).

Theory of operation: a replica that becomes a follower, or restarts, may hold a suffix its new
leader does not have: records an old leader appended but never committed. It must cut that
suffix off before it fetches, or replicas would differ below the high watermark. The high
watermark checkpoint cannot tell where to cut: it lags (cutting there loses records the leader
has, which may be committed) and it says nothing about records written under another leader
at the same offsets (keeping them keeps divergent data). Leader epochs can tell: every record
carries the epoch of the leader that appended it, and only that leader ever appended records
in that epoch, so two replicas that hold a record of the same epoch at the same offset hold the
same record.

The exchange, one round trip at a time (this module plans each step; the shell does the IO):

1. The follower asks the leader about the latest epoch E of its local epoch cache.
2. The leader answers with (L, end): L the largest epoch it knows that is <= E, `end` the
   offset where its next epoch began (its log end offset when L is its latest epoch).
   Both are UNDEFINED when it knows no epoch <= E (its log starts after the follower's epochs
   were deleted by retention, or it is empty).
3. The follower looks up F, the largest epoch of its own that is <= L, and its own end offset
   for F (where its next epoch began, or its LEO).
   - F == L: both logs hold epoch L and agree up to min(own end of L, leader's end of L);
     truncate there. Done (`Done(truncate_to)`).
   - F < L: the follower never had epoch L, and every epoch it holds above F is one the
     leader never had (the leader has nothing in (L, E]): everything from its own end of F on
     is divergent. Truncate there, then ask again about F, which is now its latest epoch
     (`TruncateTo(offset, then_ask_epoch=F)`). This is KIP-279's fix: KIP-101 alone truncated
     to the leader's end of L and could keep records of epoch F at offsets where the leader
     holds epoch L.
   - no F at all: the follower holds no epoch the leader has, so no record in common: drop
     the log and start at the leader's log start offset (`TruncateFully(start_at)`).
   - UNDEFINED answer: the same; the follower never falls back to truncating at its HW
     checkpoint (the fallback KIP-101 kept for old message formats, which is unsafe).

Each round asks about a strictly smaller epoch, so the exchange ends after at most one round
per local epoch. `resolve` runs the whole exchange against an in-memory leader (for tests and
for reasoning); the follower shell runs it over the wire, with `plan_truncation` per answer.

Entries are (epoch, start_offset) pairs as in jetstream.stream.epoch.LeaderEpochCache: both
strictly increasing, the first starting at the log start offset. A replica that was leader may
have a latest entry with no record (Log.start_leader_epoch records it at its LEO): that is
fine, its end offset is the LEO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from jetstream.stream.epoch import UNDEFINED, EpochEndOffset, EpochEntry

#: One entry of an epoch cache: an EpochEntry or a plain (epoch, start_offset) pair.
EntryLike = EpochEntry | tuple[int, int]


@dataclass(frozen=True, slots=True)
class TruncateTo:
    """Truncate the local log to `offset` (drop every record at or past it), then ask the
    leader about `then_ask_epoch`, the local latest epoch after the truncation, which still
    has to be confirmed."""

    offset: int
    then_ask_epoch: int


@dataclass(frozen=True, slots=True)
class Done:
    """Truncate the local log to `truncate_to` (a no-op at the LEO) and start fetching there:
    everything below it is on the leader too."""

    truncate_to: int


@dataclass(frozen=True, slots=True)
class TruncateFully:
    """The leader holds nothing the follower has: drop the whole local log and restart it
    empty at `start_at`, the leader's log start offset (Log.truncate_fully_and_start_at)."""

    start_at: int


TruncationStep = TruncateTo | Done | TruncateFully
FinalStep = Done | TruncateFully


def normalize(entries: Sequence[EntryLike]) -> list[EpochEntry]:
    """The entries as EpochEntry values, checked: both fields strictly increasing, >= 0."""
    out = [e if isinstance(e, EpochEntry) else EpochEntry(e[0], e[1]) for e in entries]
    assert all(e.epoch >= 0 and e.start_offset >= 0 for e in out), out
    assert all(a.epoch < b.epoch and a.start_offset < b.start_offset
               for a, b in pairwise(out)), out
    return out


def end_offset_for_epoch(entries: Sequence[EntryLike], requested: int,
                         log_end_offset: int) -> EpochEndOffset:
    """The largest epoch <= `requested` and where it ends: the start of the next epoch, or
    `log_end_offset` for the latest. UNDEFINED twice when there is no such epoch. The same
    answer as LeaderEpochCache.end_offset_for_epoch, on a plain list."""
    found = UNDEFINED
    end = UNDEFINED
    for entry in reversed(normalize(entries)):
        if entry.epoch <= requested:
            found = entry.epoch
            break
        end = entry.start_offset
    if found == UNDEFINED:
        return EpochEndOffset(UNDEFINED, UNDEFINED)
    return EpochEndOffset(found, log_end_offset if end == UNDEFINED else end)


def epoch_to_ask(entries: Sequence[EntryLike]) -> int | None:
    """The epoch a follower asks about first: its latest. None when its cache is empty (an
    empty log): there is nothing to confirm, fetch from the LEO."""
    normalized = normalize(entries)
    return normalized[-1].epoch if normalized else None


def start_past_removed(local_log_end_offset: int, leader_log_start_offset: int
                       ) -> TruncateFully | None:
    """A fetch was refused OFFSET_OUT_OF_RANGE. When this log ends below the leader's log
    start (an empty replica, or one that was away while the leader's retention or offload
    removed what would follow it), it can never fetch where it ends: it restarts empty at
    the leader's log start (Kafka's truncateFullyAndStartAt). None otherwise (a log ahead of
    the leader is cut by truncation)."""
    if local_log_end_offset < leader_log_start_offset:
        return TruncateFully(leader_log_start_offset)
    return None


def plan_truncation(local_entries: Sequence[EntryLike], local_log_end_offset: int,
                    leader_answer: EpochEndOffset, *,
                    leader_log_start_offset: int) -> TruncationStep:
    """The next step, given the leader's answer about the local latest epoch.

    `local_entries` is the local epoch cache as it is now (after the previous step's
    truncation; an entry left at or past the LEO by a no-op truncation does no harm),
    `leader_log_start_offset` where a full truncation restarts the log."""
    entries = normalize(local_entries)
    assert entries, "an empty log has nothing to confirm: see epoch_to_ask"
    assert entries[0].start_offset <= local_log_end_offset, (entries, local_log_end_offset)
    asked = entries[-1].epoch
    if leader_answer.epoch == UNDEFINED or leader_answer.end_offset == UNDEFINED:
        return TruncateFully(leader_log_start_offset)
    # The leader answers with an epoch <= the one asked: a larger one is a leader bug.
    assert leader_answer.epoch <= asked, (leader_answer, asked)
    own = end_offset_for_epoch(entries, leader_answer.epoch, local_log_end_offset)
    if own.epoch == UNDEFINED:
        return TruncateFully(leader_log_start_offset)
    own_end = min(own.end_offset, local_log_end_offset)
    if own.epoch != leader_answer.epoch:
        assert own.epoch < leader_answer.epoch
        return TruncateTo(own_end, then_ask_epoch=own.epoch)
    truncate_to = min(own_end, leader_answer.end_offset)
    if truncate_to < entries[0].start_offset:
        # Only an unclean history gets here: the leader's copy of epoch L ends below our log
        # start, so nothing we hold is on the leader.
        return TruncateFully(leader_log_start_offset)
    return Done(truncate_to)


def truncated(entries: Sequence[EntryLike], end_offset: int) -> list[EpochEntry]:
    """The epoch cache after truncating the log to `end_offset` (epochs that began at or
    after it are gone), as LeaderEpochCache.truncate_from_end."""
    return [e for e in normalize(entries) if e.start_offset < end_offset]


def plan_steps(local_entries: Sequence[EntryLike], local_log_end_offset: int,
               leader_entries: Sequence[EntryLike], leader_log_end_offset: int,
               leader_log_start_offset: int) -> list[TruncationStep]:
    """Run the whole exchange against an in-memory leader; every step, the final one last."""
    entries = normalize(local_entries)
    leo = local_log_end_offset
    if epoch_to_ask(entries) is None:
        return [Done(leo)]
    steps: list[TruncationStep] = []
    # Each round asks about a strictly smaller local epoch: at most one round per entry.
    for _ in range(len(entries)):
        answer = end_offset_for_epoch(leader_entries, entries[-1].epoch, leader_log_end_offset)
        step = plan_truncation(entries, leo, answer,
                               leader_log_start_offset=leader_log_start_offset)
        steps.append(step)
        if not isinstance(step, TruncateTo):
            return steps
        assert step.offset <= leo
        entries, leo = truncated(entries, step.offset), step.offset
        assert entries and entries[-1].epoch == step.then_ask_epoch, (entries, step)
    raise AssertionError(f"no agreement after {len(steps)} rounds: {steps}")


def resolve(local_entries: Sequence[EntryLike], local_log_end_offset: int,
            leader_entries: Sequence[EntryLike], leader_log_end_offset: int,
            leader_log_start_offset: int) -> FinalStep:
    """Where the follower's log ends up: `Done(offset)` (truncated to `offset`) or
    `TruncateFully(start_at)` (dropped, restarted at the leader's log start)."""
    final = plan_steps(local_entries, local_log_end_offset, leader_entries,
                       leader_log_end_offset, leader_log_start_offset)[-1]
    assert not isinstance(final, TruncateTo)
    return final
