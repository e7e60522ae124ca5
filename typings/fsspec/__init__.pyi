from contextlib import AbstractContextManager
from types import TracebackType
from typing import IO, Any

class OpenFile(AbstractContextManager[IO[bytes]]):
    def __enter__(self) -> IO[bytes]: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

class AbstractFileSystem:
    def exists(self, path: str) -> bool: ...

def url_to_fs(url: str, **kwargs: Any) -> tuple[AbstractFileSystem, str]: ...

# Opened in a binary mode ("rb"): the only mode Jetstream uses.
def open(urlpath: str, mode: str = "rb", compression: str | None = None,
         **kwargs: Any) -> OpenFile: ...
