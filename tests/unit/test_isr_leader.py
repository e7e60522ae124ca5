"""The leader's ISR and high watermark (jetstream.isr.leader): table tests of each rule, and a
stateful property test of the invariants and of the safety property: every member of the
committed ISR always holds every offset below the high watermark."""

from __future__ import annotations

import copy

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from jetstream.isr.leader import (
    UNFIT_REASONS,
    AdvanceHighWatermark,
    Decision,
    FollowerState,
    LeaderState,
    ProposeIsr,
    as_unfit,
)

LEADER = 1
EPOCH = 5
LAG_MS = 1_000


def make(*, replicas: tuple[int, ...] = (1, 2, 3), isr: tuple[int, ...] = (1, 2, 3),
         hw: int = 0, leo: int = 10, now: int = 0, min_isr: int = 2,
         epoch_start: int | None = None) -> LeaderState:
    return LeaderState(LEADER, EPOCH, replicas, isr, hw, leo, now, LAG_MS, min_isr,
                       leader_epoch_start_offset=epoch_start)


def hw_moves(decisions: list[Decision]) -> list[int]:
    return [d.offset for d in decisions if isinstance(d, AdvanceHighWatermark)]


def proposals(decisions: list[Decision]) -> list[ProposeIsr]:
    return [d for d in decisions if isinstance(d, ProposeIsr)]


# -- the high watermark ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("isr", "fetches", "expected_hw"),
    [
        # The least LEO of the ISR: the leader's own (10) counts too.
        ((1, 2, 3), [(2, 7), (3, 9)], 7),
        ((1, 2, 3), [(2, 10), (3, 10)], 10),
        ((1, 2, 3), [(2, 9), (3, 10), (2, 10)], 10),
        # A member that has not fetched in this epoch may hold less: the HW waits for it.
        ((1, 2, 3), [(2, 10)], 4),
        # A replica outside the ISR does not hold the HW back.
        ((1, 2), [(2, 8), (3, 1)], 8),
        # The leader alone.
        ((1,), [], 10),
    ],
)
def test_high_watermark_is_the_least_leo_of_the_isr(
        isr: tuple[int, ...], fetches: list[tuple[int, int]], expected_hw: int) -> None:
    leader = make(isr=isr, hw=4, min_isr=1)
    moves = hw_moves(leader.tick(0))
    for replica, offset in fetches:
        moves += hw_moves(leader.on_follower_fetch(replica, offset, 10))
    assert leader.high_watermark == expected_hw
    assert moves == sorted(set(moves)) and (moves[-1:] == [expected_hw] or expected_hw == 4)


def test_high_watermark_waits_for_the_leaders_durable_offset() -> None:
    leader = make(isr=(1, 2))
    assert leader.on_leader_append(20) == []
    assert hw_moves(leader.on_follower_fetch(2, 20, 10)) == [10]  # durable LEO is still 10
    assert leader.high_watermark == 10
    assert leader.on_leader_durable(15) == [AdvanceHighWatermark(15)]
    assert leader.on_leader_durable(20) == [AdvanceHighWatermark(20)]
    assert leader.durable_end_offset == leader.log_end_offset == 20


def test_durable_offset_implies_appended() -> None:
    # Under fsync `never`/`interval` the shell passes the plain LEO as durable right away.
    leader = make(isr=(1,))
    leader.tick(0)
    assert leader.on_leader_durable(12) == [AdvanceHighWatermark(12)]
    assert leader.log_end_offset == 12


def test_high_watermark_never_moves_backward() -> None:
    # Checkpointed HW 8; the followers report less (one lost an unflushed tail): it stays.
    leader = make(isr=(1, 2, 3), hw=8)
    assert leader.on_follower_fetch(2, 5, 10) == []
    assert leader.on_follower_fetch(3, 6, 10) == []
    assert leader.high_watermark == 8
    assert leader.on_follower_fetch(2, 10, 20) == []
    assert leader.on_follower_fetch(3, 10, 20) == [AdvanceHighWatermark(10)]
    leader.on_follower_fetch(2, 3, 30)  # going back later does not move it back either
    assert leader.high_watermark == 10


def test_start_values_are_checked() -> None:
    with pytest.raises(AssertionError):
        make(hw=11, leo=10)  # a HW past the leader's log
    with pytest.raises(AssertionError):
        make(isr=(2, 3))  # the leader outside its ISR
    with pytest.raises(AssertionError):
        make(isr=(1, 4))  # an ISR member that is not a replica


def test_pending_expansion_member_holds_the_high_watermark() -> None:
    leader = make(isr=(1, 2), epoch_start=0)
    assert hw_moves(leader.on_follower_fetch(2, 4, 10)) == [4]
    decisions = leader.on_follower_fetch(3, 5, 10)
    assert decisions == [ProposeIsr((1, 2, 3), EPOCH, "expand")]
    assert leader.maximal_isr == (1, 2, 3) and leader.isr == (1, 2)
    # Without the pending member the HW would go to 10.
    assert hw_moves(leader.on_follower_fetch(2, 10, 20)) == [5]
    assert leader.on_isr_committed((1, 2, 3), EPOCH) == []
    assert list(leader.isr) == [1, 2, 3] and leader.pending_isr is None
    assert leader.on_follower_fetch(3, 10, 30) == [AdvanceHighWatermark(10)]


def test_shrinking_member_counts_until_committed() -> None:
    leader = make()
    leader.on_follower_fetch(2, 10, 100)
    assert leader.on_follower_fetch(3, 5, 100) == [AdvanceHighWatermark(5)]
    leader.on_follower_fetch(2, 10, 1_000)
    assert leader.tick(1_000) == []  # 3 was caught up at 0 (the start): 1000 ms is not > max
    assert leader.tick(1_001) == [ProposeIsr((1, 2), EPOCH, "shrink")]
    assert leader.maximal_isr == (1, 2, 3)
    assert leader.on_follower_fetch(2, 10, 1_200) == []
    assert leader.high_watermark == 5  # 3 still counts: the removal may not be applied
    assert leader.on_isr_committed((1, 2), EPOCH) == [AdvanceHighWatermark(10)]
    assert leader.isr == (1, 2) and leader.follower_state(3).counts_for_hw is False


# -- caught up, shrink and expand ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("isr", "second_fetch", "expected_caught_up_ms"),
    [
        # First fetch at t=2000 at 5 while the leader's LEO was 10; then the leader appends
        # to 30 and the follower fetches again at t=3000.
        ((1, 2, 3), 30, 3_000),  # at the leader's LEO now: caught up now
        ((1, 2, 3), 20, 2_000),  # past the LEO of its previous fetch: caught up back then
        ((1, 2, 3), 10, 2_000),
        ((1, 2, 3), 9, 1_000),  # behind both: still the start of the epoch (ISR member)
        ((1, 2), 9, None),  # a replica outside the ISR: never caught up
        ((1, 2), 10, 2_000),
    ],
)
def test_caught_up_rule(isr: tuple[int, ...], second_fetch: int,
                        expected_caught_up_ms: int | None) -> None:
    leader = make(isr=isr, now=1_000)
    leader.on_follower_fetch(3, 5, 2_000)
    leader.on_leader_append(30)
    leader.on_follower_fetch(3, second_fetch, 3_000)
    state = leader.follower_state(3)
    assert state.last_caught_up_ms == expected_caught_up_ms
    assert state.log_end_offset == second_fetch


def test_slow_follower_is_removed_and_a_keeping_up_one_is_not() -> None:
    # Kafka's slow follower: it fetches every 100 ms, but a busy leader appends faster than
    # it copies, so it never reaches the LEO the leader had at its previous fetch.
    leader = make(isr=(1, 2, 3), leo=10)
    leo, first_proposal = 10, None
    for now in range(100, 2_000, 100):
        previous_leo, leo = leo, leo + 10
        leader.on_leader_append(leo)
        decisions = leader.on_leader_durable(leo)
        # Any input may find the lagging member (here the next fetch), not only a tick.
        decisions += leader.on_follower_fetch(2, previous_leo, now)  # all it got: keeps up
        decisions += leader.on_follower_fetch(3, max(0, leo - 20), now)  # always behind
        decisions += leader.tick(now)
        found = proposals(decisions)
        if found and first_proposal is None:
            first_proposal = (now, found[0])
            assert leader.follower_state(2).last_caught_up_ms == now - 100
    assert first_proposal == (1_100, ProposeIsr((1, 2), EPOCH, "shrink"))
    assert leader.follower_state(3).last_caught_up_ms == 0


def test_all_lagging_members_go_in_one_proposal() -> None:
    leader = make(replicas=(1, 2, 3, 4), isr=(1, 2, 3, 4), min_isr=3)
    leader.on_follower_fetch(4, 10, 900)
    assert leader.tick(1_001) == [ProposeIsr((1, 4), EPOCH, "shrink")]
    # The shrink is never held back by min_isr; publishes with `all` are refused instead.
    assert leader.on_isr_committed((1, 4), EPOCH) == [AdvanceHighWatermark(10)]
    assert not leader.min_isr_met and not leader.can_commit_all()


def test_expansion_when_the_follower_reaches_the_high_watermark() -> None:
    leader = make(isr=(1, 2), hw=10, epoch_start=0)
    assert leader.tick(10) == []  # 3 has not fetched in this epoch: nothing is known of it
    assert leader.on_follower_fetch(3, 6, 20) == []
    assert leader.on_follower_fetch(3, 9, 30) == []
    assert leader.on_follower_fetch(3, 10, 40) == [ProposeIsr((1, 2, 3), EPOCH, "expand")]


def test_expansion_needs_the_offset_where_this_epoch_began() -> None:
    # HW 0 (say the checkpoint was lost): reaching it is not enough, the follower must have
    # fetched past this epoch's start, so it truncated against this leader.
    leader = make(isr=(1, 2), hw=0, leo=10)
    assert leader.on_follower_fetch(3, 5, 10) == []
    assert leader.on_follower_fetch(3, 10, 20) == [ProposeIsr((1, 2, 3), EPOCH, "expand")]


def test_a_follower_that_stopped_fetching_is_not_added_back() -> None:
    # No traffic: its last LEO still reaches the HW, but it has not fetched for too long.
    leader = make(isr=(1, 2, 3))
    leader.on_follower_fetch(2, 10, 500)
    assert leader.on_follower_fetch(3, 10, 2_000) == [
        AdvanceHighWatermark(10), ProposeIsr((1, 3), EPOCH, "shrink")]
    assert leader.on_isr_committed((1, 3), EPOCH) == []
    assert leader.tick(3_000) == []
    assert leader.on_follower_fetch(3, 10, 3_050) == []
    assert leader.on_follower_fetch(2, 10, 3_100) == [ProposeIsr((1, 2, 3), EPOCH, "expand")]


def test_a_new_member_gets_a_full_lag_window() -> None:
    leader = make(isr=(1, 2), hw=10, epoch_start=0)
    leader.on_follower_fetch(2, 10, 4_500)
    leader.on_follower_fetch(3, 10, 4_000)
    assert leader.on_isr_committed((1, 2, 3), EPOCH) == []
    leader.on_follower_fetch(2, 10, 5_500)
    assert leader.follower_state(3).last_caught_up_ms == 4_500
    assert leader.tick(5_500) == []
    assert leader.tick(5_501) == [ProposeIsr((1, 2), EPOCH, "shrink")]


def test_a_follower_standing_at_the_log_end_in_its_session_stays_caught_up() -> None:
    # A fetch session names an idle partition once; its leader hears where the follower
    # stands from the session (its last request's time) before each tick.
    leader = make(isr=(1, 2, 3))
    leader.on_follower_fetch(2, 10, 100)
    leader.on_follower_fetch(3, 10, 100)
    for now in range(1_000, 10_000, 900):
        leader.on_follower_standing(2, 10, now)
        leader.on_follower_standing(3, 10, now)
        assert leader.tick(now + 50) == []
    assert leader.follower_state(2).last_caught_up_ms == 9_100


def test_standings_told_one_by_one_decide_nothing_until_the_tick() -> None:
    # Deciding after the first follower's standing would find the second lagging only
    # because its own standing was not told yet: a shrink, and an expansion right after.
    leader = make(isr=(1, 2, 3))
    leader.on_follower_fetch(2, 10, 100)
    leader.on_follower_fetch(3, 10, 100)
    leader.on_follower_standing(2, 10, 5_000)
    assert leader.isr == (1, 2, 3) and leader.pending_isr is None
    leader.on_follower_standing(3, 10, 5_000)
    assert leader.tick(5_001) == []


def test_a_standing_that_does_not_prove_caught_up_changes_nothing() -> None:
    leader = make(isr=(1, 2, 3))
    leader.on_follower_fetch(2, 10, 100)
    leader.on_follower_fetch(3, 7, 100)  # behind the LEO 10
    # An offset behind the LEO, or other than the last one fetched at, proves nothing.
    leader.on_follower_standing(3, 7, 900)
    leader.on_follower_standing(2, 9, 900)
    assert leader.follower_state(3).last_caught_up_ms in (None, 0)
    assert leader.follower_state(2).last_caught_up_ms == 100
    # An old session (its broker gone) says nothing newer: both are removed.
    leader.on_follower_standing(2, 10, 50)
    assert proposals(leader.tick(1_101)) == [ProposeIsr((1,), EPOCH, "shrink")]


def test_a_standing_follower_is_not_in_the_replicas() -> None:
    leader = make(isr=(1, 2, 3))
    with pytest.raises(ValueError, match="not a follower"):
        leader.on_follower_standing(7, 10, 100)


def test_one_proposal_in_flight() -> None:
    leader = make(replicas=(1, 2, 3, 4), isr=(1, 2, 3), epoch_start=0)
    leader.on_follower_fetch(2, 10, 900)
    assert leader.tick(1_001) == [ProposeIsr((1, 2), EPOCH, "shrink")]
    # 4 is ready to join and 2 lags by now: both wait for the shrink's outcome.
    assert leader.on_follower_fetch(4, 10, 1_100) == []
    assert leader.tick(5_000) == []
    assert leader.on_follower_fetch(4, 10, 5_000) == []
    # The next proposal comes as soon as the previous one is committed.
    assert leader.on_isr_committed((1, 2), EPOCH) == [
        AdvanceHighWatermark(10), ProposeIsr((1,), EPOCH, "shrink")]
    assert leader.on_isr_committed((1,), EPOCH) == [ProposeIsr((1, 4), EPOCH, "expand")]


def test_a_refused_proposal_is_retried_at_the_next_tick() -> None:
    leader = make()
    leader.on_follower_fetch(2, 10, 900)
    assert leader.tick(1_001) == [ProposeIsr((1, 2), EPOCH, "shrink")]
    assert leader.on_proposal_failed() == []
    assert leader.pending_isr is None
    assert leader.on_follower_fetch(2, 10, 1_050) == []  # not at the rate of fetches
    assert leader.tick(1_100) == [ProposeIsr((1, 2), EPOCH, "shrink")]
    with pytest.raises(AssertionError):
        make().on_proposal_failed()  # nothing in flight


def test_a_refused_expansion_stops_counting_for_the_high_watermark() -> None:
    leader = make(isr=(1, 2), epoch_start=0)
    assert leader.on_follower_fetch(3, 5, 10) == [ProposeIsr((1, 2, 3), EPOCH, "expand")]
    assert leader.on_follower_fetch(2, 10, 20) == [AdvanceHighWatermark(5)]
    assert leader.on_proposal_failed() == [AdvanceHighWatermark(10)]
    # 3 holds 5 < HW 10: it is not proposed again until it reaches the HW.
    assert leader.tick(30) == []
    assert leader.on_follower_fetch(3, 10, 40) == [ProposeIsr((1, 2, 3), EPOCH, "expand")]


@pytest.mark.parametrize("reason", ["corrupt", "disk_full"])
def test_an_unfit_follower_leaves_the_isr_at_once_and_stays_out_while_unfit(
        reason: str) -> None:
    leader = make(isr=(1, 2, 3), epoch_start=0)
    leader.on_follower_fetch(3, 10, 10)
    # Caught up, yet it says it must not be in the ISR: removed without waiting for the lag.
    assert proposals(leader.on_follower_fetch(2, 10, 20, as_unfit(reason))) == [
        ProposeIsr((1, 3), EPOCH, "shrink")]
    assert leader.follower_state(2).unfit == reason
    assert proposals(leader.on_isr_committed((1, 3), EPOCH)) == []
    # Caught up and fetching often, it is not added back while it says so ...
    for now in (30, 40, 50):
        assert proposals(leader.on_follower_fetch(2, 10, now, as_unfit(reason))) == []
    assert proposals(leader.tick(60)) == []
    # ... and is, once it says it is fit again.
    assert leader.on_follower_fetch(2, 10, 70) == [ProposeIsr((1, 2, 3), EPOCH, "expand")]
    assert leader.follower_state(2).unfit == ""


def test_an_unknown_unfit_reason_is_refused() -> None:
    leader = make(isr=(1, 2, 3))
    with pytest.raises(ValueError):
        leader.on_follower_fetch(2, 10, 10, "tired")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        as_unfit("tired")


def test_a_change_from_elsewhere_leaves_our_proposal_in_flight() -> None:
    leader = make(isr=(1, 2), epoch_start=0)
    assert proposals(leader.on_follower_fetch(3, 5, 10)) == [
        ProposeIsr((1, 2, 3), EPOCH, "expand")]
    leader.on_follower_fetch(2, 10, 20)
    # Someone else removed 2: our expansion (which has 2) may still be applied after it.
    assert leader.on_isr_committed((1,), EPOCH) == []
    assert leader.isr == (1,) and leader.maximal_isr == (1, 2, 3)
    assert leader.high_watermark == 5
    assert leader.on_isr_committed((1, 2, 3), EPOCH) == []
    assert leader.pending_isr is None


def test_committed_isr_from_another_epoch() -> None:
    leader = make(isr=(1, 2))
    assert leader.on_isr_committed((1,), EPOCH - 1) == []  # older: superseded, ignored
    assert leader.isr == (1, 2)
    with pytest.raises(AssertionError):
        leader.on_isr_committed((1, 2), EPOCH + 1)  # newer: this instance is stale
    with pytest.raises(AssertionError):
        leader.on_isr_committed((2, 3), EPOCH)  # the leader is always in its ISR
    with pytest.raises(AssertionError):
        leader.on_isr_committed((1, 7), EPOCH)  # only replicas


@pytest.mark.parametrize(
    ("isr", "min_isr", "met"),
    [((1, 2, 3), 2, True), ((1, 2), 2, True), ((1,), 2, False), ((1,), 1, True),
     ((1, 2), 3, False)],
)
def test_min_isr(isr: tuple[int, ...], min_isr: int, met: bool) -> None:
    leader = make(isr=isr, min_isr=min_isr)
    assert leader.min_isr_met is met
    assert leader.can_commit_all() is met


def test_min_isr_follows_the_committed_isr_not_the_pending_one() -> None:
    leader = make(isr=(1,), epoch_start=0, min_isr=2)
    leader.on_follower_fetch(2, 10, 10)
    assert leader.pending_isr == (1, 2) and not leader.can_commit_all()
    leader.on_isr_committed((1, 2), EPOCH)
    assert leader.can_commit_all()


def test_inputs_from_the_world_that_cannot_be_accepted() -> None:
    leader = make()
    with pytest.raises(ValueError, match="outside"):
        leader.on_follower_fetch(2, 11, 10)  # past the leader's LEO
    with pytest.raises(ValueError, match="not a follower"):
        leader.on_follower_fetch(LEADER, 10, 10)
    with pytest.raises(ValueError, match="not a follower"):
        leader.on_follower_fetch(9, 10, 10)
    assert leader.follower_state(2).log_end_offset is None  # nothing was recorded


def test_follower_state() -> None:
    leader = make(isr=(1, 2), epoch_start=0, now=100)
    leader.on_follower_fetch(2, 10, 200)
    leader.on_follower_fetch(3, 4, 300)
    assert leader.follower_state(1) == FollowerState(1, 10, 300, 300, True, True)
    assert leader.follower_state(2) == FollowerState(2, 10, 200, 200, True, True)
    assert leader.follower_state(3) == FollowerState(3, 4, None, 300, False, False)  # < HW
    leader.on_follower_fetch(3, 10, 400)
    assert leader.follower_state(3) == FollowerState(3, 10, 400, 400, False, True)  # joining
    with pytest.raises(ValueError):
        leader.follower_state(9)


def test_time_going_back_is_taken_as_the_newest_time_seen() -> None:
    leader = make(isr=(1, 2))
    leader.on_follower_fetch(2, 10, 500)
    leader.on_follower_fetch(2, 10, 400)  # a fetch handled late: not "caught up at 400"
    assert leader.follower_state(2).last_caught_up_ms == 500


def test_next_tick_is_when_a_member_would_start_to_lag() -> None:
    leader = make(isr=(1, 2, 3), now=0)
    assert leader.next_tick_ms() == LAG_MS + 1  # both were caught up at the start
    leader.on_follower_fetch(3, 10, 300)
    leader.on_follower_fetch(2, 10, 400)
    assert leader.next_tick_ms() == 300 + LAG_MS + 1
    assert leader.tick(300 + LAG_MS) == []
    assert leader.tick(300 + LAG_MS + 1) == [ProposeIsr((1, 2), EPOCH, "shrink")]
    # In flight: its outcome decides what comes next, not time.
    assert leader.next_tick_ms() is None
    assert leader.on_isr_committed((1, 2), EPOCH) == []
    assert leader.next_tick_ms() == 400 + LAG_MS + 1


def test_next_tick_without_followers_in_the_isr_or_while_held() -> None:
    leader = make(isr=(1,), min_isr=1)
    assert leader.next_tick_ms() is None  # time alone changes nothing
    leader = make()
    leader.on_follower_fetch(2, 10, 900)
    assert leader.tick(1_001) == [ProposeIsr((1, 2), EPOCH, "shrink")]
    leader.on_proposal_failed()
    assert leader.next_tick_ms() == 1_001  # any tick ends the hold
    assert leader.tick(1_100) == [ProposeIsr((1, 2), EPOCH, "shrink")]


# -- stateful: invariants and safety under random schedules --------------------------------------


class LeaderMachine(RuleBasedStateMachine):
    """The world: followers whose logs only grow and fetch at their LEO, a leader that appends
    and makes durable, time, and a metadata store that commits or refuses the proposals (and
    sometimes removes an ISR member on its own)."""

    state: LeaderState

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        followers = data.draw(st.integers(0, 4), label="followers")
        self.replicas = tuple(range(1, followers + 2))
        in_isr = data.draw(st.lists(st.booleans(), min_size=followers, max_size=followers))
        self.committed = (LEADER, *(r for r, i in zip(self.replicas[1:], in_isr, strict=True)
                                    if i))
        self.leo = data.draw(st.integers(0, 40), label="leo")
        self.durable = self.leo
        self.hw = data.draw(st.integers(0, self.leo), label="hw")
        # ISR members hold everything below the HW they had committed; others anything.
        self.true_leo = {r: data.draw(st.integers(self.hw if r in self.committed else 0,
                                                  self.leo)) for r in self.replicas[1:]}
        self.now = 0
        self.outstanding: ProposeIsr | None = None
        self.state = LeaderState(LEADER, EPOCH, self.replicas, self.committed, self.hw,
                                 self.leo, self.now, LAG_MS,
                                 data.draw(st.integers(1, len(self.replicas))))
        self.apply(self.state.tick(self.now))

    def apply(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            if isinstance(decision, AdvanceHighWatermark):
                assert decision.offset > self.hw
                self.hw = decision.offset
            else:
                assert self.outstanding is None, "two proposals in flight"
                assert decision.expected_epoch == EPOCH and LEADER in decision.isr
                if decision.reason == "expand":
                    assert set(decision.isr) > set(self.committed)
                    for r in set(decision.isr) - set(self.committed):
                        assert self.true_leo[r] >= self.hw
                else:
                    assert set(decision.isr) < set(self.committed)
                self.outstanding = decision
                event(f"proposal: {decision.reason}")
        assert self.state.high_watermark == self.hw

    @rule(count=st.integers(1, 20), durable=st.booleans())
    def append(self, count: int, durable: bool) -> None:
        self.leo += count
        self.apply(self.state.on_leader_append(self.leo))
        if durable:
            self.durable = self.leo
            self.apply(self.state.on_leader_durable(self.durable))

    @rule(data=st.data())
    def make_durable(self, data: st.DataObject) -> None:
        self.durable = data.draw(st.integers(self.durable, self.leo))
        self.apply(self.state.on_leader_durable(self.durable))

    @precondition(lambda self: len(self.replicas) > 1)
    @rule(data=st.data(), dt=st.integers(0, 300))
    def fetch(self, data: st.DataObject, dt: int) -> None:
        replica = data.draw(st.sampled_from(self.replicas[1:]))
        offset = data.draw(st.one_of(st.just(self.leo),
                                     st.integers(self.true_leo[replica], self.leo)))
        unfit = data.draw(st.sampled_from(UNFIT_REASONS))
        self.true_leo[replica] = offset
        self.now += dt
        self.apply(self.state.on_follower_fetch(replica, offset, self.now, unfit))

    @rule(dt=st.integers(0, 1_500))
    def tick(self, dt: int) -> None:
        self.now += dt
        self.apply(self.state.tick(self.now))

    @precondition(lambda self: self.outstanding is not None)
    @rule()
    def commit(self) -> None:
        assert self.outstanding is not None
        self.committed, self.outstanding = self.outstanding.isr, None
        self.apply(self.state.on_isr_committed(self.committed, EPOCH))

    @precondition(lambda self: self.outstanding is not None)
    @rule()
    def refuse(self) -> None:
        self.outstanding = None
        self.apply(self.state.on_proposal_failed())

    @precondition(lambda self: len(self.committed) > 1)
    @rule(data=st.data())
    def removed_elsewhere(self, data: st.DataObject) -> None:
        gone = data.draw(st.sampled_from(self.committed[1:]))
        self.committed = tuple(r for r in self.committed if r != gone)
        if self.outstanding is not None and self.outstanding.isr == self.committed:
            self.outstanding = None  # the ISR we asked for: our proposal is done with
        self.apply(self.state.on_isr_committed(self.committed, EPOCH))

    @rule()
    def stale_commit(self) -> None:
        assert self.state.on_isr_committed((LEADER,), EPOCH - 1) == []

    def leo_of(self, replica: int) -> int:
        return self.durable if replica == LEADER else self.true_leo[replica]

    @invariant()
    def bounds(self) -> None:
        assert 0 <= self.state.high_watermark <= self.durable <= self.leo
        assert self.state.isr == tuple(sorted(self.committed))
        assert LEADER in self.state.isr and set(self.state.isr) <= set(self.replicas)
        expected_pending = None if self.outstanding is None else self.outstanding.isr
        assert self.state.pending_isr == expected_pending
        assert self.state.min_isr_met == (len(self.committed) >= self.state.min_isr)

    @invariant()
    def committed_isr_holds_everything_below_the_high_watermark(self) -> None:
        for replica in self.state.maximal_isr:
            assert self.leo_of(replica) >= self.state.high_watermark, replica

    @invariant()
    def next_tick_is_the_first_time_a_tick_decides_something(self) -> None:
        """Before `next_tick_ms` a tick decides nothing (None: never, by time alone); at it,
        it proposes a shrink, unless a refused proposal is held (then it is due at once)."""
        due = self.state.next_tick_ms()
        event("next tick: " + ("none" if due is None else "now" if due <= self.now
                               else "when a member would lag"))
        if due is None:
            assert copy.deepcopy(self.state).tick(self.now + 100 * LAG_MS) == []
        elif due <= self.now:
            assert due == self.now and self.state.pending_isr is None
        else:
            for early in (self.now, due - 1):
                assert copy.deepcopy(self.state).tick(early) == []
            decisions = copy.deepcopy(self.state).tick(due)
            assert [p.reason for p in proposals(decisions)] == ["shrink"]

    @invariant()
    def high_watermark_is_not_held_back(self) -> None:
        known = [self.state.follower_state(r).log_end_offset for r in self.state.maximal_isr]
        if all(leo is not None for leo in known):
            assert self.state.high_watermark == max(
                self.hw, min(self.leo_of(r) for r in self.state.maximal_isr))


LeaderMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50,
                                           deadline=None)
test_leader_state_machine = LeaderMachine.TestCase
