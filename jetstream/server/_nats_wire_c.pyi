from collections.abc import Sequence

def pub_commands(messages: Sequence[tuple[str, bytes]]) -> bytes | None: ...

def parse(buf: bytes, pos: int, batches: dict[str, list[object]], line_max: int,
          payload_max: int, headers_max: int, msg_id_block: bytes, msg_id_key: str
          ) -> tuple[int, int, bool]: ...
