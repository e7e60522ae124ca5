"""What an update of a datastream may change, and how a change applies to a definition.

Theory of operation: an update is a partial definition. Options (`max_tasks`,
`batch_records_max`, `in_flight_max`, `labels`) replace the current ones; `source` and
`destination` carry `settings` merged key by key into the current ones (a setting given as
null is removed), so an operator rotates one setting (another broker list, a NATS URL, a
roll size) without restating the rest. The result is a whole definition, checked like a new
one (jetstream.datastreams.model, then the connectors' own checks).

Some fields are the datastream's identity and never change (FIXED): its name, the connector
and transport types, the partition mapping, and the settings that say *which* data it moves
(`stream`, `selector`, `path`): the checkpoints, the destination's message ids and the sink's
files all belong to them. Changing one is refused with INVALID_DATASTREAM_CONFIG naming the
field; delete the datastream and create another instead.

Pure: no IO. The state machine checks FIXED again when it applies the command (a definition
may have changed between the check and the commit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jetstream.datastreams.model import DatastreamConfig, check_name
from jetstream.errors import InvalidDatastreamConfig

#: Top-level fields an update may carry (besides `name`, which says which datastream).
OPTIONS = ("max_tasks", "batch_records_max", "in_flight_max", "labels",
           "rate_limit_records_per_s")
#: Settings (of a source or a destination, whatever its type) that never change.
FIXED_SETTINGS = ("stream", "selector", "path")
#: The most datastreams one batch request names.
BATCH_MAX = 100


def merged(config: DatastreamConfig, changes: Mapping[str, Any]) -> DatastreamConfig:
    """`config` with `changes` applied; InvalidDatastreamConfig (with its `field`) for a
    change that is malformed or touches a fixed field."""
    if not isinstance(changes, Mapping):
        raise InvalidDatastreamConfig("an update is a map of fields", field="")
    data = config.to_dict()
    for key, value in changes.items():
        if key == "name":
            if value != config.name:
                raise _fixed("name")
        elif key in OPTIONS:
            data[key] = value
        elif key in ("source", "destination"):
            data[key] = _endpoint(data[key], value, key)
        elif key == "partition_mapping":
            if value != config.partition_mapping.value:
                raise _fixed("partition_mapping")
        else:
            raise InvalidDatastreamConfig(
                f"unknown datastream field {key!r} (an update may change {list(OPTIONS)}, "
                f"source.settings, destination.settings)", field=key)
    new = DatastreamConfig.from_dict(data)
    check_fixed(config, new)
    return new


def _endpoint(current: dict[str, Any], change: object, what: str) -> dict[str, Any]:
    if not isinstance(change, Mapping) or set(change) - {"type", "settings"}:
        raise InvalidDatastreamConfig(f"{what} must be {{settings}} (and its unchanged type)",
                                      field=what)
    if change.get("type", current["type"]) != current["type"]:
        raise _fixed(f"{what}.type")
    settings = change.get("settings") or {}
    if not isinstance(settings, Mapping):
        raise InvalidDatastreamConfig(f"{what}.settings must be a map", field=f"{what}.settings")
    merged_settings = dict(current["settings"])
    for key, value in settings.items():
        if value is None:
            merged_settings.pop(key, None)
        else:
            merged_settings[key] = value
    return {"type": current["type"], "settings": merged_settings}


def check_fixed(old: DatastreamConfig, new: DatastreamConfig) -> None:
    """Raise InvalidDatastreamConfig naming the first fixed field `new` changes."""
    pairs: list[tuple[str, object, object]] = [
        ("name", old.name, new.name),
        ("partition_mapping", old.partition_mapping, new.partition_mapping),
        ("source.type", old.source.type, new.source.type),
        ("destination.type", old.destination.type, new.destination.type)]
    for what, before, after in (("source", old.source, new.source),
                                ("destination", old.destination, new.destination)):
        pairs += [(f"{what}.settings.{key}", before.settings.get(key), after.settings.get(key))
                  for key in FIXED_SETTINGS]
    for field_name, before_value, after_value in pairs:
        if before_value != after_value:
            raise _fixed(field_name)


def _fixed(field_name: str) -> InvalidDatastreamConfig:
    return InvalidDatastreamConfig(
        f"{field_name} of a datastream cannot change (delete it and create another)",
        field=field_name)


def batch_names(body: Mapping[str, Any]) -> list[str]:
    """The names of a batch get: `{"names": [...]}`, at most BATCH_MAX, each checked."""
    names = body.get("names")
    if not isinstance(names, list) or not 1 <= len(names) <= BATCH_MAX:
        raise InvalidDatastreamConfig(f"names must be a list of 1 to {BATCH_MAX} datastream "
                                      "names", field="names")
    return [check_name(n, "names") for n in dict.fromkeys(names)]


def batch_updates(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The updates of a batch update: `{"datastreams": [{name, ...changes}, ...]}`, at most
    BATCH_MAX, each naming a different datastream."""
    updates = body.get("datastreams")
    if not isinstance(updates, list) or not 1 <= len(updates) <= BATCH_MAX \
            or not all(isinstance(u, dict) for u in updates):
        raise InvalidDatastreamConfig(f"datastreams must be a list of 1 to {BATCH_MAX} "
                                      "updates, each {name, ...changes}", field="datastreams")
    names = [check_name(u.get("name"), "datastreams.name") for u in updates]
    if len(set(names)) != len(names):
        raise InvalidDatastreamConfig("a batch update names each datastream once",
                                      field="datastreams.name")
    return [dict(u) for u in updates]
