"""pysyncobj, imported once and repaired.

Its `win_inet_pton` module (imported by its TCP transport) replaces `socket.inet_ntop` with a
Windows-only implementation on every OS, which breaks `inet_ntop` for the whole process. The
real one is put back right after the import; everything else is re-exported unchanged.

`RoutedNode` is a partner known by its own Raft address (its identity, which it announces when
it connects) but dialled at another address: a relay or proxy in between.
"""

import socket

_inet_ntop = socket.inet_ntop
from pysyncobj import (  # noqa: E402
    FAIL_REASON,
    HAS_CRYPTO,
    SyncObj,
    SyncObjConf,
    SyncObjConsumer,
    replicated,
)
from pysyncobj.node import TCPNode  # noqa: E402

socket.inet_ntop = _inet_ntop



class RoutedNode(TCPNode):
    """A partner whose identity is `address` but which is reached at `dial` ("host:port")."""

    def __init__(self, address: str, dial: str) -> None:
        super().__init__(address)
        host, _, port = dial.rpartition(":")
        self._dial_host = host
        self._dial_port = int(port)

    @property
    def ip(self) -> str:
        return self._dial_host

    @property
    def port(self) -> int:
        return self._dial_port


__all__ = ["FAIL_REASON", "HAS_CRYPTO", "RoutedNode", "SyncObj", "SyncObjConf",
           "SyncObjConsumer", "replicated"]
