"""Metadata for a single broker: the state machine applied in process, persisted to a file.

This is the same interface the Raft-backed metadata offers (propose a command, read the
state, be told of changes), so the broker does not know which one it runs on. Each applied
command is persisted (atomic write of the whole state) before its result is returned.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jetstream.raft_meta.fsm import Command, MetadataState
from jetstream.stream.checkpoint import write_atomic
from jetstream.stream.reserve import DiskReserve

FILE_NAME = "metadata.json"

Listener = Callable[[Command, Any], None]


class LocalMetadata:
    def __init__(self, directory: Path, reserve: DiskReserve | None = None) -> None:
        self._path = directory / FILE_NAME
        #: On a full disk the metadata is written into the reserve's room (deleting a stream
        #: must work then: it is how space is freed).
        self._reserve = reserve
        directory.mkdir(parents=True, exist_ok=True)
        if self._path.exists():
            self.state = MetadataState.from_dict(json.loads(self._path.read_text()))
        else:
            self.state = MetadataState()
        self._listeners: list[Listener] = []

    @property
    def is_leader(self) -> bool:
        return True

    def add_listener(self, listener: Listener) -> None:
        """`listener(command, result)` runs after each applied command."""
        self._listeners.append(listener)

    async def propose(self, command: Command) -> Any:
        """Apply `command`; its JetstreamError propagates with the state unchanged. The new
        state is on disk before anyone sees it."""
        candidate = MetadataState.from_dict(self.state.to_dict())
        result = candidate.apply(command)
        data = json.dumps(candidate.to_dict(), indent=1).encode()
        if self._reserve is None:
            write_atomic(self._path, data)
        else:
            self._reserve.write(lambda: write_atomic(self._path, data))
        self.state = candidate
        for listener in self._listeners:
            listener(command, result)
        return result
