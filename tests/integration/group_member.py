"""A consumer-group member in a process of its own, for tests that kill or pause members:

    python -m tests.integration.group_member --brokers ADDR --group G --stream S
        [--session-timeout-ms N] [--zombie-commit]

It consumes the partitions it is given and prints one JSON line per event on stdout:
{"event": "assigned", "partitions": [[stream, partition], ...], "member": id} after each
change. With --zombie-commit it also commits every 100 ms, under the identity (member id,
epoch, partitions) it last held them with (after a pause: the one it held before), an
offset that grows by one each time, and prints
{"event": "commit", "offset": n, "failed": {"stream/partition": code}} — so a test that
pauses it (SIGSTOP) sees what becomes of its commits once it wakes after its session ended
(a request that fails as a whole prints {"event": "commit_error", "code": ...}).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import jetstream
from jetstream.client import Client
from jetstream.client.group_subscription import GroupSubscription
from jetstream.errors import JetstreamError

#: A turn of the commit loop this much later than its 100 ms: the process was paused.
PAUSE_S = 1.0


def emit(**event: Any) -> None:
    print(json.dumps({"t": time.monotonic(), **event}), flush=True)


async def zombie_commits(js: Client, sub: GroupSubscription, group: str) -> None:
    identity: tuple[str, int, frozenset[tuple[str, int]]] | None = None
    offset = 0
    last = time.monotonic()
    while True:
        await asyncio.sleep(0.1)
        woke, last = time.monotonic() - last > PAUSE_S, time.monotonic()
        # Waking from a pause, it commits first under the identity it had before (its
        # subscription may have rejoined meanwhile, on the loop's first turns): a zombie.
        if sub.member_id and sub.assignment and not woke:
            identity = (sub.member_id, sub.member_epoch, sub.assignment)
        if identity is None:
            continue
        member_id, epoch, partitions = identity
        offset += 1
        try:
            failed = await js.commit_offsets(group, dict.fromkeys(partitions, offset),
                                             member_id=member_id, member_epoch=epoch)
        except JetstreamError as exc:
            # A whole request failed, e.g. one in flight when SIGSTOP came timed out on
            # waking: say so and commit again, as a zombie would.
            emit(event="commit_error", offset=offset, code=exc.code)
            continue
        emit(event="commit", offset=offset, member=member_id,
             failed={f"{s}/{p}": exc.code for (s, p), exc in failed.items()})


async def main(args: argparse.Namespace) -> None:
    async with jetstream.connect(args.brokers) as js:
        last: frozenset[tuple[str, int]] | None = None

        async def changed(_partitions: frozenset[tuple[str, int]]) -> None:
            nonlocal last
            if sub.assignment != last:
                last = sub.assignment
                emit(event="assigned", partitions=sorted(last), member=sub.member_id)

        sub = js.subscribe(args.stream, group=args.group,
                           session_timeout_ms=args.session_timeout_ms,
                           on_assign=changed, on_revoke=changed)
        async with sub:
            await changed(frozenset())
            tasks = [asyncio.create_task(zombie_commits(js, sub, args.group))] \
                if args.zombie_commit else []
            async for _msg in sub:
                pass
            for task in tasks:
                task.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--session-timeout-ms", type=int, default=10_000)
    parser.add_argument("--zombie-commit", action="store_true")
    try:
        asyncio.run(main(parser.parse_args()))
    except KeyboardInterrupt:
        sys.exit(0)
