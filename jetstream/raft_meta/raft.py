"""Metadata on Raft: the pure MetadataState, replicated on every broker by pysyncobj.

Theory of operation
-------------------
Every broker runs one `RaftMetadata`: a pysyncobj `SyncObj` whose single consumer,
`_ReplicatedMetadata`, owns a `MetadataState` (jetstream.raft_meta.fsm) and has one replicated
method, `apply(proposal_id, encoded_command)`. It offers the interface of `LocalMetadata`
(`state`, `is_leader`, `add_listener`, `propose`) plus cluster facts (`leader_address`,
`leader_broker_id`, `status()`), so the broker does not know which one it runs on.

Commands flow like this. `propose(command)` runs on the broker's asyncio loop: it encodes the
command as plain data (type name + JSON-like fields, so the Raft log never holds pickled
Jetstream classes), tags it with a fresh proposal id and calls the replicated method. That only
queues the call for pysyncobj's own thread. If this broker leads, the call is appended to its
log; otherwise pysyncobj forwards it to the leader by itself (an `apply_command` message; the
leader answers with the log index, and this broker waits until it has applied that index). Once
a majority holds the entry it is committed, and every broker, on pysyncobj's thread, applies it
in log order: decode, apply to a *copy* of the state (copy on write: the dicts are copied, the
frozen values shared), keep the copy. `MetadataState.apply` refusing a command (a
JetstreamError: StreamExists, StaleMetadataEpoch, ...) is an outcome like any other: it is
returned, never raised out of the replicated method, so every broker records the same outcome
and the state stays untouched; an unexpected exception (an FSM bug) becomes an INTERNAL error
outcome the same way, with the traceback logged. Each outcome then crosses to the loop with
`loop.call_soon_threadsafe`, in log order, where the new state is swapped into `.state`, the
listeners run (`listener(command, result)`, for commands that changed the state) and, on the
proposing broker, the `propose` call returns the result or raises the error. So when
`propose` returns, `.state` and every listener of this broker already reflect the command.
Nothing on the loop ever reads an object pysyncobj's thread still writes: `.state` is an
object that thread has finished with.

Failures of pysyncobj (no leader, leadership moved, entry discarded by a new leader, queue
full) come back to `propose` through the call's callback. Leadership failures are retried
inside `propose` with a short backoff until its timeout, and a proposal with no answer at all
is resent every `propose_resend_ms` (a message to a leader whose connection just dropped is
lost silently). Retrying is safe because the replicated state remembers the last
`PROPOSALS_REMEMBERED` proposal ids: a copy of a proposal that was already applied is skipped
on every broker alike. What is left raises `MetadataUnavailable` (retriable; after "timeout"
the command may still be applied later).

Threads: pysyncobj runs one thread per SyncObj (network, timers, applying). Everything in
`_ReplicatedMetadata` runs on it; everything in `RaftMetadata` runs on the loop.

What is persisted, and what is not:
- pysyncobj's journal (`raft.journal`) is an mmap'ed file: each entry is written to it when
  appended, but it is not fsynced (not even msynced) per entry; only closing flushes it. A
  process crash keeps it (the page cache survives), an OS crash or power cut can lose the tail
  of it, and with it entries this broker acknowledged to the leader. The commit index
  (`raft.journal.meta`) is rewritten at most once a second; current term and vote are written
  before votes go out, but not fsynced either. Raft's safety argument assumes these are on
  stable storage: on a machine that can lose power, it holds only as long as a majority of
  brokers does not lose its tail at once. Its blocks are allocated before they are written
  (jetstream.raft_meta._pysyncobj), so a full disk fails a write instead of killing the
  process; with `reserve`, the journal and its meta file then grow into the disk reserve's
  room (released for them), so a broker on a full disk still applies the deletion that
  frees it.
- The full dump (`raft.dump`, pysyncobj's snapshot) is written every `snapshot_entries_min`
  entries or `snapshot_interval_ms`, whichever comes first, and on `request_snapshot()`; the
  journal is then cut to the entries after it. It holds `MetadataState.to_dict()` and the
  remembered proposal ids, as plain data (gzip'ed pickle of dicts and lists). It is written to
  a temporary file and renamed, without fsync. It is written in pysyncobj's thread, not in a
  forked child (`useFork=False`): forking a process that runs an asyncio loop and other threads
  is fragile, and the metadata is small.
- Not persisted: pending proposals (a restart fails them), listeners, the mapping of addresses
  to broker ids.

Restart: a broker that starts on an existing directory loads the dump, then reapplies the
journal up to the commit index it had saved, then follows the leader. That replay goes through
the listeners too: add listeners right after construction, before the first `await`, to see
every applied command. A state loaded whole from a dump (at start, or a snapshot the leader
sends to a broker that fell far behind) is announced to listeners as
`listener(StateRestored(version), None)`: reconcile everything from `.state` then.
`wait_ready()` returns once this broker has applied everything the leader had committed when
it joined.

Trust: pysyncobj unpickles every message it receives. Without a password anyone who can reach
the Raft port can run code in the broker; set `password` (needs the `cryptography` package:
messages are then Fernet-encrypted and authenticated, and a peer with another password is
disconnected before anything it sends is unpickled). The Raft port binds to the host of
`self_address` (pysyncobj alone would bind 0.0.0.0).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jetstream.errors import InvalidConfig, JetstreamError, MetadataUnavailable
from jetstream.raft_meta._pysyncobj import (
    FAIL_REASON,
    HAS_CRYPTO,
    RoutedNode,
    SafeSyncObj,
    SyncObj,
    SyncObjConf,
    SyncObjConsumer,
    make_room_for,
    replicated,
)
from jetstream.raft_meta.changes import StateRestored
from jetstream.raft_meta.codec import decode_command, encode_command
from jetstream.raft_meta.fsm import Command, MetadataState
from jetstream.stream.reserve import DiskReserve
from jetstream.tasks import wait_event

log = logging.getLogger(__name__)

#: pysyncobj's files in the metadata directory (it adds JOURNAL_FILE + ".meta").
JOURNAL_FILE = "raft.journal"
DUMP_FILE = "raft.dump"
#: Proposal ids the replicated state remembers, so that a resent proposal is applied once.
PROPOSALS_REMEMBERED = 4096
#: Version of the dump's payload (our part of it: state and proposal ids).
DUMP_FORMAT = 1
#: A clean stop writes a dump when the journal holds more entries than this, and waits for
#: it this long, looking every COMPACT_POLL_S.
COMPACT_ENTRIES_MIN = 64
COMPACT_WAIT_S = 5.0
COMPACT_POLL_S = 0.02
#: Backoff between retries of a proposal while leadership moves.
RETRY_BACKOFF_MS_MIN = 20
RETRY_BACKOFF_MS_MAX = 200

# pysyncobj failures worth retrying: leadership is moving; with proposal ids deduplicated,
# even an entry that may have been committed ("unknown outcome") is safe to send again.
_RETRIED = {FAIL_REASON.MISSING_LEADER, FAIL_REASON.LEADER_CHANGED, FAIL_REASON.NOT_LEADER,
            FAIL_REASON.DISCARDED, FAIL_REASON.UNKNOWN_OUTCOME}
_REASONS = {
    FAIL_REASON.QUEUE_FULL: "queue_full",
    FAIL_REASON.MISSING_LEADER: "missing_leader",
    FAIL_REASON.DISCARDED: "discarded",
    FAIL_REASON.NOT_LEADER: "not_leader",
    FAIL_REASON.LEADER_CHANGED: "leader_changed",
    FAIL_REASON.REQUEST_DENIED: "request_denied",
    FAIL_REASON.UNKNOWN_OUTCOME: "unknown_outcome",
}
_ROLES = {0: "follower", 1: "candidate", 2: "leader"}  # pysyncobj's _RAFT_STATE
_PARTNER_KEY = "partner_node_status_server_"


Listener = Callable[[Command | StateRestored, Any], None]


@dataclass(frozen=True, slots=True)
class RaftSettings:
    """Timing and limits of the metadata Raft group. The defaults suit brokers on one host or
    a LAN; stretch the timeouts together for slower links."""

    #: A follower that hears no leader for a random time in [min, max] starts an election.
    election_timeout_ms_min: int = 400
    election_timeout_ms_max: int = 1200
    #: The leader's heartbeat (empty append_entries); under a third of the minimum above.
    heartbeat_interval_ms: int = 100
    #: A connection silent this long is dead; at least the maximum election timeout.
    connection_timeout_ms: int = 2000
    #: How often a broker tries again to connect to a partner that is down.
    connection_retry_ms: int = 500
    #: A leader that hears no majority for this long steps down.
    leader_fallback_ms: int = 3000
    #: Batch log entries on a timer (throughput) or send each at once (latency: ~1 ms a
    #: proposal instead of ~100 ms). Metadata changes are rare: latency wins.
    append_entries_batch: bool = False
    #: Queue proposals made while there is no leader (True) or fail them at once (False: then
    #: `propose` retries them itself, and a proposal that timed out cannot linger in a queue
    #: to be applied long after its caller gave up).
    commands_wait_leader: bool = False
    #: Proposals queued in pysyncobj before new ones fail with "queue_full".
    proposals_queued_max: int = 10_000
    #: Resend a proposal that got no answer for this long (safe: copies are deduplicated).
    propose_resend_ms: int = 1000
    #: Write a full dump and cut the journal after this many entries or this long.
    snapshot_entries_min: int = 5000
    snapshot_interval_ms: int = 300_000

    def __post_init__(self) -> None:
        def check(ok: bool, field: str, why: str) -> None:
            if not ok:
                raise InvalidConfig(f"raft setting {field} {why}", field=field)

        check(self.heartbeat_interval_ms > 0, "heartbeat_interval_ms", "must be positive")
        check(self.election_timeout_ms_min > 3 * self.heartbeat_interval_ms,
              "election_timeout_ms_min", "must exceed 3 heartbeat intervals")
        check(self.election_timeout_ms_max > self.election_timeout_ms_min,
              "election_timeout_ms_max", "must exceed election_timeout_ms_min")
        check(self.connection_timeout_ms >= self.election_timeout_ms_max,
              "connection_timeout_ms", "must be at least election_timeout_ms_max")
        check(self.leader_fallback_ms > self.heartbeat_interval_ms, "leader_fallback_ms",
              "must exceed heartbeat_interval_ms")
        check(self.connection_retry_ms >= 0, "connection_retry_ms", "must not be negative")
        check(self.proposals_queued_max > 0, "proposals_queued_max", "must be positive")
        check(self.propose_resend_ms > 0, "propose_resend_ms", "must be positive")
        check(self.snapshot_entries_min >= 2, "snapshot_entries_min", "must be at least 2")
        check(self.snapshot_interval_ms > 0, "snapshot_interval_ms", "must be positive")


# -- the replicated part: pysyncobj's thread only ----------------------------------------------

_DUPLICATE = object()  # outcome of a proposal id that was applied before

Applied = Callable[[str, Command | None, Any, MetadataState | None], None]


class _ReplicatedMetadata(SyncObjConsumer):
    """The state machine as pysyncobj sees it. Every method runs on pysyncobj's thread."""

    def __init__(self, on_applied: Applied, on_restored: Callable[[MetadataState], None]) -> None:
        self._on_applied = on_applied
        self._on_restored = on_restored
        super().__init__()
        # Set after SyncObjConsumer.__init__: pysyncobj treats these as the replicated fields.
        self.state = MetadataState()
        self._recent: deque[str] = deque()
        self._recent_ids: set[str] = set()

    @replicated
    def apply(self, proposal_id: str, encoded: dict[str, Any]) -> Any:
        """Apply one committed proposal. Never raises: every broker must record the same
        outcome, and an exception here would make pysyncobj retry the entry forever."""
        if proposal_id in self._recent_ids:
            self._on_applied(proposal_id, None, _DUPLICATE, None)
            return None
        self._remember(proposal_id)
        command: Command | None = None
        new_state: MetadataState | None = None
        try:
            command = decode_command(encoded)
            candidate = self.state.copy()
            outcome = candidate.apply(command)
        except JetstreamError as exc:
            outcome = exc
        except Exception as exc:  # an FSM bug: keep the log moving, the same way everywhere
            log.exception("metadata command %r failed", encoded)
            outcome = JetstreamError(f"metadata command failed: {exc!r}")
        else:
            self.state = new_state = candidate
        self._on_applied(proposal_id, command, outcome, new_state)
        return None  # the outcome travels through _on_applied

    def _remember(self, proposal_id: str) -> None:
        if len(self._recent) >= PROPOSALS_REMEMBERED:
            self._recent_ids.discard(self._recent.popleft())
        self._recent.append(proposal_id)
        self._recent_ids.add(proposal_id)

    # pysyncobj calls these two to write and to load its full dump.

    def _serialize(self) -> dict[str, Any]:
        return {"format": DUMP_FORMAT, "state": self.state.to_dict(),
                "proposals": list(self._recent)}

    def _deserialize(self, data: Mapping[str, Any]) -> None:
        if data.get("format") != DUMP_FORMAT:
            raise ValueError(f"metadata dump format {data.get('format')!r} is not "
                             f"{DUMP_FORMAT}")
        self.state = MetadataState.from_dict(data["state"])
        self._recent = deque(data["proposals"])
        self._recent_ids = set(self._recent)
        self._on_restored(self.state)


# -- the broker's side: the asyncio loop only --------------------------------------------------


class RaftMetadata:
    """Metadata replicated by Raft among the brokers of a cluster (see the module docstring).

    `self_address` and `partner_addresses` are the Raft addresses ("host:port") of this broker
    and of the others; `broker_ids` maps each Raft address to its broker id (this broker's is
    added); `routes` maps a partner's Raft address to the address it is dialled at, when a
    relay sits in between (its identity stays its own address). Construct it on the loop it
    should call back on (or pass `loop`).
    """

    def __init__(self, directory: Path, self_address: str, partner_addresses: Sequence[str], *,
                 broker_id: int, broker_ids: Mapping[str, int] | None = None,
                 password: str | None = None, loop: asyncio.AbstractEventLoop | None = None,
                 settings: RaftSettings | None = None,
                 routes: Mapping[str, str] | None = None,
                 reserve: DiskReserve | None = None) -> None:
        if password is not None and not password:
            raise InvalidConfig("the metadata password must not be empty", field="password")
        if password is not None and not HAS_CRYPTO:
            raise InvalidConfig("a metadata password needs the 'cryptography' package "
                                "(pip install cryptography)", field="password")
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self.settings = settings if settings is not None else RaftSettings()
        self.directory = directory
        self.address = self_address
        self.broker_id = broker_id
        self._broker_ids = {**(broker_ids or {}), self_address: broker_id}
        self._state = MetadataState()
        self._listeners: list[Listener] = []
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._ready = asyncio.Event()
        self._closed = False
        directory.mkdir(parents=True, exist_ok=True)
        # On a full disk the journal grows into the reserve's room (see _pysyncobj).
        make_room_for(str(directory), None if reserve is None else reserve.release)
        self._fsm = _ReplicatedMetadata(self._applied, self._restored)
        s = self.settings
        conf = SyncObjConf(
            password=password,
            bindAddress=self_address,
            journalFile=str(directory / JOURNAL_FILE),
            fullDumpFile=str(directory / DUMP_FILE),
            useFork=False,
            raftMinTimeout=s.election_timeout_ms_min / 1000,
            raftMaxTimeout=s.election_timeout_ms_max / 1000,
            appendEntriesPeriod=s.heartbeat_interval_ms / 1000,
            connectionTimeout=s.connection_timeout_ms / 1000,
            connectionRetryTime=s.connection_retry_ms / 1000,
            leaderFallbackTimeout=s.leader_fallback_ms / 1000,
            appendEntriesUseBatch=s.append_entries_batch,
            commandsWaitLeader=s.commands_wait_leader,
            commandsQueueSize=s.proposals_queued_max,
            logCompactionMinEntries=s.snapshot_entries_min,
            logCompactionMinTime=s.snapshot_interval_ms / 1000,
            dynamicMembershipChange=False,
            maxBindRetries=1,
            onReady=lambda: self._post(self._ready.set),
        )
        routes = routes or {}
        partners = [RoutedNode(a, routes[a]) if a in routes else a
                    for a in partner_addresses if a != self_address]
        self._sync = SafeSyncObj(self_address, partners, conf=conf, consumers=[self._fsm])
        try:
            self._sync.waitBinded()
        except Exception:
            self._sync._doDestroy()  # its thread is gone: release the journal and sockets
            make_room_for(str(directory), None)
            raise OSError(errno.EADDRINUSE,
                          f"cannot listen on the metadata Raft address {self_address}") from None

    # -- the LocalMetadata interface --------------------------------------------------------

    @property
    def state(self) -> MetadataState:
        """The state as of the last command applied here. Never changed in place: hold on to
        it for a consistent view, read `.state` again for a newer one."""
        return self._state

    @property
    def is_leader(self) -> bool:
        """True while this broker is the Raft leader (the metadata leader). Another broker may
        briefly believe the same until it hears of a newer term."""
        return not self._closed and bool(self._sync._isLeader())

    def add_listener(self, listener: Listener) -> None:
        """`listener(command, result)` runs on the loop after each command applied here, in log
        order, with `.state` already updated; also `(StateRestored(version), None)` when the
        state was loaded whole. Refused commands (an error result) change nothing and are not
        passed on."""
        self._listeners.append(listener)

    async def propose(self, command: Command, timeout: float = 5.0) -> Any:
        """Commit `command` through Raft and return its result as applied on this broker;
        raise the JetstreamError the FSM refused it with (state unchanged everywhere), or
        MetadataUnavailable when no leader committed it within `timeout` seconds."""
        if self._closed:
            raise MetadataUnavailable("closed")
        encoded = encode_command(command)
        proposal_id = uuid.uuid4().hex
        loop = self._loop
        outcome: asyncio.Future[Any] = loop.create_future()
        self._pending[proposal_id] = outcome
        deadline = loop.time() + timeout
        backoff = RETRY_BACKOFF_MS_MIN / 1000
        resend = self.settings.propose_resend_ms / 1000
        try:
            while not outcome.done():
                if _left(loop, deadline) == 0:
                    raise MetadataUnavailable("timeout", f"not committed within {timeout:g} s; "
                                              "it may still be applied")
                attempt = self._submit(proposal_id, encoded)
                await asyncio.wait((outcome, attempt), timeout=min(resend, _left(loop, deadline)),
                                   return_when=asyncio.FIRST_COMPLETED)
                if outcome.done() or not attempt.done():
                    continue  # done, or no answer at all: send it again (if time is left)
                reason = attempt.result()
                if reason == FAIL_REASON.SUCCESS:  # applied, outcome on its way: just wait
                    await asyncio.wait((outcome,), timeout=_left(loop, deadline))
                elif reason in _RETRIED:  # leadership is moving: try again in a moment
                    log.debug("proposal %s: %s, retrying", proposal_id, _REASONS[reason])
                    await asyncio.wait((outcome,), timeout=min(backoff, _left(loop, deadline)))
                    backoff = min(2 * backoff, RETRY_BACKOFF_MS_MAX / 1000)
                else:
                    raise MetadataUnavailable(_REASONS.get(reason, str(reason)))
        finally:
            self._pending.pop(proposal_id, None)
        result = outcome.result()
        if isinstance(result, BaseException):
            raise result
        return result

    # -- cluster facts ----------------------------------------------------------------------

    @property
    def leader_address(self) -> str | None:
        """The Raft address of the leader this broker last heard of; None during an election."""
        node = self._sync._getLeader()
        return None if node is None else str(node.address)

    @property
    def leader_broker_id(self) -> int | None:
        """The broker id of `leader_address` (None when unknown or not in `broker_ids`)."""
        address = self.leader_address
        return None if address is None else self._broker_ids.get(address)

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self, timeout: float) -> None:
        """Wait until this broker has applied what the leader had committed when it joined;
        raises MetadataUnavailable("timeout") after `timeout` seconds."""
        if not await wait_event(self._ready, timeout):
            raise MetadataUnavailable("timeout", "metadata not caught up with a leader")

    def status(self) -> dict[str, Any]:
        """Raft facts for `cluster status`: role, term, leader, commit index, partners."""
        raw = _read_status(self._sync)
        partners = {key[len(_PARTNER_KEY):]: "up" if value else "down"
                    for key, value in raw.items() if key.startswith(_PARTNER_KEY)}
        leader = None if raw["leader"] is None else str(raw["leader"].address)
        return {
            "broker_id": self.broker_id,
            "address": self.address,
            "role": _ROLES.get(raw["state"], str(raw["state"])),
            "term": raw["raft_term"],
            "leader": leader,
            "leader_broker_id": None if leader is None else self._broker_ids.get(leader),
            "commit_index": raw["commit_idx"],
            "last_applied": raw["last_applied"],
            "log_length": raw["log_len"],
            "has_quorum": raw["has_quorum"],
            "ready": self.is_ready,
            "partners": partners,
            "metadata_version": self._state.version,
            "closed": self._closed,
        }

    def request_snapshot(self) -> None:
        """Ask for a full dump (and a journal cut) at the next tick, without waiting for the
        entry count or the interval."""
        self._sync.forceLogCompaction()

    async def compact(self, timeout_s: float = COMPACT_WAIT_S) -> bool:
        """Write a full dump of what is applied now and cut the journal to the entries after
        it (a clean stop calls this: the next start loads the dump instead of replaying
        thousands of entries, each a copy of the state). True once the journal was cut,
        False when `timeout_s` passed first (nothing is lost either way)."""
        if self._closed:
            return False
        before = _read_status(self._sync)["log_len"]
        if before <= COMPACT_ENTRIES_MIN:
            return True
        self._sync.forceLogCompaction()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(COMPACT_POLL_S)
            if _read_status(self._sync)["log_len"] < before:
                return True
        log.warning("metadata dump at stop not written within %.1f s", timeout_s)
        return False

    async def close(self) -> None:
        """Leave the group: stop pysyncobj's thread and close its journal and sockets. Pending
        proposals fail with MetadataUnavailable("closed"); they may still be committed by the
        others."""
        if self._closed:
            return
        self._closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_result(MetadataUnavailable("closed"))
        await asyncio.to_thread(self._sync.destroy_synchronous)
        make_room_for(str(self.directory), None)

    # -- plumbing between the two threads ---------------------------------------------------

    def _submit(self, proposal_id: str, encoded: dict[str, Any]) -> asyncio.Future[int]:
        """Hand one copy of a proposal to pysyncobj; the future gets its FAIL_REASON."""
        attempt: asyncio.Future[int] = self._loop.create_future()

        def on_result(_result: Any, reason: int) -> None:  # pysyncobj's thread (or this one)
            self._post(_settle, attempt, reason)

        # BlockingIOError: queued, but pysyncobj's wake-up pipe was full (its thread is awake)
        with contextlib.suppress(BlockingIOError):
            self._fsm.apply(proposal_id, encoded, callback=on_result)
        return attempt

    def _post(self, function: Callable[..., None], *args: Any) -> None:
        """Run `function(*args)` on the loop, after everything posted before it."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens any more
            self._loop.call_soon_threadsafe(function, *args)

    def _applied(self, proposal_id: str, command: Command | None, outcome: Any,
                 new_state: MetadataState | None) -> None:  # pysyncobj's thread
        self._post(self._deliver, proposal_id, command, outcome, new_state)

    def _restored(self, state: MetadataState) -> None:  # pysyncobj's thread
        self._post(self._deliver_restored, state)

    def _deliver(self, proposal_id: str, command: Command | None, outcome: Any,
                 new_state: MetadataState | None) -> None:
        if new_state is not None:
            self._state = new_state
            assert command is not None
            self._notify(command, outcome)
        future = self._pending.pop(proposal_id, None)
        if future is None or future.done():
            return
        if outcome is _DUPLICATE:
            # Its first copy was applied here inside a snapshot, so its result was not seen.
            outcome = MetadataUnavailable("unknown_outcome", "committed, but its result was "
                                          "not observed here; read the metadata")
        future.set_result(outcome)

    def _deliver_restored(self, state: MetadataState) -> None:
        self._state = state
        self._notify(StateRestored(state.version), None)

    def _notify(self, command: Command | StateRestored, result: Any) -> None:
        if self._closed:
            return
        for listener in self._listeners:
            try:
                listener(command, result)
            except Exception:
                log.exception("metadata listener %r failed on %r", listener, command)


def _settle(attempt: asyncio.Future[int], reason: int) -> None:
    if not attempt.done():
        attempt.set_result(reason)


def _left(loop: asyncio.AbstractEventLoop, deadline: float) -> float:
    return max(0.0, deadline - loop.time())


def _read_status(sync: SyncObj) -> dict[str, Any]:
    # getStatus() walks dicts that pysyncobj's thread may be changing (a partner connecting):
    # rare, and harmless to read again.
    for _ in range(5):
        with contextlib.suppress(RuntimeError):
            return dict(sync.getStatus())
    return dict(sync.getStatus())
