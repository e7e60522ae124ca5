"""What one applied metadata command touched: the partitions a broker must look at again.

Theory of operation: every broker reconciles its roles after each metadata command, and that
work must grow with what the command changed, not with the number of streams. `touched`
maps a command and its result (as the state machine, jetstream.raft_meta.fsm, returned it)
to the partitions it may have changed: a stream's create, delete or update touches that
stream's partitions, a leader or ISR change its partition, a batch the items it applied, a
broker's shutdown mark coming off the partitions it leads (followers wait for that).
A broker registering (rare: once per start) and a state loaded whole (`StateRestored`: a
snapshot replaced it) touch everything. Pure: no IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jetstream.datastreams import commands as ds
from jetstream.raft_meta.fsm import (
    AddAcls,
    ChangeIsr,
    ChangeIsrs,
    ChangeLeader,
    ChangeLeaders,
    Command,
    ControlledShutdown,
    Created,
    CreateStream,
    DeleteStream,
    RegisterBroker,
    RemoveAcls,
    ShutdownMark,
    UpdateStream,
)
from jetstream.raft_meta.model import PartitionState, StreamConfig

#: (stream, partition)
Key = tuple[str, int]
#: Most partitions kept dirty one by one; past it the next reconcile looks at everything.
DIRTY_KEYS_MAX = 100_000


@dataclass(frozen=True, slots=True)
class StateRestored:
    """Not a command: what listeners receive (with result None) when the state was replaced
    whole from a snapshot instead of command by command. Reconcile everything from `.state`."""

    version: int


@dataclass(frozen=True, slots=True)
class Touched:
    """The partitions a command may have changed (`everything`: any of them), and whether
    the set of streams changed (a create or a delete)."""

    keys: frozenset[Key] = frozenset()
    everything: bool = False
    streams_changed: bool = False


EVERYTHING = Touched(everything=True, streams_changed=True)
#: What an ACL change touches: no partition.
NOTHING = Touched()


def stream_keys(config: StreamConfig) -> frozenset[Key]:
    return frozenset((config.name, p) for p in range(config.partitions))


def touched(command: Command | StateRestored, result: Any) -> Touched:
    """What `command`, applied with `result`, touched (see the module docstring)."""
    match command:
        case CreateStream():
            assert isinstance(result, Created), result
            return Touched(stream_keys(result.config), streams_changed=not result.existed)
        case DeleteStream():
            assert isinstance(result, StreamConfig), result
            return Touched(stream_keys(result), streams_changed=True)
        case UpdateStream():
            assert isinstance(result, StreamConfig), result
            return Touched(stream_keys(result))
        case ChangeLeader(stream=stream, partition=partition) | ChangeIsr(
                stream=stream, partition=partition):
            return Touched(frozenset({(stream, partition)}))
        case ChangeLeaders() | ChangeIsrs():
            return Touched(frozenset((s.stream, s.partition) for s in result
                                     if isinstance(s, PartitionState)))
        case RegisterBroker() | StateRestored():
            return EVERYTHING
        case ControlledShutdown():
            assert isinstance(result, ShutdownMark), result
            return Touched(result.led)
        case AddAcls() | RemoveAcls():
            return NOTHING
        case ds.CreateDatastream() | ds.DeleteDatastream() | ds.PauseDatastream() \
                | ds.AssignTasks() | ds.RenewTaskEpoch() | ds.DrainTasks() \
                | ds.UpdateDatastreams():
            return Touched()  # no partition: the datastream runner watches its own
    raise TypeError(f"not a metadata command: {command!r}")


class Dirty:
    """Partitions touched since they were last reconciled: commands that arrive while a
    reconcile runs are coalesced into the next one."""

    def __init__(self) -> None:
        self.keys: set[Key] = set()
        self.everything = False

    def __bool__(self) -> bool:
        return self.everything or bool(self.keys)

    def add(self, change: Touched) -> None:
        if change.everything:
            self.everything = True
            self.keys.clear()
        elif not self.everything:
            self.keys |= change.keys
            if len(self.keys) > DIRTY_KEYS_MAX:
                self.add(EVERYTHING)

    def take(self) -> Touched:
        """What is dirty now, leaving nothing dirty."""
        taken = EVERYTHING if self.everything else Touched(frozenset(self.keys))
        self.keys, self.everything = set(), False
        return taken
