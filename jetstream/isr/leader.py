"""The leader's view of one partition: follower progress, the ISR and the high watermark.

Theory of operation (Kafka's Partition and Replica, with KIP-497's maximal ISR): the leader
learns each follower's log end offset (LEO) from its fetches: a follower fetching at offset X
holds every offset below X. The high watermark (HW) is the least LEO over the in-sync
replicas: every offset below it is on each of them, so it is committed and survives the loss
of all but one of them. The leader's own LEO counts only once durable (under fsync `always`
the shell passes the fsynced LEO; under the other policies the plain LEO).

The ISR lives in the metadata (Raft): the leader cannot change it, only propose a change
(`ProposeIsr`, a compare-and-set on its leader epoch) and learn the result
(`on_isr_committed`, or `on_proposal_failed` when it was refused). Until a proposal is
decided it may or may not take effect, so the HW is computed over the *maximal ISR*: the
committed ISR together with the members of the proposal in flight. A member being added
already counts (it may become in-sync at any moment, and it must then hold everything below
the HW: that is why it is only proposed once its LEO reached the HW); a member being removed
still counts until the removal is committed. Hence the safety property the tests check: every
member of the committed ISR always holds everything below the HW.

Membership follows Kafka's rules:
- a follower is caught up at time t when it fetched at an offset >= the leader's LEO at t; a
  fetch at an offset >= the leader's LEO at that follower's previous fetch shows it was
  caught up at that previous fetch (so a follower that keeps fetching but stays behind a busy
  leader is not caught up, however often it fetches);
- an ISR member other than the leader that was last caught up more than
  `replica_lag_ms_max` ago is proposed for removal (all such members in one proposal);
- a replica outside the ISR that fetched in this leader epoch at an offset >= the HW (and >=
  the offset where this epoch began, so it has truncated against this leader) is proposed for
  addition, if its last fetch is at most `replica_lag_ms_max` old (a follower that stopped
  fetching, removed for lagging, is not added straight back because its old LEO still
  reaches an HW that did not move). On joining it is treated as caught up at that moment,
  so it is not removed again before it had `replica_lag_ms_max` to catch up fully.
- a follower that says it is unfit (`unfit`: its copy is damaged, its disk is full) is
  proposed for removal at once, and not added back while it says so: it cannot be trusted
  to hold, or to take, what the HW promises.
Both are checked on every input (fetch, tick, commit), lagging members first. At most one
proposal is in flight; it ends when the metadata commits exactly its ISR (a different commit
leaves it in flight: with a compare-and-set on the epoch only, it may still be applied after)
or when it is refused. The next one is computed as soon as the previous one is committed;
after a refusal, only at the next `tick` (not retried at the rate of fetches). Only lagging
depends on time alone, so a shell need not tick at a fixed rate: `next_tick_ms` says when a
tick may next decide something.

`min_isr_met`: a publish with ack policy `all` is refused (NotEnoughReplicas) while the
committed ISR is smaller than `min_isr`; the removal itself is never held back by min_isr.

The class is pure: no IO, no clock. Time comes in as `now_ms` (a monotonic clock; a value
older than one already seen is taken as the newest seen). Each input returns the decisions it
led to: `AdvanceHighWatermark` (the shell checkpoints the HW, answers `all` acks and wakes
consumers) and `ProposeIsr` (the shell proposes ChangeIsr to the metadata). One instance
serves one leader epoch: a new epoch needs a new instance. Call `tick` right after
construction (a single-replica ISR commits at once). Inputs from the world that cannot be
accepted (a fetch past the leader's LEO, from a broker that is not a follower) raise
ValueError; the shell checks them first and answers the remote with a protocol error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

IsrChangeReason = Literal["shrink", "expand"]
#: Why a follower must not be in the ISR now ("" when it may be): its copy has damage it has
#: not healed, or its disk is too full to take appends.
Unfit = Literal["", "corrupt", "disk_full"]
UNFIT_REASONS: tuple[Unfit, ...] = ("", "corrupt", "disk_full")


def as_unfit(value: str) -> Unfit:
    """`value` as a reason (ValueError when it is not one)."""
    for reason in UNFIT_REASONS:
        if value == reason:
            return reason
    raise ValueError(f"{value!r} is not one of {list(UNFIT_REASONS)}")


@dataclass(frozen=True, slots=True)
class AdvanceHighWatermark:
    """Every offset below `offset` is now committed."""

    offset: int


@dataclass(frozen=True, slots=True)
class ProposeIsr:
    """Propose ChangeIsr(isr, expected_epoch) to the metadata; report the outcome with
    on_isr_committed or on_proposal_failed."""

    isr: tuple[int, ...]
    expected_epoch: int
    reason: IsrChangeReason


Decision = AdvanceHighWatermark | ProposeIsr


@dataclass(frozen=True, slots=True)
class FollowerState:
    """What the leader knows of one replica, for status pages and metrics. For the leader
    itself `log_end_offset` is its durable LEO."""

    replica_id: int
    #: None until the replica fetched in this leader epoch.
    log_end_offset: int | None
    #: None while it was never caught up in this leader epoch.
    last_caught_up_ms: int | None
    #: None until the replica fetched in this leader epoch.
    last_fetch_ms: int | None
    #: In the committed ISR.
    in_isr: bool
    #: In the maximal ISR: the committed ISR plus a pending addition (counts for the HW).
    counts_for_hw: bool
    #: What the replica last said keeps it out of the ISR ("" for nothing).
    unfit: Unfit = ""


@dataclass(slots=True)
class _Follower:
    log_end_offset: int | None
    last_caught_up_ms: int | None
    last_fetch_ms: int | None
    # The leader's LEO and the time at this follower's previous fetch (Kafka initialises both
    # to the leader's at the start of the epoch).
    prev_fetch_leader_leo: int
    prev_fetch_ms: int
    unfit: Unfit = ""


@dataclass(frozen=True, slots=True)
class _Pending:
    isr: tuple[int, ...]
    reason: IsrChangeReason


class LeaderState:
    def __init__(self, leader_id: int, leader_epoch: int, replicas: tuple[int, ...],
                 isr: tuple[int, ...], high_watermark: int, leader_log_end_offset: int,
                 now_ms: int, replica_lag_ms_max: int, min_isr: int, *,
                 leader_epoch_start_offset: int | None = None) -> None:
        """`isr` as committed in the metadata; `high_watermark` the starting value (the
        leader's checkpointed HW); `leader_log_end_offset` its LEO, all durable (the log was
        just opened or flushed). `leader_epoch_start_offset`, where this epoch began in the
        log, defaults to that LEO (Log.start_leader_epoch records it there)."""
        assert leader_id in replicas, (leader_id, replicas)
        assert len(set(replicas)) == len(replicas), replicas
        assert replica_lag_ms_max > 0 and min_isr >= 1, (replica_lag_ms_max, min_isr)
        assert 0 <= high_watermark <= leader_log_end_offset, (
            high_watermark, leader_log_end_offset)
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.replicas = tuple(replicas)
        self.replica_lag_ms_max = replica_lag_ms_max
        self.min_isr = min_isr
        self.epoch_start_offset = (leader_log_end_offset if leader_epoch_start_offset is None
                                   else leader_epoch_start_offset)
        assert 0 <= self.epoch_start_offset <= leader_log_end_offset
        self._isr = _sorted(isr)
        self._hw = high_watermark
        self._log_end_offset = leader_log_end_offset
        self._durable_end_offset = leader_log_end_offset
        self._now_ms = now_ms
        self._pending: _Pending | None = None
        self._held = False  # a proposal was refused: wait for the next tick
        self._followers = {
            r: _Follower(None, now_ms if r in self._isr else None, None,
                         leader_log_end_offset, now_ms)
            for r in self.replicas if r != leader_id
        }
        self._check()

    # -- views ----------------------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def isr(self) -> tuple[int, ...]:
        """The ISR as committed in the metadata."""
        return self._isr

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The replicas the HW waits for: the committed ISR and a pending proposal's."""
        if self._pending is None:
            return self._isr
        return _sorted((*self._isr, *self._pending.isr))

    @property
    def pending_isr(self) -> tuple[int, ...] | None:
        """The ISR of the proposal in flight, if any."""
        return None if self._pending is None else self._pending.isr

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def durable_end_offset(self) -> int:
        return self._durable_end_offset

    @property
    def min_isr_met(self) -> bool:
        """True when a publish with ack policy `all` may be accepted."""
        return len(self._isr) >= self.min_isr

    def can_commit_all(self) -> bool:
        """False: refuse an `all` publish with NotEnoughReplicas(min_isr, len(isr))."""
        return self.min_isr_met

    def follower_state(self, replica_id: int) -> FollowerState:
        if replica_id == self.leader_id:
            return FollowerState(replica_id, self._durable_end_offset, self._now_ms,
                                 self._now_ms, True, True)
        follower = self._follower(replica_id)
        return FollowerState(replica_id, follower.log_end_offset, follower.last_caught_up_ms,
                             follower.last_fetch_ms, replica_id in self._isr,
                             replica_id in self.maximal_isr, follower.unfit)

    # -- inputs ---------------------------------------------------------------------------------

    def on_leader_append(self, log_end_offset: int) -> list[Decision]:
        """The leader appended up to `log_end_offset` (not yet durable: the HW waits)."""
        assert log_end_offset >= self._log_end_offset, (log_end_offset, self._log_end_offset)
        self._log_end_offset = log_end_offset
        self._check()
        return []

    def on_leader_durable(self, durable_end_offset: int) -> list[Decision]:
        """Everything below `durable_end_offset` is durable on the leader (fsynced under
        `always`, written under the other policies). Implies it was appended."""
        assert durable_end_offset >= self._durable_end_offset, (
            durable_end_offset, self._durable_end_offset)
        self._durable_end_offset = durable_end_offset
        self._log_end_offset = max(self._log_end_offset, durable_end_offset)
        return self._decide()

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: int,
                          unfit: Unfit = "") -> list[Decision]:
        """Follower `replica_id` fetches at `fetch_offset`: it holds every offset below.
        `unfit` (not ""): it must leave the ISR, and stay out while it says so."""
        follower = self._follower(replica_id)
        if not 0 <= fetch_offset <= self._log_end_offset:
            raise ValueError(f"replica {replica_id} fetches at {fetch_offset}, outside "
                             f"[0, {self._log_end_offset}] (the leader's LEO)")
        if unfit not in UNFIT_REASONS:
            raise ValueError(f"replica {replica_id} says it is unfit for {unfit!r}")
        follower.unfit = unfit
        now = self._advance_clock(now_ms)
        caught_up_at: int | None = None
        if fetch_offset >= self._log_end_offset:
            caught_up_at = now
        elif fetch_offset >= follower.prev_fetch_leader_leo:
            caught_up_at = follower.prev_fetch_ms
        if caught_up_at is not None:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms or caught_up_at,
                                             caught_up_at)
        # A smaller offset than before is taken as is (the follower lost an unflushed tail);
        # the HW does not move back for it.
        follower.log_end_offset = fetch_offset
        follower.prev_fetch_leader_leo = self._log_end_offset
        follower.prev_fetch_ms = follower.last_fetch_ms = now
        return self._decide()

    def on_follower_standing(self, replica_id: int, fetch_offset: int, fetched_ms: int
                             ) -> None:
        """Follower `replica_id` still fetches at `fetch_offset`, as its fetch session last
        said at `fetched_ms` (a fetch session names a partition only when its offset changes,
        so a follower of an idle partition says nothing of it). Caught up at `fetched_ms`
        when `fetch_offset` reaches the leader's LEO: the LEO never goes back at a leader, so
        it was no greater then. An offset other than the one it last fetched at, or a time
        older than what is known, changes nothing. Decides nothing: tell every follower's
        standing, then `tick` (deciding after the first alone would find the others lagging
        only because they were not told yet)."""
        follower = self._follower(replica_id)
        if follower.log_end_offset != fetch_offset or fetch_offset < self._log_end_offset:
            return
        if fetched_ms <= (follower.last_fetch_ms or -1):
            return
        self._advance_clock(fetched_ms)  # a moment of the same clock, past or present
        follower.last_caught_up_ms = max(follower.last_caught_up_ms or fetched_ms, fetched_ms)
        follower.last_fetch_ms = max(follower.last_fetch_ms or fetched_ms, fetched_ms)
        follower.prev_fetch_leader_leo = self._log_end_offset
        follower.prev_fetch_ms = follower.last_fetch_ms

    def on_isr_committed(self, isr: tuple[int, ...], leader_epoch: int) -> list[Decision]:
        """The metadata committed `isr` at `leader_epoch`, proposed by this leader or not."""
        if leader_epoch < self.leader_epoch:
            return []  # decided under an older leader: superseded by this epoch's ISR
        assert leader_epoch == self.leader_epoch, (
            f"epoch {leader_epoch} > {self.leader_epoch}: a new epoch needs a new LeaderState")
        committed = _sorted(isr)
        assert self.leader_id in committed and set(committed) <= set(self.replicas), (
            committed, self.replicas)
        for joined in set(committed) - set(self._isr):
            follower = self._followers[joined]
            follower.last_caught_up_ms = max(follower.last_caught_up_ms or self._now_ms,
                                             self._now_ms)
        self._isr = committed
        # Only the outcome of our own proposal ends it: a change from elsewhere leaves ours in
        # flight, and it may still be applied after it.
        if self._pending is not None and self._pending.isr == committed:
            self._pending = None
        return self._decide()

    def on_proposal_failed(self) -> list[Decision]:
        """The proposal in flight was refused (never applied): forget it; the next tick
        proposes again if still needed. Do not call this when the outcome is unknown (a
        timeout): the proposal may still be applied, so it must keep counting."""
        assert self._pending is not None, "no proposal in flight"
        self._pending = None
        self._held = True
        return self._decide()

    def tick(self, now_ms: int) -> list[Decision]:
        """Time passes: lagging members are proposed for removal."""
        self._advance_clock(now_ms)
        self._held = False
        return self._decide()

    def next_tick_ms(self) -> int | None:
        """The earliest time at which `tick` may decide something, so that a shell ticks
        only then: when the ISR member caught up longest ago starts to lag; the time last
        seen while a refused proposal is held (any tick ends the hold: the shell spaces those
        ticks); None when time alone decides nothing (no follower in the ISR, or a proposal
        in flight: its outcome, an input, decides next). Ticking any time before it decides
        nothing, and the inputs that could make it sooner (an ISR commit, a refusal) are the
        ones after which a shell asks again."""
        if self._pending is not None:
            return None
        if self._held:
            return self._now_ms
        due: int | None = None
        for replica in self._isr:
            if replica == self.leader_id:
                continue
            caught_up = self._followers[replica].last_caught_up_ms
            assert caught_up is not None, replica  # set for ISR members (see _lagging)
            lags_at = caught_up + self.replica_lag_ms_max + 1
            due = lags_at if due is None else min(due, lags_at)
        return due

    # -- decisions ------------------------------------------------------------------------------

    def _decide(self) -> list[Decision]:
        decisions: list[Decision] = []
        hw = self._next_high_watermark()
        if hw > self._hw:
            decisions.append(self._advance_high_watermark(hw))
        proposal = self._next_proposal()
        if proposal is not None:
            self._pending = _Pending(proposal.isr, proposal.reason)
            decisions.append(proposal)
        self._check()
        return decisions

    def _advance_high_watermark(self, offset: int) -> AdvanceHighWatermark:
        # Committed stays committed: the HW never moves back, nor past the durable LEO.
        assert self._hw < offset <= self._durable_end_offset, (
            self._hw, offset, self._durable_end_offset)
        self._hw = offset
        return AdvanceHighWatermark(offset)

    def _next_high_watermark(self) -> int:
        """The least LEO over the maximal ISR, or the current HW while one is unknown."""
        least = self._durable_end_offset
        for replica in self.maximal_isr:
            if replica == self.leader_id:
                continue
            leo = self._followers[replica].log_end_offset
            if leo is None:
                return self._hw  # not fetched in this epoch yet: it may hold less
            least = min(least, leo)
        return least

    def _next_proposal(self) -> ProposeIsr | None:
        if self._pending is not None or self._held:
            return None
        lagging = {r for r in self._isr if r != self.leader_id and self._lagging(r)}
        if lagging:
            return ProposeIsr(_sorted(set(self._isr) - lagging), self.leader_epoch, "shrink")
        ready = {r for r in self._followers if r not in self._isr and self._ready(r)}
        if ready:
            return ProposeIsr(_sorted((*self._isr, *ready)), self.leader_epoch, "expand")
        return None

    def _lagging(self, replica: int) -> bool:
        """Lagging, or unfit: either way it leaves the ISR."""
        follower = self._followers[replica]
        caught_up = follower.last_caught_up_ms
        assert caught_up is not None, replica  # set for ISR members at start and on joining
        return bool(follower.unfit) or self._now_ms - caught_up > self.replica_lag_ms_max

    def _ready(self, replica: int) -> bool:
        follower = self._followers[replica]
        leo, fetched_ms = follower.log_end_offset, follower.last_fetch_ms
        return (not follower.unfit and leo is not None and fetched_ms is not None
                and leo >= max(self._hw, self.epoch_start_offset)
                and self._now_ms - fetched_ms <= self.replica_lag_ms_max)

    # -- helpers --------------------------------------------------------------------------------

    def _follower(self, replica_id: int) -> _Follower:
        follower = self._followers.get(replica_id)
        if follower is None:
            raise ValueError(f"broker {replica_id} is not a follower of this partition "
                             f"(leader {self.leader_id}, replicas {list(self.replicas)})")
        return follower

    def _advance_clock(self, now_ms: int) -> int:
        self._now_ms = max(self._now_ms, now_ms)
        return self._now_ms

    def _check(self) -> None:
        assert 0 <= self._hw <= self._durable_end_offset <= self._log_end_offset, (
            self._hw, self._durable_end_offset, self._log_end_offset)
        assert self.leader_id in self._isr, (self.leader_id, self._isr)
        assert set(self._isr) <= set(self.replicas), (self._isr, self.replicas)
        if self._pending is not None:
            assert self.leader_id in self._pending.isr, self._pending
            assert set(self._pending.isr) <= set(self.replicas), self._pending


def _sorted(replicas: tuple[int, ...] | set[int]) -> tuple[int, ...]:
    return tuple(sorted(set(replicas)))
