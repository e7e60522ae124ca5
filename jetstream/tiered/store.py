"""A fragment store: one BLOB store behind one library (obstore) for every backend.

Theory of operation: a stream's `fragment_store` URL names a bucket (or a directory, for
`file://`) and a key prefix. obstore (Rust's object_store, the one Arrow and DataFusion use)
serves S3, GCS, Azure and the local file system with one API, sync (the offload runs in the
broker's executor) and async (reads run on the event loop). Credentials and endpoints come
from the broker's environment (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`,
`GOOGLE_*`, `AZURE_*`), never from the replicated stream config. Every request has a timeout
and few retries of its own: the offload retries whole passes with backoff, so one stuck
request never holds a thread for long. Every failure of the store is a
FragmentStoreUnavailable (stable code FRAGMENT_STORE_UNAVAILABLE) naming the URL.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import NotFoundError
from obstore.store import LocalStore, ObjectStore, from_url

from jetstream.errors import FragmentStoreUnavailable

if TYPE_CHECKING:
    from obstore._store._client import ClientConfig
    from obstore._store._retry import RetryConfig
from jetstream.tiered.index import StoredFragment
from jetstream.tiered.names import BadFragmentName, FragmentName, parse_key, partition_prefix

#: Per request: connect and total timeouts, and obstore's own retries.
CONNECT_TIMEOUT = "2s"
REQUEST_TIMEOUT = "30s"
REQUEST_RETRIES_MAX = 2
#: Most keys one listing of a partition reads (fragments are ~segment sized: this is many TB).
LIST_KEYS_MAX = 1_000_000
#: A read of a larger object asks for parts of this size at once.
GET_PART_BYTES = 2 << 20
#: A store error's reason is cut to this many characters.
REASON_CHARS_MAX = 400
#: The environment variables of each scheme's store start with this.
_ENV_PREFIX = {"s3": "AWS", "s3a": "AWS", "gs": "GOOGLE", "az": "AZURE", "abfs": "AZURE",
               "abfss": "AZURE"}


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size_bytes: int
    modified_ms: int


def _modified_ms(meta: Any) -> int:
    value = meta["last_modified"]
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value)


class FragmentStore:
    """The store at `url` (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self._store: ObjectStore
        if parts.scheme == "file":
            root = Path(parts.path)
            root.mkdir(parents=True, exist_ok=True)
            self._store = LocalStore(str(root))
            self.prefix = ""
        else:
            options: ClientConfig = {"connect_timeout": CONNECT_TIMEOUT,
                                     "timeout": REQUEST_TIMEOUT}
            # Options given here replace the environment's: keep its plain-HTTP switch.
            if os.environ.get(f"{_ENV_PREFIX.get(parts.scheme, 'AWS')}_ALLOW_HTTP",
                              "").lower() in ("1", "true", "yes"):
                options["allow_http"] = True
            retry: RetryConfig = {"max_retries": REQUEST_RETRIES_MAX,
                                  "retry_timeout": datetime.timedelta(seconds=20)}
            bucket = f"{parts.scheme}://{parts.netloc}"
            if parts.scheme in ("s3", "s3a"):
                # No SHA-256 of each payload for the request signature (measured: 1.4x the
                # puts a second): TLS guards the bytes in flight, the object's size is
                # checked after the put and its SHA-256 (in its name) on every read.
                self._store = from_url(bucket, client_options=options, retry_config=retry,
                                       unsigned_payload=True)
            else:
                self._store = from_url(bucket, client_options=options, retry_config=retry)
            self.prefix = parts.path.strip("/")

    def key(self, name: FragmentName) -> str:
        return name.key(self.prefix)

    def url_of(self, name: FragmentName) -> str:
        return f"{self.url.rstrip('/')}/{name.key('')}"

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (NotFoundError, FileNotFoundError):
            raise
        except Exception as exc:  # obstore raises its own tree, and OSError for files
            raise FragmentStoreUnavailable(self.url, f"{what}: {_first_line(exc)}") from exc

    # -- sync (the executor) ----------------------------------------------------------------

    def put(self, key: str, payload: bytes) -> None:
        with self._errors(f"put {key}"):
            # One PUT, not a multipart upload: a fragment is segment-sized (S3 takes up to
            # 5 GB in one PUT), and a multipart upload costs three round trips more.
            obstore.put(self._store, key, payload, use_multipart=False)

    def head(self, key: str) -> ObjectInfo | None:
        """The object's size and modification time; None when it is not there."""
        try:
            with self._errors(f"head {key}"):
                meta = obstore.head(self._store, key)
        except (NotFoundError, FileNotFoundError):
            return None
        return ObjectInfo(key, int(meta["size"]), _modified_ms(meta))

    def get(self, key: str) -> bytes:
        with self._errors(f"get {key}"):
            return bytes(obstore.get(self._store, key).bytes())

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                with self._errors(f"delete {key}"):
                    obstore.delete(self._store, key)
            except (NotFoundError, FileNotFoundError):
                pass  # gone already: what a delete wants

    def list_partition(self, stream: str, partition: int) -> list[StoredFragment]:
        """The fragments of a partition the store lists now (other keys are skipped)."""
        prefix = partition_prefix(self.prefix, stream, partition)
        out: list[StoredFragment] = []
        with self._errors(f"list {prefix}"):
            for chunk in obstore.list(self._store, prefix, chunk_size=1000):
                for meta in chunk:
                    try:
                        name = parse_key(str(meta["path"]), self.prefix)
                    except BadFragmentName:
                        continue
                    out.append(StoredFragment(name, int(meta["size"]), _modified_ms(meta)))
                    if len(out) >= LIST_KEYS_MAX:
                        return out
        return out

    def list_keys(self, prefix: str) -> list[ObjectInfo]:
        """Every key under `prefix` (tests and benches)."""
        with self._errors(f"list {prefix}"):
            return [ObjectInfo(str(m["path"]), int(m["size"]), _modified_ms(m))
                    for chunk in obstore.list(self._store, prefix, chunk_size=1000)
                    for m in chunk]

    # -- async (the event loop) -------------------------------------------------------------

    async def get_async(self, key: str, size_bytes: int = 0) -> list[memoryview]:
        """The object's bytes, in the parts they came in (buffers the store library owns:
        no copy is made on the event loop; whoever needs one `bytes` joins them). One of a
        known `size_bytes` past GET_PART_BYTES comes in parts requested at once (an object
        store serves each part on a connection of its own: the first bytes arrive sooner,
        the whole faster)."""
        with self._errors(f"get {key}"):
            if size_bytes <= GET_PART_BYTES:
                result = await obstore.get_async(self._store, key)
                return [memoryview(await result.bytes_async())]
            parts = await asyncio.gather(*(
                obstore.get_range_async(self._store, key, start=start,
                                        end=min(size_bytes, start + GET_PART_BYTES))
                for start in range(0, size_bytes, GET_PART_BYTES)))
            return [memoryview(part) for part in parts]


def _first_line(exc: Exception) -> str:
    """obstore's errors carry a multi-line debug dump after their first line."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:REASON_CHARS_MAX]


class StoreRegistry:
    """One FragmentStore per URL for the whole broker (a client and its connection pool each
    cost something), made on first use."""

    def __init__(self) -> None:
        self._stores: dict[str, FragmentStore] = {}
        self._lock = threading.Lock()  # the executor's threads make stores too

    def get(self, url: str) -> FragmentStore:
        with self._lock:
            store = self._stores.get(url)
            if store is None:
                try:
                    store = FragmentStore(url)
                except FragmentStoreUnavailable:
                    raise
                except Exception as exc:  # a URL obstore cannot build a client for
                    raise FragmentStoreUnavailable(url, _first_line(exc)) from exc
                self._stores[url] = store
            return store
