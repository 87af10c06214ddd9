"""Appends on a disk past RocketMQ's diskSpaceWarningLevelRatio: refused with nothing stored,
reads unaffected, taken again once space is freed.  The disk's usage is injected."""

import errno
import json
import subprocess
import sys

import pytest

from tidemq.store import Message, MessageStore, StoreConfig, StoreIOError
from tidemq.store.log.disk_space import Usage


class Disk:
    """shutil.disk_usage of a disk whose use the test sets (percent)."""

    def __init__(self) -> None:
        self.used_percent = 10

    def __call__(self, path) -> Usage:
        return Usage(1000, 10 * self.used_percent, 1000 - 10 * self.used_percent)


def test_appends_are_refused_past_the_warning_level_and_taken_again_below_it(tmp_path):
    disk = Disk()
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 20, dispatch_workers=0, disk_usage=disk)) as store:
        store.put(Message(topic="T", body=b"stored"))
        disk.used_percent = 91
        store.run_maintenance()
        end = store.commit_log.write_position
        for attempt in (lambda: store.put(Message(topic="T", body=b"common")),
                        lambda: store.put(Message(topic="T", body=b"props", properties={"a": "1"})),
                        lambda: store.put_batch([Message(topic="T", body=b"batch")] * 2)):
            with pytest.raises(StoreIOError) as refused:
                attempt()
            assert refused.value.errno == errno.ENOSPC and "91.0% used" in str(refused.value)
        assert store.commit_log.write_position == end  # nothing stored
        store.wait_dispatched()
        assert [bytes(m.body) for m in store.get("T", 0, 0, 8).messages] == [b"stored"]  # reads go on
        disk.used_percent = 90  # at the level is not over it
        store.run_maintenance()
        store.put(Message(topic="T", body=b"again"))
        store.wait_dispatched()
        assert [bytes(m.body) for m in store.get("T", 0, 0, 8).messages] == [b"stored", b"again"]


def test_a_warning_level_out_of_range_is_refused(tmp_path):
    with pytest.raises(ValueError, match="within 1-100"):
        MessageStore(tmp_path, StoreConfig(disk_space_warning_level_ratio=0))


# Run in a mount namespace of its own (util-linux's `unshare`, as root or not) on a 16 MB tmpfs:
# a store appends, then another writer takes every free block, then the store appends a few more
# records into the commit-log blocks it had allocated.  Their key-index entries start a new page
# of the index file (its entries begin at byte 40 + 4 x 50,000; the 21st entry crosses a page):
# dispatch waits for space instead of dying of SIGBUS, reads go on, and once space is freed every
# record is dispatched.
ON_A_FULL_TMPFS = r"""
import json, os, sys
from pathlib import Path
from tidemq.store import Message, MessageStore, StoreConfig

disk = Path(sys.argv[1])
config = StoreConfig(segment_size=4 << 20, dispatch_workers=0, disk_space_warning_level_ratio=100,
                     index_hash_slots=50_000, index_max_entries=200_000)
with MessageStore(disk / "store", config) as store:
    for i in range(10):  # two index entries each (UNIQ_KEY, the key): entries 1-20
        store.put(Message(topic="T", body=b"early %d" % i, keys=["k%d" % i]))
    assert store.wait_dispatched()
    try:
        with open(disk / "filler", "wb") as f:
            while True:
                f.write(bytes(1 << 16))
                f.flush()
    except OSError:
        pass
    for i in range(10, 20):
        store.put(Message(topic="T", body=b"late %d" % i, keys=["k%d" % i]))
    waited = not store.wait_dispatched(timeout=1.0)
    readable = [bytes(m.body) for m in store.get("T", 0, 0, 64).messages]
    (disk / "filler").unlink()
    resumed = store.wait_dispatched(timeout=20.0)
    bodies = []
    while len(bodies) < 20 and (batch := store.get("T", 0, len(bodies), 64).messages):
        bodies += [bytes(m.body) for m in batch]
    late_key = len(store.key_index.lookup("T", "k19"))
print(json.dumps({"waited": waited, "readable": len(readable), "resumed": resumed, "bodies": len(bodies),
                  "distinct": len(set(bodies)), "late_key": late_key}))
"""


def test_dispatch_on_a_full_disk_waits_for_space_instead_of_dying(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    script = 'mount -t tmpfs -o size=16m tmpfs "$0" && exec "$@"'
    run = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, str(mount),
                          sys.executable, "-c", ON_A_FULL_TMPFS, str(mount)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]  # -7 (SIGBUS) when a page had no block
    result = json.loads(run.stdout.splitlines()[-1])
    # the queue's units were written (readable) before the index entries that waited
    assert result == {"waited": True, "readable": 20, "resumed": True, "bodies": 20, "distinct": 20, "late_key": 1}
    assert "dispatch waits at commit-log offset" in run.stderr and "Traceback" not in run.stderr
