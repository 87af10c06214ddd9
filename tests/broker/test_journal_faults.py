"""The pop journal on a disk that refuses writes (full): the write is checked, a refused line is
taken back whole, the call fails with a precise status and changes nothing; a journal damaged in
the middle is reported by `store check` and mended by `store repair`.

The full disk is an injected writer (the journal's `write`): it writes part of a line and returns
the short count, or raises ENOSPC, as write(2) does on a full file system."""

import errno
import os
import subprocess
import sys

import pytest

from tidemq.broker import BrokerError, Code
from tidemq.broker.codes import DISK_FULL


class FullDisk:
    """write(2) on a full disk: the first call takes `room` bytes, later ones fail with ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __call__(self, fd: int, data: bytes) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken = os.write(fd, data[: self.room])
        self.room = 0
        return taken


@pytest.fixture
def h(harness):
    return harness


def journal_bytes(h) -> bytes:
    return (h.directory / "pop" / "journal").read_bytes()


def test_a_receive_on_a_full_disk_fails_precisely_and_delivers_nothing(h):
    h.send("T", b"m0")
    before = journal_bytes(h)
    h.broker.journal.write = FullDisk(room=7)  # half a line, then nothing
    with pytest.raises(BrokerError) as refused:
        h.receive("G", "T")
    assert refused.value.code == DISK_FULL == Code.TOO_MANY_REQUESTS and "No space left" in refused.value.message
    with pytest.raises(BrokerError):
        h.receive("G", "T")  # ENOSPC this time
    assert journal_bytes(h) == before  # the torn part was cut: the journal ends with a whole line
    assert h.broker.subscriptions[("G", "T")].in_flight_count() == 0
    h.broker.journal.write = os.write  # space is freed
    (r,) = h.receive("G", "T")
    assert r.record.body == b"m0" and r.delivery_attempt == 1
    h.close()
    h.open()  # the journal replays
    assert h.receive("G", "T") == []  # still in flight after the restart


def test_a_redelivery_refused_by_the_disk_stays_due_as_it_was(h):
    h.send("T", b"m0")
    (first,) = h.receive("G", "T", invisible_ms=10_000)
    h.clock.advance(10_000)
    h.broker.journal.write = FullDisk(room=0)
    with pytest.raises(BrokerError):
        h.receive("G", "T")
    h.broker.journal.write = os.write
    (again,) = h.receive("G", "T")
    assert again.delivery_attempt == 2  # the refused pop did not count as an attempt


def test_ack_and_change_invisible_on_a_full_disk_fail_and_change_nothing(h):
    h.send("T", b"m0")
    (r,) = h.receive("G", "T", invisible_ms=10_000)
    h.broker.journal.write = FullDisk(room=3)
    (error,) = h.broker.ack_many("G", "T", [r.receipt_handle])
    assert error.code == DISK_FULL
    with pytest.raises(BrokerError) as refused:
        h.broker.change_invisible("G", "T", r.receipt_handle, 60_000)
    assert refused.value.code == DISK_FULL
    h.broker.journal.write = os.write
    h.clock.advance(10_000)  # the old deadline stands: it comes back
    (again,) = h.receive("G", "T")
    h.broker.ack("G", "T", again.receipt_handle)
    h.close()
    h.open()
    h.clock.advance(100_000)
    assert h.receive("G", "T") == []


def tidemq(*args):
    return subprocess.run([sys.executable, "-m", "tidemq.cli", *args], capture_output=True, text=True, timeout=120)


def test_check_reports_a_journal_damaged_in_the_middle_and_repair_mends_it(h):
    for i in range(3):
        h.send("T", b"m%d" % i)
    got = h.receive("G", "T", invisible_ms=10_000)
    h.broker.ack("G", "T", got[0].receipt_handle)
    h.close()
    path = h.directory / "pop" / "journal"
    lines = path.read_bytes().split(b"\n")
    # a half-written line with whole lines after it, as a disk that filled up and emptied leaves
    path.write_bytes(b"\n".join(lines[:-1]) + b'\n["F","G","T",[[0,\n' + lines[-2] + b"\n")
    with pytest.raises(ValueError, match="line .* is corrupt"):
        h.open()
    h.store.close()  # the broker refused to start on it
    checked = tidemq("store", "check", str(h.directory))
    assert checked.returncode == 1 and "pop journal" in checked.stdout and "damaged" in checked.stdout
    repaired = tidemq("store", "repair", str(h.directory))
    assert repaired.returncode == 0 and "dropped 1 damaged line" in repaired.stdout
    assert list((h.directory / "repair").glob("pop-journal-damaged-lines-*"))
    assert tidemq("store", "check", str(h.directory)).returncode == 0
    h.open()
    h.clock.advance(10_000)
    assert sorted(r.record.body for r in h.receive("G", "T")) == sorted(r.record.body for r in got[1:])
