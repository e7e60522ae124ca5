"""A datastream's rate limit: a token bucket per task (no IO, no clock of its own).

Theory of operation: a datastream's `rate_limit_records_per_s` is shared evenly by its tasks
(a task's partitions share its bucket). The bucket holds at most one second of its rate; a
batch takes its records' tokens at once, running into debt when there are too few, and the
task waits until the debt is paid (`take` answers how long), so a batch larger than the
bucket still goes out whole and the rate holds over time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    rate_per_s: float
    #: Tokens now (negative: a debt) as of `at_s`.
    tokens: float
    at_s: float

    @classmethod
    def full(cls, rate_per_s: float, now_s: float) -> TokenBucket:
        if rate_per_s <= 0:
            raise ValueError(f"a rate is positive, got {rate_per_s}")
        return cls(rate_per_s, rate_per_s, now_s)

    def take(self, count: int, now_s: float) -> float:
        """Take `count` tokens at `now_s`; how long to wait (seconds) before using them."""
        elapsed = max(0.0, now_s - self.at_s)
        self.tokens = min(self.rate_per_s, self.tokens + elapsed * self.rate_per_s) - count
        self.at_s = max(self.at_s, now_s)
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate_per_s


def task_rate(limit_per_s: int | None, tasks: int) -> float | None:
    """A task's share of a datastream's limit (None: unlimited)."""
    return None if limit_per_s is None else limit_per_s / max(tasks, 1)
