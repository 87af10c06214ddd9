"""Appends on a disk past RocketMQ's diskSpaceWarningLevelRatio: refused with nothing stored,
reads unaffected, taken again once space is freed.  The disk's usage is injected."""

import errno

import pytest

from tidemq.store import Message, MessageStore, StoreConfig, StoreIOError
from tidemq.store.disk_space import Usage


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
