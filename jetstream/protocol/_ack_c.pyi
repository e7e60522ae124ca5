from collections.abc import Sequence

from jetstream.protocol.envelope import AckPolicy

def encode_targets(targets: Sequence[tuple[int, str, str | None, AckPolicy, bool]], start: int,
                   base: int, records: Sequence[tuple[object, ...]], record_type: type,
                   prefix: bytes, tails: dict[tuple[str, AckPolicy], bytes],
                   leader_policy: AckPolicy, leader_out: list[tuple[str, bytes]],
                   all_policy: AckPolicy, all_out: list[tuple[str, bytes]],
                   all_targets: list[tuple[str, str | None]]) -> tuple[int, int]: ...
