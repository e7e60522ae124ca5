"""The Python client of Jetstream: asyncio first (`connect`), with a sync facade
(`jetstream.client.sync.connect`) for scripts.

    async with jetstream.connect("127.0.0.1:4300") as js:
        await js.create_stream("orders", "orders.*")
        ack = await js.publish("orders.new", b"hello")
        async for message in js.subscribe("orders", stop="latest"):
            print(message.offset, message.value)
"""

from jetstream.client.client import Client, connect, parse_brokers
from jetstream.client.connection import BrokerConnection
from jetstream.client.kv import Entry
from jetstream.client.subscription import Subscription
from jetstream.client.types import (
    Ack,
    AckPolicy,
    BrokerInfo,
    FetchResult,
    Message,
    PartitionInfo,
    PublishMessage,
    RawFetch,
    SegmentListing,
    Start,
    StreamInfo,
)

__all__ = [
    "Ack",
    "AckPolicy",
    "BrokerConnection",
    "BrokerInfo",
    "Client",
    "Entry",
    "FetchResult",
    "Message",
    "PartitionInfo",
    "PublishMessage",
    "RawFetch",
    "SegmentListing",
    "Start",
    "StreamInfo",
    "Subscription",
    "connect",
    "parse_brokers",
]
