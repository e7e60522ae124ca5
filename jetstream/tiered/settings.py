"""A stream's tiered-storage settings, checked where a stream config is built.

    fragment_store            URL of the store (`s3://bucket/prefix`, `gs://…`, `az://…`,
                              `file:///abs/path`), or None: no tiered storage
    fragment_compression      none | zstd | lz4 | snappy
    local_retention_ms        sealed segments verified in the store leave the local disk
    local_retention_bytes     once older than this / once the local log holds more (None: kept)
    fragment_store_retention  delete (retention_* deletes fragments too) | external (the
                              bucket's lifecycle rules do)
    fragment_format           segment (fragments in the segment format, which reads below
                              the local log start are served from) | parquet (Parquet
                              fragments only: an analytics copy; the history stays on the
                              brokers' disks, so local_retention_* are refused) | both

Credentials and endpoints never go in a stream's config (it is replicated and shown): the
store library reads them from the broker's environment (AWS_*, GOOGLE_*, AZURE_* variables).
Pure: no IO.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from jetstream.errors import InvalidStreamConfig
from jetstream.tiered.names import Compression

#: URL schemes a fragment store may have.
STORE_SCHEMES = frozenset({"s3", "s3a", "gs", "az", "abfs", "abfss", "file"})
STORE_URL_CHARS_MAX = 1024
#: Bound of the retention settings (as the log's own).
RETENTION_MAX = 2**62


class StoreRetention(enum.StrEnum):
    DELETE = "delete"
    EXTERNAL = "external"


class FragmentFormat(enum.StrEnum):
    """Which fragments the offload writes of each sealed, committed segment."""

    SEGMENT = "segment"
    PARQUET = "parquet"
    BOTH = "both"

    @property
    def segments(self) -> bool:
        return self is not FragmentFormat.PARQUET

    @property
    def parquet(self) -> bool:
        return self is not FragmentFormat.SEGMENT


#: The StreamConfig fields of this module, all changeable by a stream update.
FIELDS = frozenset({"fragment_store", "fragment_compression", "local_retention_ms",
                    "local_retention_bytes", "fragment_store_retention",
                    "fragment_format"})


@dataclass(frozen=True, slots=True)
class TieredSettings:
    fragment_store: str
    fragment_compression: Compression
    local_retention_ms: int | None
    local_retention_bytes: int | None
    fragment_store_retention: StoreRetention
    fragment_format: FragmentFormat = FragmentFormat.SEGMENT
    #: The stream is compacted: Parquet fragments are written of cleaned segments only.
    compacted: bool = False


def check_store_url(url: object) -> str:
    if not isinstance(url, str) or not 0 < len(url) <= STORE_URL_CHARS_MAX:
        raise InvalidStreamConfig(
            f"fragment_store must be a URL of at most {STORE_URL_CHARS_MAX} characters, "
            f"got {url!r}", field="fragment_store")
    parts = urlsplit(url)
    if parts.scheme not in STORE_SCHEMES:
        raise InvalidStreamConfig(
            f"fragment_store must be a URL with a scheme of {sorted(STORE_SCHEMES)}, got "
            f"{url!r}", field="fragment_store")
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/"):
            raise InvalidStreamConfig(
                f"a file fragment_store is file:///absolute/path, got {url!r}",
                field="fragment_store")
    elif not parts.netloc:
        raise InvalidStreamConfig(f"fragment_store {url!r} names no bucket",
                                  field="fragment_store")
    if parts.query or parts.fragment or any(c.isspace() for c in url):
        raise InvalidStreamConfig(
            f"fragment_store {url!r} may hold no query, fragment or whitespace (credentials "
            "and endpoints come from the broker's environment)", field="fragment_store")
    return url


#: The fields holding an enum's value (StreamConfig checks and converts them with its own).
ENUM_FIELDS: tuple[tuple[str, type[enum.Enum]], ...] = (
    ("fragment_compression", Compression), ("fragment_store_retention", StoreRetention),
    ("fragment_format", FragmentFormat))


def check(config: Any) -> None:
    """Check the tiered fields of a StreamConfig but the enums (ENUM_FIELDS)."""
    store = config.fragment_store
    if store is not None:
        check_store_url(store)
    for name in ("local_retention_ms", "local_retention_bytes"):
        value = getattr(config, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not \
                1 <= value <= RETENTION_MAX:
            raise InvalidStreamConfig(
                f"{name} must be an integer in [1, {RETENTION_MAX}], got {value!r}",
                field=name)
        if store is None:
            raise InvalidStreamConfig(
                f"{name} needs a fragment_store: without one the local log is all there is",
                field=name)
        if config.fragment_format is FragmentFormat.PARQUET:
            raise InvalidStreamConfig(
                f"{name} needs segment fragments (fragment_format segment or both): Parquet "
                "fragments are an analytics copy that reads are not served from", field=name)


def settings_of(config: Any) -> TieredSettings | None:
    """The tiered settings of a StreamConfig, None without a store."""
    if config.fragment_store is None:
        return None
    return TieredSettings(config.fragment_store, Compression(config.fragment_compression),
                          config.local_retention_ms, config.local_retention_bytes,
                          StoreRetention(config.fragment_store_retention),
                          FragmentFormat(config.fragment_format),
                          bool(config.cleanup_policy.compacts))
