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


class StreamIsMirror(JetstreamError):
    """The stream is a mirror (its `mirror` setting names the stream it copies): only its
    mirroring datastream writes it. Publish to the source stream, or make this one writable
    with `update_stream(name, mirror=None)` (the datastream then stops with MIRROR_MISMATCH)."""

    code = "STREAM_IS_MIRROR"

    def __init__(self, stream: str, mirror: str) -> None:
        super().__init__(f"stream {stream!r} is a mirror of {mirror!r}: only its datastream "
                         "writes it", stream=stream, mirror=mirror)


class MirrorMismatch(JetstreamError):
    """A mirror copy went to a stream that is not a mirror of that source (not a mirror at
    all, a mirror of another stream, or a different partition count). The datastream stops
    (faulty) until the destination is fixed."""

    code = "MIRROR_MISMATCH"

    def __init__(self, stream: str, mirror: str, wanted: str, reason: str = "") -> None:
        """`mirror`: the stream's setting ("" when it is not a mirror)."""
        what = f"a mirror of {mirror!r}" if mirror else "not a mirror"
        super().__init__(reason or f"stream {stream!r} is {what}, not of {wanted!r}",
                         stream=stream, mirror=mirror, wanted=wanted, reason=reason)


class MirrorOffsetGap(JetstreamError):
    """Copied batches would leave a gap: they start past the destination partition's log end
    offset (records of the source were lost to retention before they were copied, or the
    destination was recreated). Nothing was appended."""

    code = "MIRROR_OFFSET_GAP"

    def __init__(self, stream: str, partition: int, offset: int, log_end_offset: int) -> None:
        super().__init__(f"copy into {stream}/{partition} starts at offset {offset}, past its "
                         f"log end offset {log_end_offset}", stream=stream,
                         partition=partition, offset=offset, log_end_offset=log_end_offset)


class MirrorFenced(JetstreamError):
    """A newer owner (a higher task epoch) of the mirror copy into this partition appended:
    this older one must stop."""

    code = "MIRROR_FENCED"

    def __init__(self, stream: str, partition: int, epoch: int, current_epoch: int) -> None:
        super().__init__(f"mirror copy into {stream}/{partition} at epoch {epoch} is fenced "
                         f"by epoch {current_epoch}", stream=stream, partition=partition,
                         epoch=epoch, current_epoch=current_epoch)
