"""Datastreams: definitions and connectors."""

from __future__ import annotations

from jetstream.errors.base import InvalidConfig, JetstreamError


class UnknownDatastream(JetstreamError):
    """No datastream of this name exists. List them (`GET /datastreams`)."""

    code = "UNKNOWN_DATASTREAM"

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown datastream {name!r}", name=name)


class DatastreamExists(JetstreamError):
    """A datastream of this name exists with another definition. Delete it first, or pick
    another name (creating one again with the same definition is a no-op)."""

    code = "DATASTREAM_EXISTS"

    def __init__(self, name: str) -> None:
        super().__init__(f"datastream {name!r} exists with another definition", name=name)


class InvalidDatastreamConfig(InvalidConfig):
    """A datastream definition, or its source's or destination's settings, is invalid;
    `field` names the setting at fault. Fix it and create the datastream again."""

    code = "INVALID_DATASTREAM_CONFIG"


class UnknownConnector(JetstreamError):
    """A datastream names a source connector or destination transport this broker does not
    have. `known` lists those it has."""

    code = "UNKNOWN_CONNECTOR"

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(f"unknown {kind} {name!r} (known: {known})", kind=kind,
                         connector=name, known=known)
