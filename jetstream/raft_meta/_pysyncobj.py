"""pysyncobj, imported once and repaired.

Its `win_inet_pton` module (imported by its TCP transport) replaces `socket.inet_ntop` with a
Windows-only implementation on every OS, which breaks `inet_ntop` for the whole process. The
real one is put back right after the import; everything else is re-exported unchanged.

Its journal is a file that grows by doubling and is written through mmap. Growing it only
sets the file's size, so a write to a new page on a full disk kills the process (SIGBUS: the
filesystem cannot give the page a block). `AllocatedFile` replaces it: blocks are allocated
(posix_fallocate) before the pages are written, so running out of room is an OSError
(ENOSPC), and the writes that follow land in blocks the file already holds. When it runs out,
the room maker registered for the journal's directory (`make_room_for`: the broker releases
its disk reserve) frees some and the allocation is tried once more; the journal's small
meta file (commit index, term, vote) is written the same way. A broker on a full disk thus
still takes the metadata entries that let it free space (deleting a stream).

`SafeSyncObj` follows Raft where pysyncobj does not: on AppendEntries it deletes log entries
only from the first one that conflicts, never entries that match (jetstream.raft_meta.append_rule).

`RoutedNode` is a partner known by its own Raft address (its identity, which it announces when
it connects) but dialled at another address: a relay or proxy in between.
"""

import errno
import logging
import mmap
import os
import socket
from collections.abc import Callable
from typing import Any

_inet_ntop = socket.inet_ntop
from pysyncobj import (  # noqa: E402
    FAIL_REASON,
    HAS_CRYPTO,
    SyncObj,
    SyncObjConf,
    SyncObjConsumer,
    replicated,
)
from pysyncobj import journal as _journal  # noqa: E402
from pysyncobj.node import TCPNode  # noqa: E402

socket.inet_ntop = _inet_ntop

from jetstream.raft_meta.append_rule import plan_append  # noqa: E402

log = logging.getLogger(__name__)
#: What a write that ran out of room fails with (as jetstream.stream.checkpoint's).
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: Per journal directory: frees room on its disk; whether it freed any.
_ROOM_MAKERS: dict[str, Callable[[], bool]] = {}


def make_room_for(directory: str, make_room: Callable[[], bool] | None) -> None:
    """Call `make_room` when the journal in `directory` runs out of room (None: forget)."""
    key = os.path.abspath(directory)
    if make_room is None:
        _ROOM_MAKERS.pop(key, None)
    else:
        _ROOM_MAKERS[key] = make_room


def _with_room(path: str, write: Callable[[], None]) -> None:
    """`write()`, and once more after the room maker of `path`'s directory freed room, if it
    ran out."""
    try:
        write()
    except OSError as exc:
        make_room = _ROOM_MAKERS.get(os.path.dirname(os.path.abspath(path)))
        if exc.errno not in _NO_ROOM or make_room is None or not make_room():
            raise
        log.warning("metadata journal %s: no room (%s): room freed, trying again", path,
                    exc.strerror)
        write()


class AllocatedFile:
    """pysyncobj's ResizableFile (same interface) with its blocks allocated before they are
    written through the mmap (see the module docstring)."""

    def __init__(self, fileName: str, initialSize: int = 1024, resizeFactor: float = 2.0,
                 defaultContent: bytes | None = None) -> None:
        self._path = fileName
        self._factor = resizeFactor
        if not os.path.exists(fileName):
            with open(fileName, "wb") as f:
                if defaultContent is not None:
                    f.write(defaultContent)
        self._file = open(fileName, "r+b")  # noqa: SIM115 (held until _destroy)
        size = max(os.fstat(self._file.fileno()).st_size, initialSize)
        try:  # a file an older version left sparse gets its blocks too, if there is room
            self._allocate(size)
        except OSError as exc:
            if exc.errno not in _NO_ROOM:
                raise
            log.warning("metadata journal %s: no room to allocate it whole: %s", fileName,
                        exc.strerror)
            self._file.truncate(size)
        self._mm = mmap.mmap(self._file.fileno(), 0)

    def _allocate(self, size: int) -> None:
        fd = self._file.fileno()
        _with_room(self._path, lambda: os.posix_fallocate(fd, 0, size))

    def write(self, offset: int, values: bytes) -> None:
        end = offset + len(values)
        if end > self._mm.size():
            size = max(int(self._mm.size() * self._factor), end)
            self._allocate(size)  # raises, with nothing written, when there is no room
            self._mm.close()
            self._mm = mmap.mmap(self._file.fileno(), 0)
        self._mm[offset:end] = values

    def read(self, offset: int, size: int) -> bytes:
        return self._mm[offset:offset + size]

    def flush(self) -> None:
        self._mm.flush()

    def _destroy(self) -> None:
        self._mm.flush()
        self._mm.close()
        self._file.close()


class _MetaStorer(_journal.MetaStorer):
    """The journal's meta file, stored with room made for it when there is none."""

    def storeMeta(self, meta: Any) -> None:
        _with_room(self.getPath(), lambda: super(_MetaStorer, self).storeMeta(meta))


# FileJournal looks both names up in its module each time it opens a journal.
_journal.ResizableFile = AllocatedFile  # type: ignore[misc, assignment]
_journal.MetaStorer = _MetaStorer  # type: ignore[misc]


class SafeSyncObj(SyncObj):
    """SyncObj whose followers keep the entries of a stale or repeated AppendEntries that
    match (see the module docstring). pysyncobj binds its transport's message callback to
    this name, so every message passes here first."""

    def _SyncObj__onMessageReceived(self, node: Any, message: dict[str, Any]) -> None:
        core: Any = self  # pysyncobj's private state, by its mangled names
        handle = getattr(super(), "_SyncObj__onMessageReceived")  # noqa: B009
        if (message.get("type") != "append_entries" or "prevLogIdx" not in message
                or message.get("transmission") is not None
                or message["term"] < core._SyncObj__raftCurrentTerm):
            handle(node, message)
            return
        journal = core._SyncObj__raftLog
        first = journal[0][1]

        def term_at(index: int) -> int | None:
            at = index - first
            return int(journal[at][2]) if 0 <= at < len(journal) else None

        plan = plan_append(message["prevLogIdx"], message["prevLogTerm"],
                           message.get("entries", []), term_at, journal[-1][1])
        if plan is None:
            handle(node, message)
        elif not plan.keep_tail:
            handle(node, {**message, "prevLogIdx": plan.prev_index,
                          "prevLogTerm": plan.prev_term, "entries": list(plan.entries)})
        else:  # leader and term bookkeeping only; then answer that the log matches so far
            bare = {k: v for k, v in message.items()
                    if k not in ("prevLogIdx", "prevLogTerm", "entries", "serialized")}
            bare["commit_index"] = min(message["commit_index"], plan.prev_index)
            handle(node, bare)
            core._SyncObj__sendNextNodeIdx(node, nextNodeIdx=plan.prev_index + 1, success=True)


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


__all__ = ["FAIL_REASON", "HAS_CRYPTO", "AllocatedFile", "RoutedNode", "SafeSyncObj",
           "SyncObj",
           "SyncObjConf", "SyncObjConsumer", "make_room_for", "replicated"]
