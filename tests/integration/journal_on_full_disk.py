"""A child process of test_disk_full_cluster: a broker's metadata (a Raft group of one) in
DIRECTORY, with a disk reserve, on a filesystem it fills to the last byte once the group is
up. It then commits metadata commands until the Raft journal has grown by GROWTH_BYTES
(pages the filesystem has to find blocks for), and prints one JSON line: the commands
committed, the journal's size before and after, the last command's port (each command
changes it) and whether the reserve is still held. Were the journal written through pages
with no block behind them, the first write past its old end would kill this process (SIGBUS).

    python -m tests.integration.journal_on_full_disk DIRECTORY
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from jetstream.natsd import free_ports
from jetstream.raft_meta.fsm import RegisterBroker
from jetstream.raft_meta.model import BrokerInfo
from jetstream.raft_meta.raft import JOURNAL_FILE, RaftMetadata
from jetstream.stream.reserve import DiskReserve
from tests.disk_space import fill

RESERVE_BYTES = 256 * 1024
GROWTH_BYTES = 64 * 1024
#: A broker's host name this long makes each command a few KiB: the journal grows in few.
LONG_HOST = "h" * 4000
COMMANDS_MAX = 2000
READY_S = 10.0
HOST = "127.0.0.1"


async def main(directory: Path) -> None:
    reserve = DiskReserve(directory, RESERVE_BYTES)
    assert reserve.ensure()
    meta = RaftMetadata(directory / "meta", f"{HOST}:{free_ports(1)[0]}", [], broker_id=1,
                        reserve=reserve)
    try:
        await meta.wait_ready(READY_S)
        await meta.propose(RegisterBroker(BrokerInfo(1, HOST, 1, 0)))
        fill(directory)
        journal = directory / "meta" / JOURNAL_FILE
        before = journal.stat().st_size
        committed = 0
        while journal.stat().st_size < before + GROWTH_BYTES and committed < COMMANDS_MAX:
            await meta.propose(RegisterBroker(BrokerInfo(1, LONG_HOST, committed + 2, 0)))
            committed += 1
        print(json.dumps({"committed": committed, "journal_before": before,
                          "journal_after": journal.stat().st_size,
                          "port": meta.state.brokers[1].port, "reserve_held": reserve.held}))
    finally:
        await meta.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
