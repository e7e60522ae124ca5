from collections.abc import Callable
from typing import Any

from typing_extensions import Buffer

class ExtType:
    code: int
    data: bytes
    def __init__(self, code: int, data: bytes) -> None: ...

class Timestamp:
    seconds: int
    nanoseconds: int
    def __init__(self, seconds: int, nanoseconds: int = 0) -> None: ...

class Packer:
    def __init__(self, *, default: Callable[[Any], Any] | None = None,
                 use_single_float: bool = False, autoreset: bool = True,
                 use_bin_type: bool = True, strict_types: bool = False,
                 datetime: bool = False, unicode_errors: str | None = None) -> None: ...
    def pack(self, obj: Any) -> bytes: ...

def packb(o: Any, *, default: Callable[[Any], Any] | None = None,
          use_single_float: bool = False, use_bin_type: bool = True,
          strict_types: bool = False, datetime: bool = False) -> bytes: ...

# The decoded value is whatever the bytes hold: callers check its shape.
def unpackb(packed: Buffer, *, raw: bool = False, use_list: bool = True,
            strict_map_key: bool = True, max_buffer_size: int = 0,
            max_str_len: int = -1, max_bin_len: int = -1, max_array_len: int = -1,
            max_map_len: int = -1, max_ext_len: int = -1,
            ext_hook: Callable[[int, bytes], Any] = ...,
            timestamp: int = 0) -> Any: ...

class UnpackException(Exception): ...
class ExtraData(UnpackException, ValueError): ...
class FormatError(UnpackException, ValueError): ...
class StackError(UnpackException, ValueError): ...
