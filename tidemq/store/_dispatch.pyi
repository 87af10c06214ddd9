# Types of the compiled parts of dispatch (_dispatch.c, which documents each function).  Column
# arguments are buffers: NumPy arrays of the dtype the C source names, or bytes.
from collections.abc import Callable
from typing import Any

import numpy as np
from typing_extensions import Buffer

# a NumPy array is a buffer (its stub says so only from Python 3.12)
_Column = Buffer | np.ndarray

def java_hash(text: str, /) -> int: ...
def scan_into(
    data: _Column,
    start: int,
    stop: int,
    soft_stop: int,
    base_offset: int,
    wide: _Column,
    narrow: _Column,
    keys: bool = ...,
    /,
) -> tuple[Any, ...]:
    """(count, end, raw topics) and, with `keys`, (hashes, rows, slow keys)."""

def index_append(
    mm: _Column,
    hash_slots: int,
    max_entries: int,
    count: int,
    hashes: _Column,
    phys: _Column,
    timestamps: _Column,
    begin_timestamp: int,
    /,
) -> None: ...
def back_pages(mapping: Buffer, start: int, length: int, /) -> None: ...
def crc_prefix(
    buf: _Column, body_at: _Column, lengths: _Column, crcs: _Column, crc32: Callable[[Any], int], /
) -> int: ...

class RunCache:
    def clear(self) -> None: ...

def write_runs(
    files: dict[Any, Any],
    names: list[str],
    units_per_file: dict[Any, int],
    default_units_per_file: int,
    groups: _Column,
    units: _Column,
    open_file: Callable[..., Any] | None,
    cache: RunCache | None = ...,
    /,
) -> list[int]: ...

class RowIndex:
    def set(self, code: int, row: int, /) -> None: ...
    def get(self, code: int, /) -> int: ...
    def advance(
        self,
        numbers: _Column,
        topic_ids: _Column,
        queue_ids: _Column,
        firsts: _Column,
        counts: _Column,
        frontiers: _Column,
        files_end: _Column,
        pending: _Column,
        skip: _Column | None,
        rows: _Column,
        /,
    ) -> int: ...
