from typing import Any

def take_plain(msgs: list[Any], start: int, max_bytes: int, policy: object, record_type: type,
               no_headers: object, msg_id: str, msg_id_chars_max: int,
               envelope_prefix: bytes, records: list[Any], targets: list[Any],
               expects: list[Any] | None, policies: tuple[object, object, object]) -> int: ...
