"""pysyncobj, imported once and repaired.

Its `win_inet_pton` module (imported by its TCP transport) replaces `socket.inet_ntop` with a
Windows-only implementation on every OS, which breaks `inet_ntop` for the whole process. The
real one is put back right after the import; everything else is re-exported unchanged.
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

socket.inet_ntop = _inet_ntop

__all__ = ["FAIL_REASON", "HAS_CRYPTO", "SyncObj", "SyncObjConf", "SyncObjConsumer",
           "replicated"]
