"""Queue files mapped for dispatch's batch builders (`_queue_file.map_file`, compiled), against
their Python twin (`batch_builder.map_file_python`, Python's mmap module)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from tidemq.store.dispatch import builder as batch_builder
from tidemq.store.queues.consume_queue import UNIT

try:
    from tidemq.store.queues import _queue_file
except ImportError:
    _queue_file = None

compiled = pytest.mark.skipif(_queue_file is None, reason="tidemq/store/queues/_queue_file.c is not built")
BOTH = [pytest.param("compiled", marks=compiled), "python"]


def _map(kind: str):
    return _queue_file.map_file if kind == "compiled" else batch_builder.map_file_python


def test_the_compiled_queue_file_mapping_is_built():
    # `optional` in pyproject.toml: an install without a C compiler maps with Python's mmap module
    assert _queue_file is not None, "tidemq/store/queues/_queue_file.c was not compiled at install"
    assert batch_builder.map_file is _queue_file.map_file


@pytest.mark.parametrize("kind", BOTH)
def test_a_queue_file_is_made_with_its_directories_and_extended_to_its_size(tmp_path, kind):
    map_file = _map(kind)
    path = tmp_path / "consumequeue" / "orders" / "3" / "00000000000000000000"
    mm = map_file(str(path), 400, True)  # neither the topic's directory nor the queue's exists
    assert len(mm) == 400 and path.stat().st_size == 400
    mm[20:40] = UNIT.pack(4096, 150, -7)
    UNIT.pack_into(mm, 0, 0, 99, 12)
    np.frombuffer(mm, np.uint8)[399] = 0xAB  # a writable buffer for NumPy too
    assert mm[20:40] == UNIT.pack(4096, 150, -7) and mm[399] == 0xAB
    mm.close()
    data = path.read_bytes()
    assert data[:40] == UNIT.pack(0, 99, 12) + UNIT.pack(4096, 150, -7) and data[40:399] == bytes(359) and data[399] == 0xAB
    # made again (another process making the same queue): the file and its units are kept
    again = map_file(str(path), 400, True)
    assert again[:40] == data[:40]
    again.close()
    # a shorter file is extended, holes as zeros; a longer one is left as it is
    path.write_bytes(b"\x01" * 100)
    mm = map_file(str(path), 400, False)
    assert path.stat().st_size == 400 and mm[:100] == b"\x01" * 100 and mm[100:] == bytes(300)
    mm.close()
    path.write_bytes(b"\x02" * 800)
    mm = map_file(str(path), 400, False)
    assert len(mm) == 400 and path.stat().st_size == 800
    mm.close()


@pytest.mark.parametrize("kind", BOTH)
def test_a_missing_queue_file_is_none_unless_made(tmp_path, kind):
    map_file = _map(kind)
    assert map_file(str(tmp_path / "t" / "0" / "00000000000000000000"), 400, False) is None  # no directory
    (tmp_path / "t" / "0").mkdir(parents=True)
    assert map_file(str(tmp_path / "t" / "0" / "00000000000000000000"), 400, False) is None  # no file
    assert list((tmp_path / "t" / "0").iterdir()) == []


@pytest.mark.parametrize("kind", BOTH)
def test_a_queue_file_that_cannot_be_made_raises_naming_it(tmp_path, kind):
    map_file = _map(kind)
    (tmp_path / "t").write_bytes(b"a file where the topic's directory belongs")
    path = str(tmp_path / "t" / "0" / "00000000000000000000")
    with pytest.raises(NotADirectoryError) as raised:
        map_file(path, 400, True)
    assert raised.value.filename == path
    with pytest.raises(NotADirectoryError):
        map_file(path, 400, False)  # not a missing file: an error, not None


@compiled
def test_a_compiled_mapping_refuses_misuse_with_clear_errors(tmp_path):
    path = str(tmp_path / "t" / "0" / "00000000000000000000")
    with pytest.raises(ValueError, match="positive size"):
        _queue_file.map_file(path, 0, True)
    mm = _queue_file.map_file(path, 60, True)
    with pytest.raises(IndexError, match="cannot take"):
        mm[0:20] = bytes(19)
    with pytest.raises(IndexError):
        mm[60] = 1
    with pytest.raises(ValueError, match="range"):
        mm[0] = 256
    with pytest.raises(TypeError):
        del mm[0:20]
    assert mm[0:60] == bytes(60)  # nothing was written by the refused assignments
    mm[-1] = 7
    mm[0:60:20] = b"\x01\x02\x03"
    assert mm[0:60:20] == b"\x01\x02\x03" and mm[59] == 7
    view = memoryview(mm)
    with pytest.raises(BufferError, match="exported"):
        mm.close()
    struct.pack_into(">q", view, 8, -1)
    view.release()
    mm.close()
    assert mm.closed
    mm.close()  # closing twice is harmless
    with pytest.raises(ValueError, match="closed"):
        mm[0]
    with pytest.raises(ValueError, match="closed"):
        memoryview(mm)
    with pytest.raises(ValueError, match="closed"):
        len(mm)
    data = (tmp_path / "t" / "0" / "00000000000000000000").read_bytes()
    assert data[0] == 1 and data[8:16] == b"\xff" * 8 and data[20] == 2 and data[40] == 3 and data[59] == 7

