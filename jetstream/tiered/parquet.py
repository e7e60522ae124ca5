"""Parquet fragments: the committed records of one sealed segment as a Parquet file.

Theory of operation: with `fragment_format` parquet or both, the offload pass
(jetstream.tiered.offload) writes each sealed, committed segment a second way, for analytics:
its records decoded by the Spark source's decoder (jetstream.spark.arrow_decode, CRC of every
batch checked) into the Spark source's Arrow schema — stream, partition, offset, timestamp,
subject, key, value, headers, leader_epoch — so a native Parquet read (Spark, pyarrow,
duckdb, polars) gives exactly the rows a read through the broker gives. Row groups hold up to
ROW_GROUP_ROWS rows (large enough for scans to run at column speed, small enough that an
offset range skips most of a fragment), with min/max statistics on partition, offset and
timestamp (readers skip row groups by them), dictionary encoding where it pays (Parquet's
default, as Spark's own writer does: a column chunk falls back to plain encoding once its
dictionary outgrows 1 MiB), and a CRC on every page; its metadata tells Spark its
timestamps need no calendar rebase (FILE_METADATA). Parquet compresses its own pages with the
stream's `fragment_compression` (none, zstd, lz4, snappy).

The fragment is named like the segment fragment of the same bytes with `.parquet`
(jetstream.tiered.names): same offsets, same leader epoch, the SHA-256 of the segment's
bytes. Pure: no IO.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jetstream.spark import arrow_decode
from jetstream.tiered.names import Compression

#: Most rows in one row group (pyarrow's default; Spark's own writer closes a row group at
#: 128 MiB, about one per fragment): a scan pays a row group's setup once per million rows.
ROW_GROUP_ROWS = 1 << 20
#: Columns whose values repeat by nature (header names among them: a nested column is named
#: by its path): always dictionary-encoded. Header values are not.
DICTIONARY_COLUMNS = ("stream", "partition", "subject", "headers.key_value.key",
                      "leader_epoch")
#: Columns of data (key, value) dictionary-encoded only when every distinct value of the
#: fragment fits in a dictionary page of this size, Parquet's limit before a writer falls back
#: to plain encoding mid-column (a column chunk half dictionary, half plain makes a
#: vectorised reader such as Spark's decode the dictionary eagerly). Offsets and timestamps
#: never repeat: never.
DICTIONARY_PAGE_BYTES = 1 << 20
#: The columns of a Parquet fragment, in order (the Spark source's).
COLUMNS = tuple(f.name for f in arrow_decode.ARROW_FIELDS)
#: Columns with min/max statistics.
STATISTICS_COLUMNS = ("partition", "offset", "timestamp")

_CODECS = {Compression.NONE: "none", Compression.ZSTD: "zstd", Compression.LZ4: "lz4",
           Compression.SNAPPY: "snappy"}
SCHEMA = arrow_decode.arrow_schema(COLUMNS)
#: The file's key-value metadata: the key Spark reads to learn that the timestamps are on the
#: proleptic Gregorian calendar (Spark 3.0 and later write them so, as Arrow does). Without
#: it Spark checks every timestamp against the Julian calendar switch before using it
#: (`spark.sql.parquet.datetimeRebaseModeInRead`), measured at a third more CPU per row.
FILE_METADATA = {"org.apache.spark.version": "3.0.0"}


def segment_table(data: bytes, stream: str, partition: int, begin: int, end: int) -> pa.Table:
    """The records of the segment bytes `data` holding offsets [begin, end), every column.
    Raises format.BatchFormatError on a bad CRC or a malformed batch, ValueError when the
    bytes are not whole batches of that range."""
    decoded = arrow_decode.decode(data, stream=stream, partition=partition, columns=COLUMNS,
                                  start=begin, end=end, verify=True)
    if decoded.consumed != len(data):
        raise ValueError(f"segment {stream}/{partition} [{begin}, {end}) ends in a partial "
                         f"batch ({decoded.consumed} of {len(data)} bytes are whole batches)")
    return pa.Table.from_batches([decoded.batch], schema=SCHEMA)


def encode(table: pa.Table, compression: Compression) -> bytes:
    """`table` as the bytes of a Parquet file (see the module docstring)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(FILE_METADATA), sink,
                   row_group_size=ROW_GROUP_ROWS, compression=_CODECS[compression],
                   use_dictionary=dictionary_columns(table),
                   dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES,
                   write_statistics=list(STATISTICS_COLUMNS), write_page_checksum=True)
    return sink.getvalue().to_pybytes()


def dictionary_columns(table: pa.Table) -> list[str]:
    """The columns of `table` to dictionary-encode (see DICTIONARY_PAGE_BYTES)."""
    columns = list(DICTIONARY_COLUMNS)
    for name in ("key", "value"):
        distinct = pc.unique(table[name])
        # A dictionary page holds each value after its 4-byte length.
        page_bytes = (pc.sum(pc.binary_length(distinct)).as_py() or 0) + 4 * len(distinct)
        if page_bytes <= DICTIONARY_PAGE_BYTES:
            columns.append(name)
    return columns


def segment_parquet(data: bytes, stream: str, partition: int, begin: int, end: int,
                    compression: Compression) -> bytes:
    """The Parquet fragment of the segment bytes `data`."""
    return encode(segment_table(data, stream, partition, begin, end), compression)
