"""A fragment's bytes: compressed for the store, checked against its name when read back.

Theory of operation: the uncompressed bytes of a fragment are exactly the bytes of the
segment file it was made from, so one reader (jetstream.stream.segment) serves local and
stored data. The name carries the SHA-256 of those uncompressed bytes: `encode` computes it
while compressing, `decode` decompresses and refuses bytes whose digest differs (a corrupt or
truncated object is an error that names it, never wrong data). Compression uses cramjam
(zstd, lz4 frame, snappy frame: one Rust package for all three). Pure: no IO.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import cramjam

from jetstream.errors import CorruptFragment
from jetstream.tiered.names import Compression, FragmentName

#: zstd level: 3 is zstd's default, fast to write and to read.
ZSTD_LEVEL = 3


@dataclass(frozen=True, slots=True)
class Encoded:
    """A fragment ready to upload: its payload (maybe compressed) and the digest of the
    uncompressed bytes."""

    payload: bytes
    sha256: str
    raw_bytes: int


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(data: bytes, compression: Compression) -> Encoded:
    return Encoded(compress(data, compression), sha256_hex(data), len(data))


def compress(data: bytes, compression: Compression) -> bytes:
    if compression is Compression.NONE:
        return data
    if compression is Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=ZSTD_LEVEL))
    if compression is Compression.LZ4:
        return bytes(cramjam.lz4.compress(data))
    return bytes(cramjam.snappy.compress(data))


def decompress(payload: bytes, compression: Compression) -> bytes:
    if compression is Compression.NONE:
        return payload
    if compression is Compression.ZSTD:
        return bytes(cramjam.zstd.decompress(payload))
    if compression is Compression.LZ4:
        return bytes(cramjam.lz4.decompress(payload))
    return bytes(cramjam.snappy.decompress(payload))


def decode_parts(name: FragmentName, parts: Sequence[bytes | memoryview], where: str
                 ) -> Sequence[bytes | memoryview]:
    """`decode` of a payload that came in `parts`: an uncompressed one is checked part by
    part and handed back as it is (no copy of a segment-sized fragment); a compressed one is
    joined first."""
    if name.compression is not Compression.NONE:
        return [decode(name, b"".join(parts), where)]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    _check_digest(name, digest.hexdigest(), where)
    return parts


def decode(name: FragmentName, payload: bytes, where: str) -> bytes:
    """The uncompressed bytes of the fragment `name` from its stored `payload`; raises
    CorruptFragment naming `where` (its URL) when they cannot be decompressed or their
    digest is not the one in the name."""
    try:
        data = decompress(payload, name.compression)
    except Exception as exc:  # cramjam raises its own error types per codec
        raise CorruptFragment(where, f"cannot be decompressed ({name.compression}): {exc}"
                              ) from exc
    _check_digest(name, sha256_hex(data), where)
    return data


def _check_digest(name: FragmentName, digest: str, where: str) -> None:
    if digest != name.sha256:
        raise CorruptFragment(where, f"its bytes have SHA-256 {digest}, its name says "
                                     f"{name.sha256}")
