"""Metadata commands as plain data, for the Raft log and the dump.

The Raft log and the dump hold plain data (type name + JSON-compatible fields), not pickled
Jetstream classes, so that renaming a class or a module does not make an old journal
unreadable. Every broker of a group must know the same commands: an unknown type is a
ProtocolError. Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from jetstream.datastreams import commands as ds
from jetstream.errors import ProtocolError
from jetstream.raft_meta.fsm import (
    BATCH_ITEMS_MAX,
    AddAcls,
    ChangeIsr,
    ChangeIsrs,
    ChangeLeader,
    ChangeLeaders,
    Command,
    ControlledShutdown,
    CreateStream,
    DeleteStream,
    RegisterBroker,
    RemoveAcls,
    UpdateStream,
)
from jetstream.raft_meta.model import BrokerInfo, StreamConfig
from jetstream.security.acl import AclEntry


def encode_command(command: Command) -> dict[str, Any]:
    """The plain-data form of a command (JSON-compatible)."""
    match command:
        case RegisterBroker(broker=broker):
            return {"type": "RegisterBroker", "broker": broker.to_dict()}
        case ControlledShutdown(broker=broker, active=active):
            return {"type": "ControlledShutdown", "broker": broker, "active": active}
        case CreateStream(config=config, live=live):
            return {"type": "CreateStream", "config": config.to_dict(),
                    "live": None if live is None else list(live)}
        case DeleteStream(name=name):
            return {"type": "DeleteStream", "name": name}
        case UpdateStream(name=name, changes=changes):
            return {"type": "UpdateStream", "name": name, "changes": dict(changes)}
        case ChangeLeader(stream=stream, partition=partition, expected_epoch=epoch,
                          leader=leader):
            return {"type": "ChangeLeader", "stream": stream, "partition": partition,
                    "expected_epoch": epoch, "leader": leader}
        case ChangeIsr(stream=stream, partition=partition, expected_epoch=epoch, isr=isr):
            return {"type": "ChangeIsr", "stream": stream, "partition": partition,
                    "expected_epoch": epoch, "isr": list(isr)}
        case ChangeLeaders(items=items) | ChangeIsrs(items=items):
            return {"type": type(command).__name__,
                    "items": [encode_command(item) for item in items]}
        case AddAcls(entries=entries) | RemoveAcls(entries=entries):
            return {"type": type(command).__name__, "acls": [e.to_dict() for e in entries]}
        case ds.CreateDatastream() | ds.DeleteDatastream() | ds.PauseDatastream() \
                | ds.AssignTasks() | ds.RenewTaskEpoch() | ds.DrainTasks() \
                | ds.UpdateDatastreams():
            return ds.encode(command)
    raise TypeError(f"not a metadata command: {command!r}")


def decode_command(data: Mapping[str, Any]) -> Command:
    """The command `encode_command` encoded. Raises ProtocolError for an unknown type (a
    newer broker's command: every broker of a group must know the same commands)."""
    kind = data.get("type")
    if kind == "RegisterBroker":
        return RegisterBroker(BrokerInfo(**data["broker"]))
    if kind == "ControlledShutdown":
        return ControlledShutdown(int(data["broker"]), bool(data["active"]))
    if kind == "CreateStream":
        live = data.get("live")  # absent in journals written before it
        return CreateStream(StreamConfig.from_dict(data["config"]),
                            None if live is None else tuple(int(b) for b in live))
    if kind == "DeleteStream":
        return DeleteStream(data["name"])
    if kind == "UpdateStream":
        return UpdateStream(data["name"], dict(data["changes"]))
    if kind == "ChangeLeader":
        return ChangeLeader(data["stream"], data["partition"], data["expected_epoch"],
                            data["leader"])
    if kind == "ChangeIsr":
        return ChangeIsr(data["stream"], data["partition"], data["expected_epoch"],
                         tuple(data["isr"]))
    if kind == "ChangeLeaders":
        return ChangeLeaders(_decode_items(data, ChangeLeader))
    if kind == "ChangeIsrs":
        return ChangeIsrs(_decode_items(data, ChangeIsr))
    if kind in ("AddAcls", "RemoveAcls"):
        entries = tuple(AclEntry.from_dict(e) for e in data["acls"])
        return AddAcls(entries) if kind == "AddAcls" else RemoveAcls(entries)
    datastream_command = ds.decode(data)
    if datastream_command is not None:
        return datastream_command
    raise ProtocolError(f"unknown metadata command type {kind!r}", field="type")


_Item = TypeVar("_Item", ChangeLeader, ChangeIsr)


def _decode_items(data: Mapping[str, Any], item_type: type[_Item]) -> tuple[_Item, ...]:
    """The items of a batch command: at most BATCH_ITEMS_MAX, each of `item_type`."""
    items = data["items"]
    if len(items) > BATCH_ITEMS_MAX:
        raise ProtocolError(f"a batch holds at most {BATCH_ITEMS_MAX} items", field="items")
    out = []
    for item in items:
        decoded = decode_command(item)
        if not isinstance(decoded, item_type):
            raise ProtocolError(f"a batch of {item_type.__name__} holds {decoded!r}",
                                field="items")
        out.append(decoded)
    return tuple(out)
