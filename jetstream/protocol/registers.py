"""Messages about a partition's registers: the Gazette-style labels that appends check
(`check_registers`) and change (`union_registers`, `subtract_registers`) with their data.

Theory of operation: REGISTERS goes to a partition's leader, which answers the registers its
guard holds (jetstream.idempotence.guard): those of every record appended so far, the newest
ones possibly not yet committed — the registers the next publish's check is judged against.
A leader still rebuilding its guard from its log answers NOT_LEADER (retriable).

    op         request header         response header
    REGISTERS  stream, partition      stream, partition, broker_id, registers: {str: str}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from jetstream.errors import InvalidStreamConfig, ProtocolError
from jetstream.protocol.base import Request, Response
from jetstream.protocol.fields import (
    BROKER_ID_MAX,
    PARTITION_MAX,
    check_int,
    check_stream,
)
from jetstream.protocol.frames import Op
from jetstream.protocol.names import check_labels


@dataclass(frozen=True, slots=True)
class RegistersResponse(Response):
    stream: str
    partition: int
    broker_id: int
    registers: dict[str, str]

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)
        check_int("broker_id", self.broker_id, 0, BROKER_ID_MAX)
        try:
            check_labels(self.registers, "registers")
        except InvalidStreamConfig as exc:
            raise ProtocolError(str(exc), field="registers") from None


@dataclass(frozen=True, slots=True)
class RegistersRequest(Request):
    """The partition's registers, at its leader."""

    op: ClassVar[Op] = Op.REGISTERS
    response_type: ClassVar[type[Response]] = RegistersResponse
    stream: str
    partition: int

    def __post_init__(self) -> None:
        check_stream(self.stream)
        check_int("partition", self.partition, 0, PARTITION_MAX)


#: The requests of this module, for the codec's registry.
REQUESTS: tuple[type[Request], ...] = (RegistersRequest,)
