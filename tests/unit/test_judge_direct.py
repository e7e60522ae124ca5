"""A direct append's judgement (jetstream.server.guarded.judge_direct) on a real log: a
retry is answered with its original offset, and a duplicate whose producer stamp comes in
order holds its place in the producer's sequence, as on the NATS path."""

from __future__ import annotations

from pathlib import Path

import pytest

from jetstream.errors import OutOfOrderSequence
from jetstream.idempotence.guard import Expectations, ProducerSequence
from jetstream.raft_meta.model import StreamConfig
from jetstream.server.config import BrokerConfig
from jetstream.server.guarded import PartitionGuard, judge_direct
from jetstream.stream import format as fmt
from jetstream.stream.log import Log


async def test_a_duplicate_in_order_moves_the_producer_on(tmp_path: Path) -> None:
    log = Log(tmp_path / "p-0")
    guarded = PartitionGuard(StreamConfig("p", "p"), BrokerConfig())
    guarded.serve(log, None, "guard")
    await guarded.loaded()

    def append(msg: str, epoch: int, sequence: int, resume: bool = False) -> int:
        """The offset of the publish: appended now, or its original when a retry."""
        expect = Expectations(msg_id=msg, producer=ProducerSequence("w", epoch, sequence,
                                                                    resume))
        judged = judge_direct(guarded, log, [fmt.Record(msg.encode())], expect)
        if isinstance(judged, int):
            return judged
        records, guard_pass = judged
        info = log.append(records, 0)
        assert guard_pass is not None
        guard_pass.commit()
        return info.base_offset

    try:
        assert [append(f"m{i}", 0, i) for i in range(3)] == [0, 1, 2]
        # Epoch 1 sends again from m1: duplicates in order, then the new record after them.
        assert append("m1", 1, 0, resume=True) == 1
        assert append("m2", 1, 1) == 2
        assert append("m3", 1, 2) == 3
        # Epoch 2's duplicate out of order holds no place: what follows it is refused.
        assert append("m1", 2, 4) == 1
        with pytest.raises(OutOfOrderSequence):
            append("m9", 2, 5)
    finally:
        log.close()
