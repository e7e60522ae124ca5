"""A log-linear latency histogram (HDR-style), the same buckets as bench/loadgen/loadgen.c.

Theory of operation: values (nanoseconds) below 2^BITS have a bucket each; above, each power
of two [2^e, 2^(e+1)) is cut into 2^BITS equal sub-buckets, so a bucket's width is at most
2^-BITS of its values (0.8 % with 7 bits) and a million samples cost a few thousand counters,
not a list of floats. The generator prints its counts as sparse [index, count] pairs;
`Histogram.from_json` reads them, `merge` adds histograms of several connections or
processes, and `value_at` answers a percentile with the highest value of the bucket it falls
in (HdrHistogram's "highest equivalent value": never below the true percentile).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

BITS = 7
SUB_BUCKETS = 1 << BITS


def bucket_of(value: int) -> int:
    """The bucket of a non-negative value: `bucket_of` in loadgen.c."""
    if value < SUB_BUCKETS:
        return max(value, 0)
    exponent = value.bit_length() - 1
    mantissa = value >> (exponent - BITS)
    return (exponent - BITS + 1) * SUB_BUCKETS + mantissa - SUB_BUCKETS


def bucket_bounds(index: int) -> tuple[int, int]:
    """The lowest and highest value that fall in bucket `index`."""
    if index < SUB_BUCKETS:
        return index, index
    group = index >> BITS
    lowest = ((index & (SUB_BUCKETS - 1)) + SUB_BUCKETS) << (group - 1)
    return lowest, lowest + (1 << (group - 1)) - 1


class Histogram:
    """Counts per bucket of recorded values (ns)."""

    def __init__(self, counts: Mapping[int, int] | None = None) -> None:
        self.counts: Counter[int] = Counter(counts or {})

    def record(self, value: int, count: int = 1) -> None:
        self.counts[bucket_of(value)] += count

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def merge(self, other: Histogram) -> Histogram:
        """A new histogram holding the values of both."""
        return Histogram(self.counts + other.counts)

    @classmethod
    def merged(cls, histograms: Iterable[Histogram]) -> Histogram:
        result = cls()
        for histogram in histograms:
            result.counts.update(histogram.counts)
        return result

    def value_at(self, percentile: float) -> int:
        """The highest value of the bucket holding the `percentile`-th value; 0 when empty."""
        total = self.total
        if total == 0:
            return 0
        rank = max(1, min(total, -(-total * round(percentile * 1000) // 100_000)))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                return bucket_bounds(index)[1]
        raise AssertionError("unreachable: the counts add up to total")

    def max(self) -> int:
        return bucket_bounds(max(self.counts))[1] if self.counts else 0

    def to_json(self) -> dict[str, Any]:
        return {"sub_bucket_bits": BITS, "unit": "ns",
                "counts": [[index, self.counts[index]] for index in sorted(self.counts)]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Histogram:
        if data.get("sub_bucket_bits") != BITS or data.get("unit") != "ns":
            raise ValueError(f"a histogram of {data.get('sub_bucket_bits')} sub-bucket bits "
                             f"in {data.get('unit')}, not {BITS} in ns")
        return cls({int(index): int(count) for index, count in data["counts"]})

    def summary_ms(self) -> dict[str, float]:
        """p50, p99, p99.9 and max in milliseconds."""
        return {"p50_ms": self.value_at(50) / 1e6, "p99_ms": self.value_at(99) / 1e6,
                "p999_ms": self.value_at(99.9) / 1e6, "max_ms": self.max() / 1e6}
