"""Where the Parquet sink's files go: a local directory, or an object store by URL.

Theory of operation: the sink (jetstream.datastreams.parquet_sink) hands over complete files
and asks which are complete; two places keep them, with one contract: a file is complete,
and listed in its partition's manifest, only once all of its bytes are durable, and a file
appears under its final name only complete.

- `LocalFiles` (a `path` without a scheme: a directory, local or shared by the brokers): a
  file is written under `_tmp/`, fsynced, renamed to its final name, and recorded as one JSON
  line appended to `_manifest/partition-<p>.jsonl`, fsynced (a torn last line is ignored).
- `StoreFiles` (a URL, `s3://bucket/prefix`, `gs://`, `az://`, `file:///dir`: the object
  store layer of tiered storage, jetstream.tiered.store, with its credentials from the
  broker's environment): an object appears whole when its PUT succeeds, so a file is PUT
  under its final key, then its manifest entry as its own object
  `_manifest/partition-<p>/<first offset>-<end offset>.json` (object stores do not append).
  A crash between the two leaves a file no manifest lists: the next writer of the partition
  deletes such files at or past the manifest's end before it writes (the rows are written
  again from the checkpoint, perhaps cut differently), so a directory listing never holds a
  row twice for long and the manifest never.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Protocol

from jetstream.tiered.store import FragmentStore

MANIFEST_DIR = "_manifest"
TMP_DIR = "_tmp"
_DATA_FILE = re.compile(r"part-(\d{5})-(\d{20})-(\d{20})\.parquet")


def file_name(partition: int, first_offset: int, end_offset: int) -> str:
    return f"part-{partition:05d}-{first_offset:020d}-{end_offset:020d}.parquet"


def entry_of(name: str, partition: int, first: int, end: int, rows: int,
             size_bytes: int) -> dict[str, Any]:
    """A manifest entry: one complete file."""
    return {"file": name, "partition": partition, "first_offset": first, "end_offset": end,
            "rows": rows, "bytes": size_bytes}


class Files(Protocol):
    def prepare(self) -> None:
        """Make what must exist before the first file (blocking IO)."""

    def complete(self, partition: int) -> list[dict[str, Any]]:
        """The partition's complete files (manifest entries), in offset order."""

    def end_offset(self, partition: int) -> int:
        """The end offset of the partition's last complete file (-1: none), after removing
        what a crash left half done."""

    def put(self, partition: int, name: str, payload: bytes, entry: dict[str, Any]) -> None:
        """Store a complete file, then its manifest entry (blocking IO)."""


def is_url(path: str) -> bool:
    return bool(re.match(r"[a-z][a-z0-9+.-]*://", path))


def files_at(path: str) -> Files:
    return StoreFiles(path) if is_url(path) else LocalFiles(Path(path))


class LocalFiles:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def prepare(self) -> None:
        for sub in (TMP_DIR, MANIFEST_DIR):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)

    def complete(self, partition: int) -> list[dict[str, Any]]:
        """A torn last line is left out: its file was renamed but not recorded, and will be
        written again."""
        path = self.directory / MANIFEST_DIR / f"partition-{partition:05d}.jsonl"
        try:
            text = path.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                break
        return out

    def end_offset(self, partition: int) -> int:
        files = self.complete(partition)
        return int(files[-1]["end_offset"]) if files else -1

    def put(self, partition: int, name: str, payload: bytes, entry: dict[str, Any]) -> None:
        tmp = self.directory / TMP_DIR / name
        with open(tmp, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.directory / name)
        _fsync_dir(self.directory)
        manifest = self.directory / MANIFEST_DIR / f"partition-{partition:05d}.jsonl"
        with open(manifest, "a") as out:
            out.write(json.dumps(entry) + "\n")
            out.flush()
            os.fsync(out.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StoreFiles:
    def __init__(self, url: str) -> None:
        self.url = url
        self._store = FragmentStore(url)
        self._prefix = self._store.prefix

    def _key(self, name: str) -> str:
        return f"{self._prefix}/{name}" if self._prefix else name

    def _manifest_prefix(self, partition: int) -> str:
        return self._key(f"{MANIFEST_DIR}/partition-{partition:05d}/")

    def prepare(self) -> None:
        """Nothing to make: listing proves the store answers (and its credentials work)."""
        self._store.list_keys(self._manifest_prefix(0))

    def complete(self, partition: int) -> list[dict[str, Any]]:
        keys = sorted(o.key for o in self._store.list_keys(self._manifest_prefix(partition)))
        entries: list[dict[str, Any]] = [json.loads(self._store.get(k)) for k in keys]
        return entries

    def end_offset(self, partition: int) -> int:
        keys = [o.key for o in self._store.list_keys(self._manifest_prefix(partition))]
        end = max((int(k.rsplit("-", 1)[1].removesuffix(".json")) for k in keys), default=-1)
        # Listing is by path segments: every object under the prefix, this partition's files
        # taken from them. A file no manifest entry covers was left by a crash: removed.
        names = [o.key.removeprefix(self._key("")) for o in self._store.list_keys(
            self._prefix + "/" if self._prefix else "")]
        self._store.delete([self._key(name) for name in sorted(names)
                            if (found := _DATA_FILE.fullmatch(name)) is not None
                            and int(found.group(1)) == partition and int(found.group(3)) > end])
        return end

    def put(self, partition: int, name: str, payload: bytes, entry: dict[str, Any]) -> None:
        self._store.put(self._key(name), payload)
        manifest = (f"{self._manifest_prefix(partition)}{entry['first_offset']:020d}-"
                    f"{entry['end_offset']:020d}.json")
        self._store.put(manifest, json.dumps(entry).encode())
