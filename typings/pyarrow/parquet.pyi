from typing import IO, Any

from pyarrow import BufferOutputStream, Table

def write_table(table: Table, where: str | IO[bytes] | BufferOutputStream,
                compression: str = "snappy", *, row_group_size: int | None = None,
                write_statistics: bool | list[str] = True,
                write_page_checksum: bool = False,
                use_dictionary: bool | list[str] = True,
                dictionary_pagesize_limit: int | None = None) -> None: ...
def read_table(source: Any, columns: list[str] | None = None, **kwargs: Any) -> Table: ...

class FileMetaData:
    @property
    def num_row_groups(self) -> int: ...
    def row_group(self, i: int) -> Any: ...

def read_metadata(where: Any) -> FileMetaData: ...
