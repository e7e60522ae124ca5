"""Fragment names: content-addressed, self-describing object keys in a fragment store.

Theory of operation (Gazette's fragments): a fragment is the bytes of one sealed segment
(our segment format, jetstream.stream.format), maybe compressed, stored under a name that
says everything a reader needs, so the store's listing alone describes what it holds:

    <prefix>/<stream>/<partition>/<begin:016x>-<end:016x>-<leader epoch>-<sha256>.<ext>

- `begin` is the first offset the fragment holds, `end` the offset after its last one (an
  exclusive end, as the log end offset), both 16 lowercase hex digits so that names sort by
  offset.
- `leader epoch` (decimal) is the epoch of the leader that uploaded it.
- `sha256` (64 lowercase hex digits) is of the uncompressed bytes: the same content always
  gets the same name (an upload is idempotent), and a reader checks what it downloaded.
- `ext` names the encoding: `seg` (none), `seg.zst`, `seg.lz4`, `seg.sz` (snappy), or
  `parquet` for a Parquet fragment (jetstream.tiered.parquet): the same records as columns,
  named like the segment fragment it was made from (same offsets, epoch and the SHA-256 of
  the segment's bytes), so the two kinds of a range pair up by name.
Pure: no IO.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from jetstream.protocol import names

#: Widths of the name's fields.
OFFSET_HEX_DIGITS = 16
SHA256_HEX_DIGITS = 64
OFFSET_MAX = (1 << (4 * OFFSET_HEX_DIGITS)) - 1
EPOCH_MAX = 0xFFFFFFFF  # a batch's leader_epoch is a u32


class Compression(enum.StrEnum):
    """How a fragment's bytes are encoded in the store (`fragment_compression`)."""

    NONE = "none"
    ZSTD = "zstd"
    LZ4 = "lz4"
    SNAPPY = "snappy"

    @property
    def extension(self) -> str:
        return _EXTENSIONS[self]


class FragmentKind(enum.StrEnum):
    """What a fragment holds: segment bytes (served to consumers) or Parquet (analytics)."""

    SEGMENT = "segment"
    PARQUET = "parquet"


PARQUET_EXTENSION = "parquet"
_EXTENSIONS = {Compression.NONE: "seg", Compression.ZSTD: "seg.zst",
               Compression.LZ4: "seg.lz4", Compression.SNAPPY: "seg.sz"}
_BY_EXTENSION = {ext: c for c, ext in _EXTENSIONS.items()}

_FILE = re.compile(
    r"(?P<begin>[0-9a-f]{16})-(?P<end>[0-9a-f]{16})-(?P<epoch>0|[1-9][0-9]{0,9})-"
    r"(?P<sha>[0-9a-f]{64})\.(?P<ext>seg(?:\.zst|\.lz4|\.sz)?|parquet)")
assert OFFSET_HEX_DIGITS == 16 and SHA256_HEX_DIGITS == 64


class BadFragmentName(ValueError):
    """A key in the store that is not a fragment name (another writer's file): skipped."""


@dataclass(frozen=True, slots=True, order=True)
class FragmentName:
    """What a fragment's name says. Ordered by offsets, then the rest (a stable order)."""

    begin: int
    end: int
    stream: str
    partition: int
    leader_epoch: int
    sha256: str
    #: The segment bytes' encoding (NONE for a Parquet fragment: Parquet compresses its own
    #: pages).
    compression: Compression
    kind: FragmentKind = FragmentKind.SEGMENT

    def __post_init__(self) -> None:
        if not 0 <= self.begin < self.end <= OFFSET_MAX:
            raise BadFragmentName(f"fragment offsets [{self.begin}, {self.end}) are not a "
                                  "non-empty range of 64-bit offsets")
        if not names.is_stream_name(self.stream) or not self.partition >= 0:
            raise BadFragmentName(f"bad stream or partition {self.stream!r}/{self.partition}")
        if not 0 <= self.leader_epoch <= EPOCH_MAX:
            raise BadFragmentName(f"leader epoch {self.leader_epoch} out of range")
        if len(self.sha256) != SHA256_HEX_DIGITS or not _is_lower_hex(self.sha256):
            raise BadFragmentName(f"sha256 {self.sha256!r} is not 64 lowercase hex digits")
        if self.kind is FragmentKind.PARQUET and self.compression is not Compression.NONE:
            raise BadFragmentName("a Parquet fragment's name carries no compression")

    @property
    def extension(self) -> str:
        return (PARQUET_EXTENSION if self.kind is FragmentKind.PARQUET
                else self.compression.extension)

    @property
    def file_name(self) -> str:
        return (f"{self.begin:016x}-{self.end:016x}-{self.leader_epoch}-{self.sha256}."
                f"{self.extension}")

    def as_parquet(self) -> FragmentName:
        """The name of the Parquet fragment made from this segment fragment's bytes."""
        return FragmentName(self.begin, self.end, self.stream, self.partition,
                            self.leader_epoch, self.sha256, Compression.NONE,
                            FragmentKind.PARQUET)

    def key(self, prefix: str) -> str:
        """The object key under the store's `prefix` (may be empty)."""
        return "/".join(p for p in (prefix.strip("/"), partition_dir(self.stream,
                                                                      self.partition),
                                    self.file_name) if p)

    def covers(self, offset: int) -> bool:
        return self.begin <= offset < self.end


def partition_dir(stream: str, partition: int) -> str:
    return f"{stream}/{partition}"


def partition_prefix(prefix: str, stream: str, partition: int) -> str:
    """The key prefix (with its trailing slash) every fragment of a partition starts with."""
    head = prefix.strip("/")
    return f"{head}/{partition_dir(stream, partition)}/" if head else \
        f"{partition_dir(stream, partition)}/"


def parse_key(key: str, prefix: str = "") -> FragmentName:
    """The fragment `key` names (under `prefix`); BadFragmentName if it names none."""
    head = prefix.strip("/")
    rest = key
    if head:
        if not key.startswith(head + "/"):
            raise BadFragmentName(f"{key!r} is not under prefix {head!r}")
        rest = key[len(head) + 1:]
    parts = rest.split("/")
    if len(parts) != 3 or not parts[1].isdigit() or (parts[1] != "0"
                                                      and parts[1].startswith("0")):
        raise BadFragmentName(f"{key!r} is not <stream>/<partition>/<fragment>")
    return parse_file_name(parts[2], parts[0], int(parts[1]))


def parse_file_name(file_name: str, stream: str, partition: int) -> FragmentName:
    match = _FILE.fullmatch(file_name)
    if match is None:
        raise BadFragmentName(f"{file_name!r} is not a fragment file name")
    ext = match["ext"]
    parquet = ext == PARQUET_EXTENSION
    return FragmentName(int(match["begin"], 16), int(match["end"], 16), stream, partition,
                        int(match["epoch"]), match["sha"],
                        Compression.NONE if parquet else _BY_EXTENSION[ext],
                        FragmentKind.PARQUET if parquet else FragmentKind.SEGMENT)


def _is_lower_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
