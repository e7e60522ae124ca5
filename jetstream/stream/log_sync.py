"""A log's durability: fsyncs by the stream's policy, shared by concurrent appenders (group
commit), and filesystem-wide syncs claimed through tickets (jetstream.stream.fs_sync).

`LogSync` is a part of jetstream.stream.log.Log, apart to keep each file to one concern: it
uses the log's lock and segments, and keeps the durable offset (below it every offset was
fsynced), which a truncation holds back: an fsync that started before one must not claim
offsets that were cut and may be written again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from jetstream.stream.config import FsyncPolicy
from jetstream.stream.log_integrity import LogIntegrity


@dataclass(frozen=True, slots=True)
class SyncTicket:
    """A log's end offset and truncation count, taken before a filesystem-wide sync."""

    target: int
    truncations: int


class LogSync(LogIntegrity):
    _clock: Callable[[], int]
    _sync_cond: threading.Condition
    _sync_running: bool
    _truncations: int
    _durable_offset: int
    _last_sync_ms: int

    def _after_append(self, end_offset: int, sync: bool) -> None:
        policy = self.config.fsync
        if policy is FsyncPolicy.ALWAYS:
            if sync:
                self.sync_through(end_offset)
        elif policy is FsyncPolicy.INTERVAL and sync:
            self.maybe_sync()

    def sync_due(self) -> bool:
        """The INTERVAL policy's interval has passed since the last fsync."""
        return self.config.fsync is FsyncPolicy.INTERVAL and (
            self._clock() - self._last_sync_ms >= self.config.fsync_interval_ms)

    def sync_called_for(self) -> bool:
        """The policy calls for an fsync now: ALWAYS, or INTERVAL with its interval passed."""
        return self.config.fsync is FsyncPolicy.ALWAYS or self.sync_due()

    def sync_appended(self) -> None:
        """Make what was appended with `sync=False` durable as an append with `sync=True`
        would have (a caller that writes many logs first and fsyncs them after)."""
        self._after_append(self.log_end_offset, True)

    def maybe_sync(self) -> None:
        """Fsync if the INTERVAL policy's interval has passed (a shell may call it on a timer)."""
        if self.sync_due():
            self.sync_through(self.log_end_offset)

    def sync_through(self, offset: int) -> None:
        """Return once every offset below `offset` is fsynced (group commit; thread-safe)."""
        with self._sync_cond:
            while self._durable_offset < offset:
                if not self._sync_running:
                    self._sync_running = True
                    break
                self._sync_cond.wait()
            else:
                return
        target = self._durable_offset
        truncations = -1
        synced = False
        try:
            with self._lock:
                self._check_open()
                target = self.log_end_offset
                truncations = self._truncations
                # The active segment, and any segment rolled without an fsync (policy NEVER).
                pending = [s for s in self._segments if s.next_offset > self._durable_offset]
            # Outside the log lock: appends go on while the disk works. A segment rolled
            # meanwhile was fsynced by the roll itself.
            for segment in pending:
                try:
                    segment.sync()
                except FileNotFoundError:
                    # Deleted meanwhile by a truncation (which keeps `target` from counting)
                    # or by retention: nothing of it is left to flush.
                    with self._lock:
                        if segment in self._segments:
                            raise
            synced = True
            self._last_sync_ms = self._clock()
        finally:
            with self._sync_cond:
                # A failed fsync proves nothing durable.
                if synced and truncations == self._truncations:
                    self._durable_offset = max(self._durable_offset, target)
                self._sync_running = False
                self._sync_cond.notify_all()

    def sync_ticket(self) -> SyncTicket | None:
        """What a filesystem-wide sync started after this call makes durable (for
        `claim_synced`, jetstream.stream.fs_sync); None unless some appended offset is not
        durable yet and the policy calls for an fsync now (`sync_called_for`)."""
        if not self.sync_called_for():
            return None
        with self._lock:
            self._check_open()
            target, truncations = self.log_end_offset, self._truncations
        with self._sync_cond:
            return (SyncTicket(target, truncations) if self._durable_offset < target
                    else None)

    def claim_synced(self, ticket: SyncTicket) -> None:
        """A filesystem-wide sync that began after `ticket` was taken has returned: what the
        ticket names is durable (unless a truncation came in between)."""
        with self._sync_cond:
            if ticket.truncations == self._truncations:
                self._durable_offset = max(self._durable_offset, ticket.target)
            self._last_sync_ms = self._clock()
            self._sync_cond.notify_all()
