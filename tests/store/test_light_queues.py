"""Light message queues (RIP-28 multi-dispatch) through the store's facade, for both homes of a
light queue: the key-value tables ("kv") and RocketMQ's file queues ("file")."""

import subprocess
import sys
import textwrap

import pytest

from tidemq.cli import main as cli_main
from tidemq.store import Message, MessageStore, StoreConfig
from tidemq.store.errors import InvalidMessageError

MULTI = "INNER_MULTI_DISPATCH"
OFFSETS = "INNER_MULTI_QUEUE_OFFSET"
BACKENDS = ["kv", "file"]


def config(backend, **kwargs):
    return StoreConfig(light_queue_store=backend, dispatch_workers=0, segment_size=1 << 20, **kwargs)


def light(names, body=b"m", topic="parent", **kwargs):
    return Message(topic=topic, body=body, properties={MULTI: ",".join(names)}, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_message_to_three_light_queues_is_stored_once_and_read_from_each(tmp_path, backend):
    with MessageStore(tmp_path, config(backend)) as store:
        arrivals = []
        store.subscribe(lambda changes: arrivals.append(dict(changes)))
        store.put(light(["%LMQ%a"], body=b"first"))
        store.put(light(["%LMQ%b"], body=b"second"))
        result = store.put(light(["%LMQ%a", "%LMQ%b", "%LMQ%c"], body=b"fan-out", tags="t"))
        assert store.wait_dispatched()
        # stored once: one record in the log, the parent queue holds three
        assert store.commit_log.write_position == result.commit_log_offset + result.size
        assert store.max_offset("parent", 0) == 3
        expected = {"%LMQ%a": 1, "%LMQ%b": 1, "%LMQ%c": 0}
        for name, offset in expected.items():
            got = store.get(name, 0, offset)
            assert [(m.commit_log_offset, bytes(m.body)) for m in got.messages] == [(result.commit_log_offset, b"fan-out")]
            assert (got.min_offset, got.max_offset, got.next_offset) == (0, offset + 1, offset + 1)
            assert store.max_offset(name, 0) == store.assigned_offset(name, 0) == offset + 1
            units = store.read_units(name, 0, 0, 10)
            assert [u.queue_offset for u in units] == list(range(offset + 1))
            assert units[-1].commit_log_offset == result.commit_log_offset and units[-1].size == result.size
        record = store.get("%LMQ%c", 0, 0).messages[0]
        assert record.properties[OFFSETS] == "1,1,0"
        assert (record.topic, record.queue_offset) == ("parent", 2)
        woken = {key: value for changes in arrivals for key, value in changes.items()}
        assert woken[("%LMQ%a", 0)] == 2 and woken[("%LMQ%c", 0)] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_light_queues_survive_a_clean_reopen(tmp_path, backend, capsys):
    with MessageStore(tmp_path, config(backend)) as store:
        for i in range(5):
            store.put(light(["%LMQ%x", f"%LMQ%y{i % 2}"], body=b"%d" % i))
    with MessageStore(tmp_path, config(backend)) as store:
        assert store.max_offset("%LMQ%x", 0) == 5
        assert [bytes(m.body) for m in store.get("%LMQ%y1", 0, 0).messages] == [b"1", b"3"]
        result = store.put(light(["%LMQ%x"], body=b"next"))
        store.wait_dispatched()
        assert store.get("%LMQ%x", 0, 5).messages[0].commit_log_offset == result.commit_log_offset
    assert cli_main(["store", "inspect", str(tmp_path)]) == 0
    kv, files = (3, 0) if backend == "kv" else (0, 3)
    out = capsys.readouterr().out
    assert f"light queues: 3 ({kv} in the key-value tables" in out and f"; {files} file queues)" in out


def test_a_producer_cannot_set_the_offsets_nor_put_to_a_light_queue(tmp_path):
    with MessageStore(tmp_path, config("kv")) as store:
        message = light(["%LMQ%a"], body=b"x")
        message.properties[OFFSETS] = "41"
        store.put(message)
        store.wait_dispatched()
        assert store.get("%LMQ%a", 0, 0).messages[0].properties[OFFSETS] == "0"
        with pytest.raises(InvalidMessageError, match="multi-dispatch"):
            store.put(Message(topic="%LMQ%a", body=b"direct"))
        with pytest.raises(InvalidMessageError, match="light queue name"):
            store.put(light(["%LMQ%a/b"]))
        assert store.max_offset("%LMQ%a", 0) == 1


def test_multi_dispatch_switched_off_ignores_the_property(tmp_path):
    with MessageStore(tmp_path, config("kv", enable_multi_dispatch=False)) as store:
        store.put(light(["%LMQ%a"]))
        store.wait_dispatched()
        assert store.max_offset("%LMQ%a", 0) == 0
        assert OFFSETS not in store.get("parent", 0, 0).messages[0].properties


def test_expiry_removes_idle_consumed_light_queues_with_their_offsets_and_never_a_live_one(tmp_path):
    now = [1_000_000]
    cfg = config("kv", clock=lambda: now[0], light_queue_idle_expiry_ms=60_000, maintenance_interval_ms=3_600_000)
    with MessageStore(tmp_path, cfg) as store:
        names = ["%LMQ%consumed", "%LMQ%backlog", "%LMQ%recent", "%LMQ%unread"]
        store.put(light(names))
        store.wait_dispatched()
        queues = store.light_queues
        for group in ("g1", "g2"):
            assert queues.commit_consumer_offset(group, "%LMQ%consumed", 1, now[0])
        assert queues.commit_consumer_offset("g1", "%LMQ%backlog", 1, now[0])
        assert queues.commit_consumer_offset("g2", "%LMQ%backlog", 0, now[0])  # one group still behind
        now[0] += 59_000
        assert queues.commit_consumer_offset("g1", "%LMQ%recent", 1, now[0])  # consumed, but active lately
        assert queues.expire_idle(now[0]) == []  # nothing idle for the whole time yet
        now[0] += 2_000
        assert queues.expire_idle(now[0]) == ["%LMQ%consumed"]
        assert store.max_offset("%LMQ%consumed", 0) == 0 and store.get("%LMQ%consumed", 0, 0).messages == []
        assert queues.consumer_offset("g1", "%LMQ%consumed") is None
        for kept in names[1:]:
            assert store.max_offset(kept, 0) == 1 and len(store.get(kept, 0, 0).messages) == 1
        assert queues.consumer_offset("g2", "%LMQ%backlog") == 0
        # the name comes back as a new queue from offset 0, and is live again
        store.put(light(["%LMQ%consumed"], body=b"again"))
        store.wait_dispatched()
        assert [bytes(m.body) for m in store.get("%LMQ%consumed", 0, 0).messages] == [b"again"]
        now[0] += 120_000
        assert queues.commit_consumer_offset("g2", "%LMQ%backlog", 1, now[0])  # the last group catches up
        now[0] += 61_000
        assert sorted(queues.expire_idle(now[0])) == ["%LMQ%backlog", "%LMQ%recent"]
        # a queue nobody consumed keeps its messages while the log holds them
        assert store.max_offset("%LMQ%unread", 0) == 1 and store.max_offset("%LMQ%consumed", 0) == 1
        assert queues.count() == 2


def test_offsets_follow_the_names_as_rocketmq_writes_them(tmp_path):
    now = [1_000]
    with MessageStore(tmp_path, config("kv", clock=lambda: now[0])) as store:
        first = store.put(light(["%LMQ%a", "plain-name", "%LMQ%b", "%LMQ%a"]))
        now[0] = 2_000
        store.put(light(["%LMQ%b"], topic="%RETRY%group"))  # retry records are not multi-dispatched
        store.put(light(["%LMQ%b"], sysflag=0x4))  # a prepared transaction message: its commit record is
        now[0] = 3_000
        second = store.put(light(["%LMQ%b"]))
        assert store.wait_dispatched()
        record = store.read_record(first.commit_log_offset)
        assert record.properties[OFFSETS] == "0,,0,0"  # a name without %LMQ% gets an empty entry
        assert [u.commit_log_offset for u in store.read_units("%LMQ%b", 0, 0, 10)] == [first.commit_log_offset, second.commit_log_offset]
        assert store.max_offset("%LMQ%a", 0) == 1  # a name given twice gets one offset
        assert store.offset_for_timestamp("%LMQ%b", 0, 2_000) == 1
        assert store.offset_for_timestamp("%LMQ%b", 0, 2_000, upper=True) == 0
        assert store.offset_for_timestamp("%LMQ%b", 0, 3_000) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_dispatch_reads_the_names_as_the_record_codec_does(tmp_path, backend):
    """Dispatch takes the names and offsets from the record's properties as the codec decodes
    them: a property whose name ends with the real one's names no light queue."""
    with MessageStore(tmp_path, config(backend)) as store:
        lookalikes = {"X" + MULTI: "%LMQ%b", "Y" + OFFSETS: "7"}
        put = store.put(Message(topic="parent", body=b"m", properties={MULTI: "%LMQ%a"} | lookalikes))
        store.put(Message(topic="parent", body=b"n", properties=lookalikes))
        assert store.wait_dispatched()
        assert store.read_record(put.commit_log_offset).properties[OFFSETS] == "0"
        assert [u.commit_log_offset for u in store.read_units("%LMQ%a", 0, 0, 10)] == [put.commit_log_offset]
        assert store.max_offset("%LMQ%b", 0) == 0


def test_tables_ahead_of_a_shortened_log_are_rebuilt_from_it(tmp_path, caplog):
    """The log lost its last record (only a machine crash under async flush does that) after
    the tables took its units: the tables are rebuilt from the log, without its units."""
    with MessageStore(tmp_path, config("kv")) as store:
        kept = [store.put(light(["%LMQ%a", "%LMQ%b"], body=b"%d" % i)) for i in range(3)]
        lost = store.put(light(["%LMQ%a", "%LMQ%c"], body=b"lost"))
    segment = tmp_path / "commitlog" / f"{0:020d}"
    with open(segment, "r+b") as f:
        f.seek(lost.commit_log_offset)
        f.write(bytes(lost.size))
    with MessageStore(tmp_path, config("kv")) as store:
        assert "rebuilding them from the log" in caplog.text
        assert store.commit_log.write_position == lost.commit_log_offset
        assert [u.commit_log_offset for u in store.read_units("%LMQ%a", 0, 0, 10)] == [r.commit_log_offset for r in kept]
        assert store.max_offset("%LMQ%b", 0) == 3 and store.max_offset("%LMQ%c", 0) == 0
        assert store.assigned_offset("%LMQ%a", 0) == 3


def test_expiry_runs_resume_where_the_last_stopped(tmp_path):
    now = [1_000_000]
    cfg = config("kv", clock=lambda: now[0], light_queue_idle_expiry_ms=1_000, maintenance_interval_ms=3_600_000)
    with MessageStore(tmp_path, cfg) as store:
        names = [f"%LMQ%q{i}" for i in range(5)]
        store.put(light(names))
        store.wait_dispatched()
        queues = store.light_queues
        for name in names:
            queues.commit_consumer_offset("g", name, 1, now[0])
        now[0] += 5_000
        runs = [queues.expire_idle(now[0], scan_limit=2) for _ in range(3)]
        assert [len(run) for run in runs] == [2, 2, 1] and sorted(name for run in runs for name in run) == names
        assert queues.count() == 0


DISK_FULL_CHILD = textwrap.dedent(
    """
    import resource, signal, sys
    from tidemq.store import *
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    store = MessageStore(sys.argv[1], StoreConfig(segment_size=65536, dispatch_workers=0))
    message = lambda: Message(topic="t", body=b"z" * 500, properties={"INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%b"})
    store.put(message())
    store.wait_dispatched()
    # the disk refuses to grow any file past 64 KiB - 1: the next segment cannot be made
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (65535, hard))
    try:
        store.put_batch([message() for _ in range(300)])
    except StoreIOError as exc:
        print("stored", 1 + exc.stored, flush=True)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # room again: dispatch goes on
    store.wait_dispatched()
    print("offsets", store.assigned_offset("%LMQ%a", 0), store.max_offset("%LMQ%a", 0), store.max_offset("%LMQ%b", 0), flush=True)
    """
)


def test_a_batch_cut_short_by_the_disk_gives_back_its_light_queue_offsets(tmp_path):
    child = subprocess.run([sys.executable, "-c", DISK_FULL_CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120, check=True)
    lines = dict(line.split(" ", 1) for line in child.stdout.splitlines())
    stored = int(lines["stored"])
    assert 1 < stored < 301, child.stderr
    # every offset handed out belongs to a stored message: no gap for the next one to leave
    assert lines["offsets"].split() == [str(stored)] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_offsets_go_before_the_whole_record_crc_which_stays_valid(tmp_path, backend):
    from tidemq.store import record
    from tidemq.store.recovery.check import check

    with MessageStore(tmp_path, config(backend)) as store:
        message = light(["%LMQ%a", "%LMQ%b"], body=b"fan-out")
        message.properties[OFFSETS] = "41"  # the producer's own: replaced
        put = store.put(message)
        store.wait_dispatched()
        raw = bytes(store.commit_log.view(put.commit_log_offset, put.size))
        assert raw.endswith(b"\x02__CRC32#\x01" + raw[-11:-1] + b"\x02") and raw.count(b"__CRC32#") == 1
        assert type(record.decode(raw, 0, base_offset=put.commit_log_offset)) is record.Record  # its CRC holds
        assert store.get("%LMQ%b", 0, 0).messages[0].properties[OFFSETS] == "0,0"
    assert check(tmp_path).sound
