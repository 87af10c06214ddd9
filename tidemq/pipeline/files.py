"""Where the pipeline reads and writes: plain paths and file://, hdfs://, s3:// URIs.

A *location* is a string: an absolute local path (plain paths and file:// URIs become one, so
local segments keep the fast path: mapped whole into memory) or a URI that `pyarrow.fs` opens
(hdfs://, viewfs://, s3:// (s3a:// and s3n:// are read as s3://), gs://, abfs://).  A URI's query
string carries filesystem options (`s3://bucket/store?region=eu-west-1&endpoint_override=...`)
and stays on every location below it.  Each process (driver, executor) opens a filesystem from
the location itself, so credentials come from that process's environment, as Spark's own do.

`Segment` reads a commit-log segment: a local one mapped whole, any other in windows of
`WINDOW` bytes that move to cover whichever record is read (a record is never split across two
windows, so decoding sees exactly the bytes a mapping would show it).
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import struct
from functools import lru_cache
from urllib.parse import quote, unquote

from ..store import record

SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
S3_ALIASES = ("s3a", "s3n")
WINDOW = 8 << 20  # bytes of a remote segment read at once
_SIZE_MAGIC = struct.Struct(">ii")
_MESSAGE_MAGICS = (record.MESSAGE_MAGIC_CODE, record.MESSAGE_MAGIC_CODE_V2)


def _scheme(text: str) -> str | None:
    match = SCHEME.match(text)
    # a one-letter "scheme" is a Windows drive, not a URI
    return match.group(1).lower() if match and len(match.group(1)) > 1 else None


def normalize(raw: str | os.PathLike) -> str:
    """The location of a path or URI: local ones as absolute paths, others as URIs."""
    text = os.fspath(raw)
    scheme = _scheme(text)
    if scheme is None:
        return os.path.abspath(os.path.expanduser(text))
    if scheme == "file":
        from pyarrow import fs

        return fs.FileSystem.from_uri(text)[1]
    if scheme in S3_ALIASES:
        text = "s3" + text[len(scheme) :]
    return text


def is_local(location: str) -> bool:
    return _scheme(location) is None


def uri(location: str) -> str:
    """The location as a URI for Spark's own readers and writers (file:// for a local path)."""
    if is_local(location):
        from pathlib import Path

        return Path(location).as_uri()
    return location


def _split(location: str) -> tuple[str, str]:
    base, sep, query = location.partition("?")
    return base, sep + query


def join(location: str, *names: str) -> str:
    """The location of `names` below `location` (in a URI, each name percent-encoded: a topic
    may hold '%', '?' or any other character)."""
    if is_local(location):
        return os.path.join(location, *names)
    base, query = _split(location)
    return "/".join([base.rstrip("/"), *(quote(name, safe="") for name in names)]) + query


def basename(location: str) -> str:
    if is_local(location):
        return os.path.basename(os.path.realpath(location))
    return unquote(_split(location)[0].rstrip("/").rsplit("/", 1)[-1])


def parent(location: str) -> str:
    if is_local(location):
        return os.path.dirname(os.path.realpath(location))
    base, query = _split(location)
    return base.rstrip("/").rsplit("/", 1)[0] + query


@lru_cache(maxsize=4096)
def filesystem(location: str):
    """(pyarrow filesystem, its path) of a location, opened once per process."""
    from pyarrow import fs

    if is_local(location):
        return fs.LocalFileSystem(), location
    return fs.FileSystem.from_uri(location)


def _info(location: str):
    fs, path = filesystem(location)
    return fs.get_file_info(path)


def is_dir(location: str) -> bool:
    if is_local(location):
        return os.path.isdir(location)
    from pyarrow import fs

    return _info(location).type == fs.FileType.Directory


def exists(location: str) -> bool:
    if is_local(location):
        return os.path.exists(location)
    from pyarrow import fs

    return _info(location).type != fs.FileType.NotFound


def listdir(location: str) -> list[tuple[str, int, bool]]:
    """(name, size, is a directory) of each entry of a directory, sorted by name."""
    if is_local(location):
        with os.scandir(location) as entries:
            found = [(e.name, e.stat().st_size, e.is_dir()) for e in entries]
        return sorted(found)
    from pyarrow import fs

    filesystem_, path = filesystem(location)
    infos = filesystem_.get_file_info(fs.FileSelector(path))
    return sorted((i.base_name, i.size or 0, i.type == fs.FileType.Directory) for i in infos)


def file_size(location: str) -> int:
    if is_local(location):
        return os.stat(location).st_size
    return _info(location).size or 0


def makedirs(location: str) -> None:
    if is_local(location):
        os.makedirs(location, exist_ok=True)
        return
    filesystem_, path = filesystem(location)
    filesystem_.create_dir(path, recursive=True)


def write_file(location: str, data, size: int | None = None) -> None:
    """Write `data` as the whole file, followed by zeros up to `size` bytes (a local file gets
    them as a hole)."""
    if is_local(location):
        with open(location, "wb") as f:
            f.write(data)
            if size is not None:
                f.truncate(size)
        return
    filesystem_, path = filesystem(location)
    with filesystem_.open_output_stream(path) as f:
        f.write(data)
        left = (size or 0) - len(data)
        while left > 0:
            step = min(left, WINDOW)
            f.write(bytes(step))
            left -= step


def remove_tree(location: str) -> None:
    """Delete a directory and everything in it, if it exists."""
    if is_local(location):
        shutil.rmtree(location, ignore_errors=True)
        return
    filesystem_, path = filesystem(location)
    if exists(location):
        filesystem_.delete_dir(path)


def upload_tree(local_directory: str, location: str) -> None:
    """Copy a local directory's files to `location` (a remote directory)."""
    from pyarrow import fs

    filesystem_, path = filesystem(location)
    filesystem_.create_dir(path, recursive=True)
    fs.copy_files(local_directory, path, destination_filesystem=filesystem_)


class Segment:
    """One commit-log segment opened for reading.  `buf` holds the segment's bytes from `base`;
    `decode(pos)` and `skip(pos, limit)` take positions relative to the segment's start."""

    def __init__(self, location: str, start: int, size: int | None = None) -> None:
        self.location = location
        self.start = start  # the commit-log offset of the segment's first byte
        self.base = 0
        self.mapping: mmap.mmap | None = None
        if is_local(location):
            self.whole = True
            with open(location, "rb") as f:
                self.size = os.fstat(f.fileno()).st_size
                if self.size:
                    self.mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self.buf = self.mapping if self.mapping is not None else b""
        else:
            self.whole = False
            self.size = file_size(location) if size is None else size
            fs, path = filesystem(location)
            self.file = fs.open_input_file(path)
            self.buf = b""

    def cover(self, pos: int, need: int) -> None:
        """Make `buf` hold [pos, pos + need), or up to the segment's end if that comes first."""
        end = self.base + len(self.buf)
        if self.base <= pos and (pos + need <= end or end >= self.size):
            return
        length = max(0, min(self.size - pos, max(need, WINDOW)))
        self.buf, self.base = self.file.read_at(length, pos), pos

    def read(self, pos: int, length: int) -> bytes:
        if not self.whole:
            self.cover(pos, length)
        return bytes(self.buf[pos - self.base : pos - self.base + length])

    def _cover_record(self, pos: int) -> None:
        # the whole record (or blank) at pos, so that decode decides as it would over a mapping
        self.cover(pos, 8)
        rel = pos - self.base
        if len(self.buf) - rel < 8:
            return
        size, magic = _SIZE_MAGIC.unpack_from(self.buf, rel)
        remaining = self.size - pos
        if magic in _MESSAGE_MAGICS and 0 < size <= remaining:
            self.cover(pos, size)
        elif magic == record.BLANK_MAGIC_CODE and 0 < size <= remaining:
            # a blank is valid when it fills the segment: a window must not end where it ends
            self.cover(pos, size if size == remaining else size + 1)

    def decode(self, pos: int, **options) -> record.DecodeResult:
        if not self.whole:
            self._cover_record(pos)
        return record.decode(self.buf, pos - self.base, base_offset=self.start + self.base, **options)

    def skip(self, pos: int, limit: int) -> int:
        """`record.skip_records` over the segment: the first record boundary at or past `limit`,
        or where the size chain stops."""
        if self.whole:
            return record.skip_records(self.buf, pos, limit)
        while True:
            self.cover(pos, 8)
            stop = record.skip_records(self.buf, pos - self.base, limit - self.base) + self.base
            end = self.base + len(self.buf)
            if stop >= limit or end >= self.size:
                return stop
            if stop + 8 <= end:
                size, magic = _SIZE_MAGIC.unpack_from(self.buf, stop - self.base)
                if magic not in _MESSAGE_MAGICS or size < 91 or stop + size > self.size:
                    return stop  # the chain really stops here
                self.cover(stop, size)  # a record running past the window
            pos = stop

    def close(self) -> None:
        if self.mapping is not None:
            self.buf = b""
            try:
                self.mapping.close()
            except BufferError:  # a consumer still holds a view; the mapping goes with it
                pass
        elif not self.whole:
            self.file.close()

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
