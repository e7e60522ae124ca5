from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pysyncobj.node import Node, TCPNode

_R = TypeVar("_R")

HAS_CRYPTO: bool

class FAIL_REASON:
    SUCCESS: int
    QUEUE_FULL: int
    MISSING_LEADER: int
    DISCARDED: int
    NOT_LEADER: int
    LEADER_CHANGED: int
    REQUEST_DENIED: int
    UNKNOWN_OUTCOME: int

class SyncObjConf:
    # Every option is a keyword argument with a default; see pysyncobj/config.py.
    def __init__(self, **kwargs: Any) -> None: ...

class SyncObjConsumer:
    def __init__(self) -> None: ...

class SyncObj:
    def __init__(self, selfNode: str | Node | None, otherNodes: Sequence[str | Node],
                 conf: SyncObjConf | None = None,
                 consumers: Sequence[SyncObjConsumer] | None = None) -> None: ...
    def waitBinded(self) -> None: ...
    def destroy(self) -> None: ...
    def destroy_synchronous(self) -> None: ...
    def forceLogCompaction(self) -> None: ...
    def getStatus(self) -> dict[str, Any]: ...
    def _doDestroy(self) -> None: ...
    def _isLeader(self) -> bool: ...
    def _getLeader(self) -> TCPNode | None: ...  # with the TCP transport we use

# A replicated method is called with the method's own arguments plus `callback=` (called
# with (result, error) once applied) and `sync=`, which pysyncobj adds at run time.
def replicated(func: Callable[..., _R]) -> Callable[..., _R]: ...
