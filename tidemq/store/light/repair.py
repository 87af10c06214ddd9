"""`store repair` for light queues that are RocketMQ file queues (`consumequeue/%LMQ%name/0/`):
the units `store check` found missing or wrong, written at their slots before the store opens
(its recovery cuts a file queue back to its first hole and would not rebuild what lies past it).
The key-value tables are mended through the open store (`LightQueues.repair_units`)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from ..format.special_queues import LMQ_QUEUE_ID
from ..queues.consume_queue import DEFAULT_UNITS_PER_FILE, UNIT_SIZE, file_name

_UNIT = struct.Struct(">qiq")


def repair_file_units(store_dir: Path, fixes: list[tuple[str, str, int, tuple[int, int, int, int] | None]]) -> int:
    """Write each file-queue fix's unit (form "file") at its slot, in the queue's files (a file
    missing is made at the size of the queue's others, else the default); returns how many."""
    applied = 0
    for form, name, slot, unit in fixes:
        if form != "file" or unit is None:
            continue
        directory = Path(store_dir) / "consumequeue" / name / str(LMQ_QUEUE_ID)
        sizes = [p.stat().st_size for p in directory.iterdir() if p.name.isdigit()] if directory.is_dir() else []
        file_bytes = max(sizes, default=0) or DEFAULT_UNITS_PER_FILE * UNIT_SIZE
        per_file = file_bytes // UNIT_SIZE
        start = slot - slot % per_file
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / file_name(start * UNIT_SIZE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < file_bytes:
                os.ftruncate(fd, file_bytes)
            os.pwrite(fd, _UNIT.pack(unit[0], unit[1], unit[2]), (slot - start) * UNIT_SIZE)
            os.fsync(fd)
        finally:
            os.close(fd)
        applied += 1
    return applied
