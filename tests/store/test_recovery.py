"""Recovery as ordinary tests: damage the files, reopen, assert exactly what survived."""

import logging
import shutil

import pytest

from tidemq.cli import main as cli_main
from tidemq.store import CorruptStoreError, Message, MessageStore, StoreConfig, record
from tidemq.store.check import check

CFG = dict(segment_size=16384, consume_queue_units=8)


def fill(path, count=60, queues=3):
    results = []
    with MessageStore(path, StoreConfig(**CFG)) as store:
        for i in range(count):
            results.append(store.put(Message(topic="t", body=b"body-%04d" % i * 20, queue_id=i % queues, tags="k%d" % (i % 2))))
        assert store.wait_dispatched()
    return results


def snapshot_queues(path):
    root = path / "consumequeue"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def bodies(store, queues=3):
    out = {}
    for q in range(queues):
        out[q] = [bytes(m.body) for m in store.get("t", q, 0, 1000).messages]
    return out


def segment_file(path, offset):
    name = f"{offset - offset % CFG['segment_size']:020d}"
    return path / "commitlog" / name, offset % CFG["segment_size"]


def test_clean_restart_keeps_everything(tmp_path):
    results = fill(tmp_path)
    before = snapshot_queues(tmp_path)
    assert not (tmp_path / "abort").exists()
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert not store.recovery.abnormal
        assert store.recovery.redispatched_from == store.recovery.end  # nothing to rebuild
        assert [store.max_offset("t", q) for q in range(3)] == [20, 20, 20]
        assert store.read_record(results[-1].commit_log_offset).queue_offset == 19
    assert snapshot_queues(tmp_path) == before


def test_torn_tail_is_cut_and_logged(tmp_path, caplog):
    results = fill(tmp_path)
    last = results[-1]
    path, pos = segment_file(tmp_path, last.commit_log_offset)
    data = bytearray(path.read_bytes())
    half = last.size // 2
    data[pos + half : pos + last.size] = bytes(last.size - half)  # the write was torn half way
    path.write_bytes(bytes(data))
    (tmp_path / "abort").write_text("12345")  # and the process died
    with caplog.at_level(logging.WARNING, logger="tidemq"):
        with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
            assert store.recovery.abnormal
            assert store.recovery.end == last.commit_log_offset
            assert store.max_offset("t", 2) == 19  # message 59 (queue 2, offset 19) is gone
            assert store.max_offset("t", 0) == 20 and store.max_offset("t", 1) == 20
            assert store.put(Message(topic="t", body=b"again", queue_id=2)).queue_offset == 19
    assert any("torn tail" in r.message and str(last.commit_log_offset) in r.message for r in caplog.records)
    assert check(tmp_path).sound


def test_consume_queue_entries_past_the_log_end_are_dropped(tmp_path):
    results = fill(tmp_path)
    cut = results[-5]
    path, pos = segment_file(tmp_path, cut.commit_log_offset)
    data = bytearray(path.read_bytes())
    data[pos:] = bytes(len(data) - pos)  # the last 5 records never reached the disk
    path.write_bytes(bytes(data))
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert sum(store.max_offset("t", q) for q in range(3)) == 55
        got = bodies(store)
        assert sum(len(v) for v in got.values()) == 55
    assert check(tmp_path).sound


def test_flipped_bit_in_the_middle_refuses_to_open_until_repaired(tmp_path, capsys):
    results = fill(tmp_path)
    victim = results[10]
    path, pos = segment_file(tmp_path, victim.commit_log_offset)
    data = bytearray(path.read_bytes())
    data[pos + 95] ^= 0x04  # one bit of the body
    path.write_bytes(bytes(data))
    assert cli_main(["store", "check", str(tmp_path)]) == 1
    assert f"invalid record at commit-log offset {victim.commit_log_offset}" in capsys.readouterr().out
    with pytest.raises(CorruptStoreError) as err:
        MessageStore(tmp_path, StoreConfig(**CFG))
    assert err.value.offset == victim.commit_log_offset
    assert "tidemq store repair" in str(err.value)
    assert cli_main(["store", "repair", str(tmp_path)]) == 0
    assert "corrupt record" in capsys.readouterr().out
    saved = list((tmp_path / "repair").iterdir())
    assert saved and saved[0].read_bytes()[:4] == victim.size.to_bytes(4, "big")  # the cut bytes are kept
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert sum(store.max_offset("t", q) for q in range(3)) == 10
        assert store.put(Message(topic="t", body=b"x", queue_id=victim.queue_offset % 3)).size > 0
    assert cli_main(["store", "check", str(tmp_path)]) == 0


def test_deleted_consume_queues_are_rebuilt_byte_for_byte(tmp_path):
    fill(tmp_path)
    before = snapshot_queues(tmp_path)
    shutil.rmtree(tmp_path / "consumequeue")
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert bodies(store)[1][0] == b"body-0001" * 20
    assert snapshot_queues(tmp_path) == before
    shutil.rmtree(tmp_path / "consumequeue" / "t" / "1")  # one queue only
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert any("rebuilding" in m for m in store.recovery.messages)
    assert snapshot_queues(tmp_path) == before
    middle = sorted((tmp_path / "consumequeue" / "t" / "0").iterdir())[1]
    middle.unlink()  # a file in the middle of a queue
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert [int(bytes(b)[5:9]) for b in bodies(store)[0]] == list(range(0, 60, 3))
    assert snapshot_queues(tmp_path) == before


@pytest.mark.parametrize("workers", [0, 2])
def test_a_deleted_queue_met_past_its_first_slot_is_rebuilt_from_the_whole_log(tmp_path, workers):
    """The queue of the newest record lost its files: the other queues cover the log up to that
    record, so the redispatch starts there, at the queue's slot 19.  Recovery must not start the
    queue at 19; it rebuilds it from the start of the log."""
    results = fill(tmp_path)
    before = snapshot_queues(tmp_path)
    shutil.rmtree(tmp_path / "consumequeue" / "t" / "2")
    with MessageStore(tmp_path, StoreConfig(**CFG, dispatch_workers=workers)) as store:
        assert store.recovery.redispatched_from == results[-1].commit_log_offset
        assert any("rebuilding" in m for m in store.recovery.messages)
        assert store.min_offset("t", 2) == 0
        assert bodies(store)[2] == [b"body-%04d" % i * 20 for i in range(2, 60, 3)]
    assert snapshot_queues(tmp_path) == before


def test_stale_abort_marker(tmp_path):
    fill(tmp_path)
    before = snapshot_queues(tmp_path)
    (tmp_path / "abort").write_text("999999")
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert store.recovery.abnormal
        assert sum(store.max_offset("t", q) for q in range(3)) == 60
    assert not (tmp_path / "abort").exists()
    assert snapshot_queues(tmp_path) == before


def test_inspect_reports_segments_queues_and_lag(tmp_path, capsys):
    results = fill(tmp_path, count=30)
    assert cli_main(["store", "inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"end offset {results[-1].commit_log_offset + results[-1].size}" in out
    assert "t/0  min 0  max 10" in out and "dispatch lag: 0 bytes" in out


def test_empty_store_opens_and_checks(tmp_path):
    with MessageStore(tmp_path, StoreConfig(**CFG)) as store:
        assert store.queues() == [] and store.get("t", 0, 0, 10).messages == []
    assert check(tmp_path).sound
    assert record.decode(b"", 0) == record.EndOfData(0)
