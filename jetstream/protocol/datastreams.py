"""The socket API's datastream management: one op, DATASTREAMS, whose `action` names what
to do (Brooklin's Datastream Management Service as one request type).

Theory of operation: any broker answers; changes are proposed to the metadata (Raft) from
there, reads answer from the broker's copy of the metadata (and, for `diagnostics`, from
every broker running a task of the datastream). Bodies are JSON-compatible maps.

    op           request header                       response header
    DATASTREAMS  action, name, body: {str: any}       result: {str: any}

Actions: create (body: the definition), get, list, delete, pause and resume (body:
`partitions`, optional), diagnostics, tasks (this broker's running tasks), update (body: the
changes), batch_get (body: `names`), batch_update (body: `datastreams`, each {name, ...changes};
all or none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from jetstream.protocol.base import Request, Response
from jetstream.protocol.fields import bad, check_str
from jetstream.protocol.frames import Op

ACTIONS = ("create", "get", "list", "delete", "pause", "resume", "diagnostics", "tasks",
           "update", "batch_get", "batch_update")
NAME_CHARS_MAX = 64


@dataclass(frozen=True, slots=True)
class DatastreamResponse(Response):
    result: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.result, dict):
            raise bad("result", "must be a map")


@dataclass(frozen=True, slots=True)
class DatastreamRequest(Request):
    op: ClassVar[Op] = Op.DATASTREAMS
    response_type: ClassVar[type[Response]] = DatastreamResponse
    action: str
    name: str = ""
    body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise bad("action", f"must be one of {list(ACTIONS)}, got {self.action!r}")
        check_str("name", self.name, NAME_CHARS_MAX)
        if not isinstance(self.body, dict):
            raise bad("body", "must be a map")


REQUESTS: tuple[type[Request], ...] = (DatastreamRequest,)
