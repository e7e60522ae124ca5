"""Spark's pushed-down filters, turned into the bounds a read is planned with.

Theory of operation: with `spark.sql.python.filterPushdown.enabled`, Spark offers a Python
data source the filters of a query (`DataSourceReader.pushFilters`); the source takes those it
applies itself and hands back the rest, which Spark evaluates on the rows. We take filters on
`stream` and `partition` (partitions and streams not matching are never listed), on `offset`
(the offset range is narrowed before splitting, so a 1 % range reads 1 % of the segments,
starting from the offset index), and on `timestamp` (a lower bound is turned into an offset
with the partition's time index; both bounds also drop rows, and whole record batches whose
time range cannot match). `IS NOT NULL` on a column that is never null is taken as true.
Everything taken is applied exactly, so Spark does not re-check it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

from jetstream.spark.planning import OffsetBounds

_COMPARISONS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
#: Columns no row has null: `IS NOT NULL` on them (which Spark adds to comparisons) holds.
_NEVER_NULL = ("stream", "partition", "offset", "timestamp", "subject", "headers", "leader_epoch")


def _millis(value: Any) -> int | None:
    """A timestamp literal as ms since the epoch (naive datetimes are local time, as Spark
    hands them over), or None if `value` is not one."""
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:
        value = value.astimezone(UTC)
    return int(value.timestamp() * 1000)


def _int_value(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _equal_values(kind: type[Filter], value: Any) -> tuple[Any, ...] | None:
    """The values an `=` or `IN` filter allows, None for any other filter."""
    if kind is In:
        return tuple(value)
    return (value,) if kind is EqualTo else None


def _within(allowed: frozenset[Any], before: frozenset[Any] | None) -> frozenset[Any]:
    return allowed if before is None else allowed & before


def apply_filter(bounds: OffsetBounds, flt: Filter) -> OffsetBounds | None:
    """`bounds` narrowed by `flt`, or None when the filter is not one this source applies."""
    if not hasattr(flt, "attribute") or len(flt.attribute) != 1:
        return None
    column = flt.attribute[0]
    kind = type(flt)
    if kind is IsNotNull and column in _NEVER_NULL:
        return bounds
    value: Any = getattr(flt, "value", None)
    if column in ("stream", "partition"):
        # `=` and `IN` only: comparisons on partition are rare, and Spark applies them.
        values = _equal_values(kind, value)
        if column == "stream":
            if values is None or not all(isinstance(v, str) for v in values):
                return None
            return dataclasses.replace(bounds, streams=_within(frozenset(values),
                                                               bounds.streams))
        if values is None or not all(_int_value(v) is not None for v in values):
            return None
        return dataclasses.replace(bounds, partitions=_within(frozenset(values),
                                                              bounds.partitions))
    if kind not in _COMPARISONS:
        return None
    if column == "offset":
        number = _int_value(value)
        if number is None:
            return None
        low, high = bounds.low, bounds.high
        if kind in (GreaterThan, GreaterThanOrEqual, EqualTo):
            low = max(low, number + 1 if kind is GreaterThan else number)
        if kind in (LessThan, LessThanOrEqual, EqualTo):
            high = min(high, number if kind is LessThan else number + 1)
        return dataclasses.replace(bounds, low=low, high=high)
    if column == "timestamp":
        millis = _millis(value)
        if millis is None:
            return None
        return _timestamp_range(bounds, kind, value, millis)
    return None


def _timestamp_range(bounds: OffsetBounds, kind: type[Filter], value: datetime, millis: int
                     ) -> OffsetBounds | None:
    if value.microsecond % 1000:
        return None  # sub-millisecond bounds: Spark compares them exactly
    low, high = bounds.timestamp_min_ms, bounds.timestamp_max_ms
    if kind in (GreaterThan, GreaterThanOrEqual, EqualTo):
        edge = millis + 1 if kind is GreaterThan else millis
        low = edge if low is None else max(low, edge)
    if kind in (LessThan, LessThanOrEqual, EqualTo):
        edge = millis - 1 if kind is LessThan else millis
        high = edge if high is None else min(high, edge)
    return dataclasses.replace(bounds, timestamp_min_ms=low, timestamp_max_ms=high)


def push_filters(bounds: OffsetBounds, filters: Iterable[Filter], *,
                 rows: bool = True) -> tuple[OffsetBounds, list[Filter]]:
    """The bounds with every filter this source applies, and the filters it does not.
    With `rows` False only filters choosing whole partitions are taken (a compacted=latest
    read: a row filter applied before each key's latest is chosen would change which row is
    the latest)."""
    rest: list[Filter] = []
    for flt in filters:
        column = getattr(flt, "attribute", ("",))[0]
        whole = column in ("stream", "partition") and not isinstance(
            flt, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual))
        narrowed = apply_filter(bounds, flt) if rows or whole else None
        if narrowed is None:
            rest.append(flt)
        else:
            bounds = narrowed
    return bounds, rest
