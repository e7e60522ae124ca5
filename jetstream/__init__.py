"""Jetstream: a replicated commit log for NATS.

`jetstream.connect(...)` and the client's types (`Start`, `Message`, ...) are imported from
jetstream.client on first use, so `import jetstream` stays cheap for the broker and the CLI.
"""

from __future__ import annotations

from typing import Any

_CLIENT_NAMES = frozenset({
    "Ack", "AckPolicy", "BrokerInfo", "Client", "FetchResult", "Message", "PartitionInfo",
    "PublishMessage", "Start", "StreamInfo", "Subscription", "connect",
})


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        from jetstream import client

        return getattr(client, name)
    raise AttributeError(f"module 'jetstream' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _CLIENT_NAMES)
