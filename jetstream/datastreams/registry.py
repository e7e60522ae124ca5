"""The connectors (sources) and transports (destinations) a datastream may name.

Adding one is one module implementing jetstream.datastreams.connector's protocols and one
line here. Settings are checked when a datastream is created (`check`), before anything is
committed, so a bad definition is refused with INVALID_DATASTREAM_CONFIG and an unknown type
with UNKNOWN_CONNECTOR.
"""

from __future__ import annotations

from collections.abc import Mapping

from jetstream.datastreams import batch_copy, selector
from jetstream.datastreams.connector import DestinationTransport, SourceConnector
from jetstream.datastreams.jetstream_stream import JetstreamDestination, JetstreamSource
from jetstream.datastreams.model import DatastreamConfig
from jetstream.datastreams.nats_jetstream import NatsJetstreamSource
from jetstream.datastreams.nats_subject import NatsSubjectDestination
from jetstream.datastreams.parquet_sink import ParquetSink
from jetstream.errors import UnknownConnector

SOURCES: Mapping[str, SourceConnector] = {
    "jetstream": JetstreamSource(),
    "nats_jetstream": NatsJetstreamSource(),
}
DESTINATIONS: Mapping[str, DestinationTransport] = {
    "jetstream": JetstreamDestination(),
    "parquet": ParquetSink(),
    "nats_subject": NatsSubjectDestination(),
}


def source(name: str) -> SourceConnector:
    found = SOURCES.get(name)
    if found is None:
        raise UnknownConnector("source connector", name, sorted(SOURCES))
    return found


def destination(name: str) -> DestinationTransport:
    found = DESTINATIONS.get(name)
    if found is None:
        raise UnknownConnector("destination transport", name, sorted(DESTINATIONS))
    return found


def check(config: DatastreamConfig) -> None:
    """Raise UnknownConnector or InvalidDatastreamConfig for a definition no broker could
    run."""
    if selector.is_selector(config):
        config = selector.check(config)
    batch_copy.check(config)
    source(config.source.type).check(config.source.settings)
    destination(config.destination.type).check(config.destination.settings)
