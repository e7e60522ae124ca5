"""What a replica does about damage in its own copy of a partition, given what the other
replicas answered when asked for theirs.

Theory of operation: a replica that finds damage (a read, the scrubber) asks the other
replicas for their checked copy of exactly the damaged offsets: its leader first (in sync by
definition), then the other in-sync replicas, then the rest. Each answers with a copy, says
its own copy is damaged too, or cannot be reached. Then:
- a healthy copy of the damaged range's exact length (replicas copy their leader's batches
  byte for byte) is written over the damage in place (`WRITE_OVER`); one from a replica
  outside the ISR is used only so (its length matching is the proof it is the same bytes);
- a healthy copy of another length from an in-sync replica (the replicas compacted
  differently) cannot be: a follower drops its log from the damage on and fetches it again
  (`TRUNCATE`: it is out of the ISR meanwhile); a leader serves readers the healthy copy and
  hands its leadership to a replica that answered with one (`HAND_OVER`), then heals as a
  follower;
- no healthy copy: the range is `LOST` when every other replica said its copy is damaged
  too (or there is no other replica); otherwise (one could not be reached) the replica tries
  again later (`RETRY`) and a leader answers readers with a retriable error meanwhile.
Never is a healthy replica told to truncate to match a damaged one, and leadership only
moves to an in-sync replica that answered with a healthy copy.

Pure: no IO.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class CopyAnswer(enum.Enum):
    HEALTHY = "healthy"
    DAMAGED = "damaged"
    UNREACHABLE = "unreachable"


class Action(enum.Enum):
    WRITE_OVER = "write_over"
    TRUNCATE = "truncate"
    HAND_OVER = "hand_over"
    LOST = "lost"
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    #: The replica whose copy to use (WRITE_OVER, TRUNCATE, HAND_OVER), else -1.
    source: int = -1
    #: For HAND_OVER: the replicas that may take the leadership, in order of preference.
    successors: tuple[int, ...] = ()


def peers_to_ask(me: int, leader: int, isr: Sequence[int],
                 replicas: Sequence[int] = ()) -> list[int]:
    """The replicas to ask for a copy, in order: the leader (when it is not `me`), the other
    in-sync replicas, then the other replicas."""
    peers = [leader] if leader != me else []
    peers += [r for r in isr if r not in (me, leader)]
    return peers + [r for r in replicas if r != me and r not in peers and r != leader]


def decide(*, me: int, leader: int, replicas: Sequence[int], isr: Sequence[int],
           answers: Mapping[int, CopyAnswer], fits: Mapping[int, bool]) -> Verdict:
    """The action for replica `me` (see the module docstring). `answers` holds each asked
    replica's answer; `fits[r]`, for a replica with a healthy copy, whether that copy has
    the damaged range's exact length."""
    healthy = [r for r in peers_to_ask(me, leader, isr, replicas)
               if answers.get(r) is CopyAnswer.HEALTHY]
    for replica in healthy:
        if fits.get(replica, False):
            return Verdict(Action.WRITE_OVER, replica)
    in_sync = [r for r in healthy if r in isr]
    if in_sync:
        if me == leader:
            return Verdict(Action.HAND_OVER, in_sync[0], tuple(in_sync))
        return Verdict(Action.TRUNCATE, in_sync[0])
    others = [r for r in replicas if r != me]
    if all(answers.get(r) is CopyAnswer.DAMAGED for r in others):
        return Verdict(Action.LOST)
    return Verdict(Action.RETRY)
