"""Recovery starts where the checkpoint vouches for everything before: after a clean stop the
records before it are not read again at open, and after SIGKILL the key index is cut back to what
it had flushed and rebuilt from there only, finding every acknowledged message by its key."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np

from tidemq.cli import main as cli_main
from tidemq.store import Message, MessageStore, StoreConfig
from tidemq.store.index.index_file import ENTRY_DTYPE, HEADER
from tidemq.store.index.key_index import KeyIndex
from tidemq.store.log.checkpoint import Checkpoint
from tidemq.store.recovery.check import check

CFG = dict(segment_size=16384, consume_queue_units=8)


def fill(path, count=60):
    with MessageStore(path, StoreConfig(**CFG)) as store:
        results = [store.put(Message(topic="t", body=b"body-%04d" % i * 20, queue_id=i % 3)) for i in range(count)]
        assert store.wait_dispatched()
    return results


def flip_body_bit(path, result):
    segment = path / "commitlog" / f"{result.commit_log_offset - result.commit_log_offset % CFG['segment_size']:020d}"
    data = bytearray(segment.read_bytes())
    data[result.commit_log_offset % CFG["segment_size"] + 95] ^= 0x04
    segment.write_bytes(bytes(data))


def test_a_clean_open_does_not_read_the_records_before_the_checkpoint_again(tmp_path, capsys):
    results = fill(tmp_path)
    victim = results[10]
    flip_body_bit(tmp_path, victim)  # damaged on disk after the clean stop
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert not store.recovery.abnormal
        assert store.recovery.scan_from == results[-1].commit_log_offset  # the checkpoint's newest record
        assert store.recovery.messages == []
        assert store.recovery.redispatched_from == store.recovery.end
        got = [bytes(m.body) for m in store.get("t", 1, 0, 100).messages]
        # a read checks the record: the damaged one is skipped and counted, never handed out
        assert b"body-0010" * 20 not in got and len(got) == 19
        assert victim.commit_log_offset in store.damaged_records
    report = check(tmp_path)
    assert not report.sound and any(str(victim.commit_log_offset) in p for p in report.problems)
    assert cli_main(["store", "check", str(tmp_path)]) == 1
    assert f"invalid record at commit-log offset {victim.commit_log_offset}" in capsys.readouterr().out


def test_a_checkpoint_whose_record_is_not_sound_is_not_trusted(tmp_path):
    """The record the checkpoint names was damaged after the stop: the log is validated from the
    segment as without a checkpoint, and the damaged last record is cut as a torn tail."""
    results = fill(tmp_path)
    flip_body_bit(tmp_path, results[-1])
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert store.recovery.scan_from < results[-1].commit_log_offset
        assert store.recovery.end == results[-1].commit_log_offset
        assert sum(store.max_offset("t", q) for q in range(3)) == 59
    assert check(tmp_path).sound


CHILD = textwrap.dedent(
    """
    import sys, time
    from tidemq.store import *
    from tidemq.store.log.checkpoint import Checkpoint

    path = sys.argv[1]
    store = MessageStore(path, StoreConfig(segment_size=1 << 20, index_hash_slots=64, index_max_entries=400,
                                           maintenance_interval_ms=3_600_000))

    def send(start, count):
        for i in range(start, start + count):
            r = store.put(Message(topic="k", body=b"%d" % i * 30, keys=[f"key-{i}"], queue_id=i % 2))
            print("ok", i, r.commit_log_offset, flush=True)

    send(0, 1000)
    assert store.wait_dispatched()
    store.save_checkpoint()  # the only one: what follows is past it
    assert Checkpoint.load(store.checkpoint_path).index_physical_offset == store.commit_log.write_position
    send(1000, 300)
    assert store.wait_dispatched()
    print("sent", flush=True)
    time.sleep(3600)
    """
)


def run_and_kill(path):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    acked = {}
    try:
        for line in child.stdout:
            if line.strip() == "sent":
                break
            _, i, offset = line.split()
            acked[int(i)] = int(offset)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert len(acked) == 1300
    return acked


def index_bytes(path):
    return {p.name: p.read_bytes() for p in sorted((path / "index").iterdir())}


def rebuilt_index(path, tmp):
    """The index files a store rebuilds from its log alone."""
    fresh = tmp / "fresh"
    shutil.copytree(path / "commitlog", fresh / "commitlog")
    with MessageStore(fresh, StoreConfig(segment_size=1 << 20, index_hash_slots=64, index_max_entries=400)) as store:
        assert store.recovery.redispatched_from == 0
    return index_bytes(fresh)


def assert_every_key_found(store, acked):
    for i, offset in acked.items():
        found = store.query_message("k", f"key-{i}")
        assert [r.commit_log_offset for r in found] == [offset], i


def test_after_sigkill_the_key_index_is_rebuilt_from_its_flushed_end_only(tmp_path):
    path = tmp_path / "store"
    acked = run_and_kill(path)
    cp = Checkpoint.load(path / "checkpoint")
    assert 0 < cp.index_physical_offset < acked[1299]
    with MessageStore(path, StoreConfig(segment_size=1 << 20, index_hash_slots=64, index_max_entries=400)) as store:
        assert store.recovery.abnormal
        # validated and redispatched from the checkpoint, not from the start of the log
        assert 0 < store.recovery.scan_from <= cp.confirm_phy_offset
        assert store.recovery.redispatched_from == min(cp.index_physical_offset, cp.confirm_phy_offset)
        assert_every_key_found(store, acked)
    # the entries kept and those indexed again are the index the log alone gives, byte for byte:
    # none lost, none twice
    assert index_bytes(path) == rebuilt_index(path, tmp_path)


def test_after_the_machine_went_down_an_index_file_whose_chains_broke_is_rebuilt(tmp_path):
    """The entries written after the last checkpoint never reached the disk, nor the header
    counting them, but slots pointing at them did: the file cannot be cut back by its chains, so
    it is rebuilt."""
    path = tmp_path / "store"
    acked = run_and_kill(path)
    cp = Checkpoint.load(path / "checkpoint")
    index = KeyIndex(path / "index", 64, 400)
    # the file holding the entries of the first records past the checkpoint, and earlier ones
    (straddling,) = [f for f in index.files if f.header()[2] < cp.index_physical_offset <= f.end_phy]
    phys = straddling.entries["phy"][1 : straddling.index_count].astype(np.int64)
    lost = np.nonzero(phys >= cp.index_physical_offset)[0] + 1
    straddling.entries[lost] = np.zeros(len(lost), dtype=ENTRY_DTYPE)
    begin_ts, end_ts, begin_phy, _, slots, _ = straddling.header()
    keep = int(lost[0])
    HEADER.pack_into(straddling.mm, 0, begin_ts, end_ts, begin_phy, int(phys[keep - 2]), slots, keep)
    # the slot of the newest entry left reached the disk before the newer entries linked it
    straddling.slots[int(straddling.entries[keep - 1]["hash"]) % straddling.hash_slots] = keep - 1
    assert (straddling.slots >= keep).any()  # other slots point at entries the disk lost
    broken = straddling.path.name
    index.close()
    with MessageStore(path, StoreConfig(segment_size=1 << 20, index_hash_slots=64, index_max_entries=400)) as store:
        assert store.recovery.abnormal
        assert store.recovery.redispatched_from < cp.index_physical_offset  # the file's records indexed again
        assert_every_key_found(store, acked)
    assert broken in index_bytes(path)
    assert index_bytes(path) == rebuilt_index(path, tmp_path)
