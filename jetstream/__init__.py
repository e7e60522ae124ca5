"""Jetstream: a replicated commit log for NATS.

`jetstream.connect(...)` and the client's types (`Start`, `Message`, ...) are imported from
jetstream.client on first use, so `import jetstream` stays cheap for the broker and the CLI.
Type checkers read them from jetstream.client directly, so `jetstream.connect` is typed for
users too (the package ships py.typed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jetstream.client import (
        Ack,
        AckPolicy,
        BrokerInfo,
        Client,
        FetchResult,
        Message,
        PartitionInfo,
        PublishMessage,
        Start,
        StreamInfo,
        Subscription,
        connect,
    )

__all__ = [
    "Ack", "AckPolicy", "BrokerInfo", "Client", "FetchResult", "Message", "PartitionInfo",
    "PublishMessage", "Start", "StreamInfo", "Subscription", "connect",
]
_CLIENT_NAMES = frozenset(__all__)


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        from jetstream import client

        return getattr(client, name)
    raise AttributeError(f"module 'jetstream' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _CLIENT_NAMES)
