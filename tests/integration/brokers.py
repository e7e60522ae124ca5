"""The broker child process the integration tests run (jetstream.server.process, shared with
the benchmarks and `jetstream dev`)."""

from jetstream.server.process import BrokerProcess, BrokerStartFailed

__all__ = ["BrokerProcess", "BrokerStartFailed"]
