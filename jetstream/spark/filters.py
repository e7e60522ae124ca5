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

_INT_COLUMNS = ("offset", "partition")
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


def _exclusive_high(value: int, kind: type[Filter]) -> int:
    return value + 1 if kind in (LessThanOrEqual, EqualTo) else value


def _int_value(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def apply_filter(bounds: OffsetBounds, flt: Filter) -> OffsetBounds | None:
    """`bounds` narrowed by `flt`, or None when the filter is not one this source applies."""
    if not hasattr(flt, "attribute") or len(flt.attribute) != 1:
        return None
    column = flt.attribute[0]
    kind = type(flt)
    if kind is IsNotNull and column in _NEVER_NULL:
        return bounds
    value: Any = getattr(flt, "value", None)
    if column == "stream":
        values = value if kind is In else (value,) if kind is EqualTo else None
        if values is None or not all(isinstance(v, str) for v in values):
            return None
        allowed = frozenset(values)
        if bounds.streams is not None:
            allowed &= bounds.streams
        return dataclasses.replace(bounds, streams=allowed)
    if column == "partition" and kind is In:
        if not all(_int_value(v) is not None for v in value):
            return None
        allowed_partitions = frozenset(value)
        if bounds.partitions is not None:
            allowed_partitions &= bounds.partitions
        return dataclasses.replace(bounds, partitions=allowed_partitions)
    if column in _INT_COLUMNS:
        number = _int_value(value)
        if number is None or kind not in (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                                          LessThanOrEqual):
            return None
        low = number + 1 if kind is GreaterThan else number
        if column == "partition":
            return _partition_range(bounds, kind, number)
        if kind in (GreaterThan, GreaterThanOrEqual):
            return dataclasses.replace(bounds, low=max(bounds.low, low))
        if kind in (LessThan, LessThanOrEqual):
            return dataclasses.replace(bounds, high=min(bounds.high, _exclusive_high(number, kind)))
        return dataclasses.replace(bounds, low=max(bounds.low, number),
                                   high=min(bounds.high, number + 1))
    if column == "timestamp":
        millis = _millis(value)
        if millis is None or kind not in (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                                          LessThanOrEqual):
            return None
        return _timestamp_range(bounds, kind, value, millis)
    return None


def _partition_range(bounds: OffsetBounds, kind: type[Filter], number: int) -> OffsetBounds | None:
    if kind is EqualTo:
        allowed = frozenset({number})
        if bounds.partitions is not None:
            allowed &= bounds.partitions
        return dataclasses.replace(bounds, partitions=allowed)
    # Comparisons on partition are rare; Spark applies them.
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
