"""Followers keep a fragment index (jetstream.tiered.service): a followed partition's store
is listed at once and then every listing interval, the tier outlives the role (a new leader
takes it, index and all), a change of settings makes a new one, tiers of partitions no longer
held are dropped, and a failing store backs the listing off. And a leader deletes no local
segment a follower has not copied yet (it copies only from the leader's disk). Real logs, a
real `file://` store."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from jetstream.isr.leader import LeaderState
from jetstream.raft_meta.model import StreamConfig
from jetstream.server.housekeeping import replicas_hold
from jetstream.stream.handles import HandlePool
from jetstream.tiered.partition_tier import TierConfig
from jetstream.tiered.service import Tiering
from tests.unit.log_helpers import Clock, append_n, make
from tests.unit.test_tiered_offload import NO_RETENTION, STREAM, new_tier, run_pass

DEADLINE_S = 10.0


def stored(tmp_path: Path) -> str:
    """A `file://` store holding the offloaded segments of a log of STREAM/0."""
    url = f"file://{tmp_path / 'store'}"
    log = make(tmp_path / "log", Clock(), segment_bytes_max=4096)
    try:
        append_n(log, 100, per_batch=2)
        tier = new_tier(url, tmp_path)
        for _ in range(5):
            run_pass(tier, log)
        assert len(tier.index) >= 4
    finally:
        log.close()
    return url


async def until(what: str, check: object) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.01)


def tiering(tmp_path: Path, list_interval_ms: int = 60_000) -> Tiering:
    return Tiering(tmp_path / "broker", 1 << 30, HandlePool(16), None,
                   TierConfig(list_interval_ms=list_interval_ms, backoff_ms_min=50,
                              backoff_ms_max=200))


def test_a_follower_lists_and_its_leader_role_takes_the_same_index(tmp_path: Path) -> None:
    url = stored(tmp_path)
    config = StreamConfig(STREAM, "orders.in", fragment_store=url)

    async def main() -> None:
        tiers = tiering(tmp_path)
        try:
            tiers.follow(config, 0)
            (tier,) = tiers.held()
            await until("the follower's listing", lambda: tier.listed)
            end = tier.index.end_offset
            assert tier.metrics.listings == 1 and end is not None and end > 0
            assert tier.index.start_offset(end) == 0 and tier.index.covering(0) is not None
            await asyncio.sleep(0.2)  # the interval is a minute: no second listing
            assert tier.metrics.listings == 1
            # Elected leader here: the same tier, already listed.
            assert tiers.tier_for(config, 0) is tier and tier.listed
            # Leading: the lister leaves it to the leader's offload passes.
            tiers.follow(config, 1)
            await until("partition 1 listed", lambda: len(tiers.held()) == 2 and all(
                t.listed for t in tiers.held()))
            assert tier.metrics.listings == 1
            # Settings changed: a new tier (listed afresh); no role any more: dropped.
            changed = replace(config, fragment_compression=type(
                config.fragment_compression)("zstd"))
            assert tiers.tier_for(changed, 0) is not tier
            tiers.retain([(STREAM, 1)])
            assert [t.partition for t in tiers.held()] == [1]
            assert tiers.tier_for(replace(config, fragment_store=None), 1) is None
            assert tiers.held() == []
        finally:
            await tiers.close()

    asyncio.run(main())


def test_a_failing_store_backs_the_follower_listing_off(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    config = StreamConfig(STREAM, "orders.in", fragment_store=f"file://{blocker}/store")

    async def main() -> None:
        tiers = tiering(tmp_path, list_interval_ms=100)
        try:
            tiers.follow(config, 0)
            (tier,) = tiers.held()
            await until("a failed listing", lambda: tier.store_error is not None)
            assert not tier.listed and tier.store_error.code == "FRAGMENT_STORE_UNAVAILABLE"
            assert tiers.warnings(tiers.held())[0]["partition"] == 0
            assert tier.listing_due_ms() > 0  # backed off, not listed again at once
        finally:
            await tiers.close()

    asyncio.run(main())


def test_local_segments_stay_until_every_in_sync_replica_holds_them(tmp_path: Path) -> None:
    log = make(tmp_path / "log", Clock(), segment_bytes_max=4096)
    try:
        append_n(log, 100, per_batch=2)
        hw = log.log_end_offset
        tier = new_tier(f"file://{tmp_path / 'store'}", tmp_path)  # local retention: 1 byte
        isr = LeaderState(0, 3, (0, 1, 2), (0, 1, 2), hw, hw, 0, 10_000, 2)
        assert replicas_hold(isr) == 0  # no follower fetched in this epoch yet
        for _ in range(5):
            tier.finish(tier.prepare(log, hw, NO_RETENTION, 0, 0, replicas_hold(isr))(), 0)
        assert len(tier.index) >= 4 and log.log_start_offset == 0  # offloaded, all kept
        isr.on_follower_fetch(1, hw, 0)
        isr.on_follower_fetch(2, 60, 0)
        assert replicas_hold(isr) == 60
        tier.finish(tier.prepare(log, hw, NO_RETENTION, 0, 0, replicas_hold(isr))(), 0)
        assert 0 < log.log_start_offset <= 60  # up to the slower follower's end
        isr.on_follower_fetch(2, hw, 0)
        tier.finish(tier.prepare(log, hw, NO_RETENTION, 0, 0, replicas_hold(isr))(), 0)
        assert log.log_start_offset > 60 and len(log.segment_base_offsets) == 1
        assert replicas_hold(None) is None
        # A replica out of the ISR holds nothing back.
        out = LeaderState(0, 4, (0, 1, 2), (0, 1), hw, hw, 0, 10_000, 1)
        out.on_follower_fetch(1, hw, 0)
        assert replicas_hold(out) == hw
    finally:
        log.close()
