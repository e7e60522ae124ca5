"""`jetstream registers STREAM [--partition N]`: a partition's registers, the labels that
publishes check (`--check-registers`) and change (`--union-register`,
`--subtract-register`) with their data, as the partition's leader holds them."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from jetstream.cli_text import emit, table

if TYPE_CHECKING:
    from jetstream.client import Client


async def registers(js: Client, args: argparse.Namespace) -> int:
    found = await js.registers(args.stream, args.partition)
    emit(args, {"stream": args.stream, "partition": args.partition, "registers": found},
         table(["REGISTER", "VALUE"], sorted(found.items())) if found else "(no registers)")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stream")
    parser.add_argument("--partition", type=int, default=0)
