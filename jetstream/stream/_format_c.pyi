from collections.abc import Sequence

def encode_records(records: Sequence[tuple[object, ...]], now_ms: int, record_bytes_max: int,
                   record_type: type) -> tuple[bytes, int, int] | None: ...
