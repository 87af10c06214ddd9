"""MessageStore behaviour: appends, reads, bad input, flush policies, locking, retention."""

import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tidemq.store import (
    FlushTimeoutError,
    InvalidMessageError,
    Message,
    MessageStore,
    StoreConfig,
    StoreIOError,
    StoreLockedError,
    record,
)
from tidemq.store.recovery.check import check


def small(**kw):
    return StoreConfig(segment_size=kw.pop("segment_size", 8192), consume_queue_units=kw.pop("consume_queue_units", 16), **kw)


def test_records_never_span_segments(tmp_path):
    with MessageStore(tmp_path, small()) as store:
        results = [store.put(Message(topic="t", body=os.urandom(300), queue_id=0)) for i in range(100)]
        assert store.wait_dispatched()
        for r in results:
            assert r.commit_log_offset // 8192 == (r.commit_log_offset + r.size - 1) // 8192
        assert [r.queue_offset for r in results] == list(range(100))
        segments = store.commit_log.segments
        assert len(segments) > 3
        # every full segment ends with a blank filler of its remaining bytes
        first_in_second = results[[r.commit_log_offset >= 8192 for r in results].index(True) - 1]
        end = first_in_second.commit_log_offset + first_in_second.size
        assert isinstance(record.decode(segments[0].mm, end), record.EndOfSegment)
        got = store.get("t", 0, 0, 100).messages
        assert [bytes(m.body) for m in got] == [bytes(store.read_record(r.commit_log_offset).body) for r in results]
    assert check(tmp_path).sound


def test_message_fields_round_trip_through_the_store(tmp_path):
    clock = iter(range(1_000_000, 2_000_000)).__next__
    with MessageStore(tmp_path, small(clock=clock)) as store:
        r = store.put(
            Message(
                topic="orders",
                body=b"payload",
                queue_id=2,
                tags="paid",
                keys=["o-1", "o-2"],
                properties={"color": "blue", record.PROPERTY_UNIQ_KEY: "CLIENT-ID-1"},
                born_host=("192.168.0.9", 4242),
                born_timestamp=123,
                reconsume_times=3,
                flag=7,
            )
        )
        assert r.unique_key == "CLIENT-ID-1"
        assert r.msg_id == record.message_id(("127.0.0.1", 10911), r.commit_log_offset)
        store.wait_dispatched()
        (m,) = store.get("orders", 2, 0, 10).messages
        assert m.tags == "paid" and m.keys == ["o-1", "o-2"] and m.unique_key == "CLIENT-ID-1"
        assert m.properties["color"] == "blue" and m.born_host == ("192.168.0.9", 4242)
        assert (m.born_timestamp, m.store_timestamp, m.reconsume_times, m.flag) == (123, r.store_timestamp, 3, 7)
        (unit,) = store.read_units("orders", 2, 0, 10)
        assert unit.tags_code == record.java_string_hash("paid")
        second = store.put(Message(topic="orders", body=b"x", queue_id=2))
        assert len(second.unique_key) == 32 and second.unique_key != r.unique_key


@pytest.mark.parametrize(
    "message, fragment",
    [
        (Message(topic="", body=b"x"), "topic"),
        (Message(topic="t" * 256, body=b"x"), "at most 255"),
        (Message(topic="a/b", body=b"x"), "'/'"),
        (Message(topic="t", body=b"x", queue_id=-1), "queue id"),
        (Message(topic="t", body=b"x", queue_id=70000), "queue id"),
        (Message(topic="t", body=b"x" * (4 * 1024 * 1024 + 1)), "maximum"),
        (Message(topic="t", body="text"), "bytes"),
        (Message(topic="t", body=b"x", properties={"big": "v" * 40000}), "properties"),
        (Message(topic="t", body=b"x", properties={"bad\x01": "v"}), "separator"),
        (Message(topic="t", body=b"x", tags="a\x02b"), "separator"),
        (Message(topic="t", body=b"x", born_host=("not-an-ip", 1)), "encode"),
        (Message(topic="t", body=b"x", flag=1 << 31), "flag .* 32-bit"),
        (Message(topic="t", body=b"x", sysflag=-(1 << 31) - 1), "sysflag .* 32-bit"),
        (Message(topic="t", body=b"x", reconsume_times=1.5), "reconsume_times .* 32-bit"),
        (Message(topic="t", body=b"x", prepared_transaction_offset=1 << 63), "prepared_transaction_offset .* 64-bit"),
        (Message(topic="t", body=b"x", born_timestamp="now"), "born_timestamp .* 64-bit"),
    ],
)
def test_bad_input_is_refused_and_consumes_no_offset(tmp_path, message, fragment):
    with MessageStore(tmp_path, StoreConfig(segment_size=16 << 20)) as store:
        store.put(Message(topic="t", body=b"first"))
        with pytest.raises(InvalidMessageError, match=fragment):
            store.put(message)
        before = store.commit_log.write_position
        assert store.put(Message(topic="t", body=b"next")).queue_offset == 1
        assert store.commit_log.read_record(before).queue_offset == 1  # the refused message left no bytes
        store.put(Message(topic="t", body=b"x"))
        store.wait_dispatched()
        assert [bytes(m.body) for m in store.get("t", 0, 0, 10).messages] == [b"first", b"next", b"x"]


def test_prepared_transaction_messages_get_no_queue_entry(tmp_path):
    with MessageStore(tmp_path, small()) as store:
        store.put(Message(topic="t", body=b"a"))
        half = store.put(Message(topic="t", body=b"half", sysflag=record.TRANSACTION_PREPARED))
        assert half.queue_offset == 0
        assert store.put(Message(topic="t", body=b"b")).queue_offset == 1
        store.wait_dispatched()
        assert [bytes(m.body) for m in store.get("t", 0, 0, 10).messages] == [b"a", b"b"]
        assert bytes(store.read_record(half.commit_log_offset).body) == b"half"


def test_second_opener_gets_a_clear_error(tmp_path):
    with MessageStore(tmp_path, small()):
        with pytest.raises(StoreLockedError, match="in use by another process"):
            MessageStore(tmp_path, small())
        child = subprocess.run(
            [sys.executable, "-c", f"from tidemq.store import *; MessageStore({str(tmp_path)!r})"],
            capture_output=True,
            text=True,
        )
        assert child.returncode != 0 and "in use by another process" in child.stderr


def test_listeners_hear_of_committed_entries(tmp_path):
    heard = []
    done = threading.Event()

    def listener(changes):
        heard.append(dict(changes))
        if sum(v for c in heard for v in c.values()) and changes.get(("b", 1)) == 2:
            done.set()

    with MessageStore(tmp_path, small()) as store:
        store.subscribe(listener)
        store.put(Message(topic="a", body=b"1"))
        store.put(Message(topic="b", body=b"2", queue_id=1))
        store.put(Message(topic="b", body=b"3", queue_id=1))
        assert done.wait(5)
    merged = {}
    for c in heard:
        merged.update(c)
    assert merged == {("a", 0): 1, ("b", 1): 2}


def test_sync_flush_group_commit_shares_fsyncs(tmp_path):
    with MessageStore(tmp_path, small(segment_size=1 << 20, flush="sync")) as store:
        barrier = threading.Barrier(16)
        results = []

        def putter(i):
            barrier.wait()
            for _ in range(20):
                results.append(store.put(Message(topic="t", body=b"x" * 64, queue_id=i % 4)))

        threads = [threading.Thread(target=putter, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 320
        # each put returned only after an fsync covered it
        assert max(r.commit_log_offset + r.size for r in results) <= store.group_commit.flushed
        assert store.group_commit.fsyncs < 320
        assert store.wait_dispatched()
        assert sum(store.max_offset("t", q) for q in range(4)) == 320


def test_a_blocking_put_on_a_disk_that_will_not_flush_fails_after_the_timeout(tmp_path):
    """The putter's own lock is never released by an fsync: it times out, says why, and is no
    longer counted as waiting (the flusher would otherwise wait for it to come back)."""
    store = MessageStore(tmp_path, small(segment_size=1 << 20, flush="sync", sync_flush_timeout_ms=200))

    def failing_flush():
        raise OSError(5, "Input/output error")

    store.commit_log.flush = failing_flush
    try:
        with pytest.raises(FlushTimeoutError, match="Input/output error"):
            store.put(Message(topic="t", body=b"lost?"))
        assert store.group_commit.waiting == 0 and not store.group_commit._waiters
    finally:
        del store.commit_log.flush
        store.close()


def test_blocking_puts_waiting_when_the_flusher_stops_fail_instead_of_hanging(tmp_path):
    store = MessageStore(tmp_path, small(segment_size=1 << 20, flush="sync", sync_flush_timeout_ms=60_000))

    def failing_flush():
        raise OSError(28, "No space left on device")

    store.commit_log.flush = failing_flush
    errors = []

    def putter():
        try:
            store.put(Message(topic="t", body=b"pending"))
        except FlushTimeoutError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=putter) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        # every putter blocked, and the flusher has failed at least once (the error they are told)
        while (store.group_commit.waiting < 4 or store.group_commit.error is None) and time.monotonic() < deadline:
            time.sleep(0.001)
        store.group_commit.stop()  # as closing does
        for t in threads:
            t.join(10)
        assert len(errors) == 4 and all("No space left" in str(e) for e in errors)
        with pytest.raises(FlushTimeoutError):  # and a wait begun after it stopped fails at once
            store.put(Message(topic="t", body=b"later"))
    finally:
        del store.commit_log.flush
        store.close()


def test_sync_flush_callbacks(tmp_path):
    with MessageStore(tmp_path, small(segment_size=1 << 20, flush="sync")) as store:
        durable = []
        done = threading.Event()

        def on_durable(result, error):
            assert error is None
            assert store.group_commit.flushed >= result.commit_log_offset + result.size
            durable.append(result.queue_offset)
            if len(durable) == 200:
                done.set()

        for _ in range(200):
            store.put(Message(topic="t", body=b"y"), on_durable=on_durable)
        assert done.wait(10)
        assert sorted(durable) == list(range(200))
        assert store.group_commit.fsyncs < 200


def test_a_flush_request_that_lost_the_race_to_an_fsync_does_not_silence_the_next(tmp_path):
    """await_flush looks at `flushed` before taking the group commit's lock; an fsync may cover
    the bytes in between.  Such a request must not leave its listener registered with nothing to
    flush, or the listener's next request (finding it registered) never wakes the flusher."""

    class Listener:
        def __init__(self):
            self.told = threading.Event()
            self.positions = []

        def flushed(self, position, stopping):
            self.positions.append(position)
            self.told.set()

    with MessageStore(tmp_path, small(segment_size=1 << 20, flush="sync")) as store:
        group_commit = store.group_commit
        listener = Listener()
        first = store.put(Message(topic="t", body=b"durable"))  # returns once flushed
        first_end = first.commit_log_offset + first.size

        def flusher_asleep():  # waiting for work (a Condition's waiters: CPython's threading internals)
            deadline = time.monotonic() + 10
            while not group_commit._work._waiters and time.monotonic() < deadline:
                time.sleep(0.001)

        flusher_asleep()
        # the lost race, replayed: the request arrives after the fsync that covered it
        assert group_commit.request(first_end, listener) is True
        flusher_asleep()
        assert not listener.told.is_set()
        second, second_end = store.put_unflushed(Message(topic="t", body=b"next"))
        assert store.await_flush(second_end, listener) is False
        assert listener.told.wait(10), "the flusher was never woken for the second request"
        assert listener.positions[-1] >= second_end == group_commit.flushed

def test_sync_flush_dispatches_only_flushed_bytes(tmp_path):
    with MessageStore(tmp_path, small(flush="sync")) as store:
        store.put(Message(topic="t", body=b"a"))
        store.wait_dispatched()
        assert store.max_offset("t", 0) == 1
        assert store.confirmed_offset == store.commit_log.flushed_position


def test_retention_deletes_old_segments_with_an_injected_clock(tmp_path):
    now = [1_000_000_000]
    cfg = small(clock=lambda: now[0], retention_hours=1)
    with MessageStore(tmp_path, cfg) as store:
        for i in range(60):
            store.put(Message(topic="t", body=os.urandom(400)))
        now[0] += 2 * 3600 * 1000  # two hours later
        fresh = [store.put(Message(topic="t", body=os.urandom(400))) for _ in range(30)]
        store.wait_dispatched()
        before = len(store.commit_log.segments)
        removed = store.delete_expired_segments()
        assert removed > 0 and len(store.commit_log.segments) == before - removed
        minimum = store.min_offset("t", 0)
        assert 0 < minimum <= fresh[0].queue_offset
        assert store.get("t", 0, 0, 1).messages[0].queue_offset == minimum
        assert [m.queue_offset for m in store.get("t", 0, fresh[0].queue_offset, 100).messages] == [r.queue_offset for r in fresh]
        # nothing newer than the retention time is deleted
        assert store.delete_expired_segments() == 0
    with MessageStore(tmp_path, cfg) as store:
        assert store.min_offset("t", 0) == minimum and store.max_offset("t", 0) == 90


DISK_FULL_CHILD = textwrap.dedent(
    """
    import resource, signal, sys
    from tidemq.store import *
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    store = MessageStore(sys.argv[1], StoreConfig(segment_size=65536, consume_queue_units=1024))
    store.put(Message(topic="t", body=b"z" * 500))  # the first segment and queue file exist now
    store.wait_dispatched()
    # from here on the disk refuses to grow any file past 64 KiB - 1: the next segment cannot be made
    resource.setrlimit(resource.RLIMIT_FSIZE, (65535, 65535))
    ok = 1
    try:
        while True:
            store.put(Message(topic="t", body=b"z" * 500))
            ok += 1
    except StoreIOError as exc:
        print("refused", ok, exc, flush=True)
    try:
        store.put(Message(topic="t", body=b"z" * 500))
    except StoreIOError:
        print("still refused", flush=True)
    store.wait_dispatched()
    print("max", store.max_offset("t", 0), flush=True)
    """
)


def test_disk_full_is_an_error_and_the_store_stays_consistent(tmp_path):
    child = subprocess.run([sys.executable, "-c", DISK_FULL_CHILD, str(tmp_path)], capture_output=True, text=True, timeout=60)
    lines = child.stdout.splitlines()
    assert lines[0].startswith("refused"), child.stderr
    stored = int(lines[0].split()[1])
    assert "append failed, nothing stored" in lines[0]
    assert lines[1] == "still refused"
    assert lines[2] == f"max {stored}"
    with MessageStore(tmp_path, StoreConfig()) as store:
        assert store.max_offset("t", 0) == stored
        assert store.put(Message(topic="t", body=b"after")).queue_offset == stored
    assert check(tmp_path).sound


def test_put_batch_is_ordered_and_all_or_nothing_on_bad_input(tmp_path):
    with MessageStore(tmp_path, small(segment_size=4096)) as store:
        batch = [Message(topic="b", body=b"%d" % i * 50, queue_id=i % 2) for i in range(40)]
        results = store.put_batch(batch)
        assert [r.queue_offset for r in results] == [i // 2 for i in range(40)]
        assert [r.commit_log_offset for r in results] == sorted(r.commit_log_offset for r in results)
        assert len({r.commit_log_offset // 4096 for r in results}) > 1  # the batch rolled segments
        assert len({r.store_timestamp for r in results}) == 1
        before = store.commit_log.write_position
        with pytest.raises(InvalidMessageError):
            store.put_batch([Message(topic="b", body=b"ok"), Message(topic="", body=b"bad")])
        with pytest.raises(InvalidMessageError, match="flag"):  # a field that does not fit its record field
            store.put_batch([Message(topic="b", body=b"ok"), Message(topic="b", body=b"bad", flag=1 << 40)])
        assert store.commit_log.write_position == before
        assert store.put(Message(topic="b", body=b"next")).queue_offset == 20
        store.wait_dispatched()
        got = store.get("b", 1, 0, 100).messages
        assert [bytes(m.body) for m in got] == [b"%d" % i * 50 for i in range(1, 40, 2)]


def test_put_batch_durable_callback_once_under_sync_flush(tmp_path):
    with MessageStore(tmp_path, small(segment_size=1 << 20, flush="sync")) as store:
        calls = []
        done = threading.Event()

        def on_durable(results, error):
            calls.append((len(results), error))
            done.set()

        store.put_batch([Message(topic="b", body=b"x") for _ in range(10)], on_durable=on_durable)
        assert done.wait(5)
        assert calls == [(10, None)]
        assert store.group_commit.flushed >= store.commit_log.write_position


def exited(pid: int) -> bool:
    """Whether the child process `pid` has exited (reaped already, or a zombie now reaped)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_close_on_a_disk_that_will_not_flush_still_stops_everything(tmp_path, workers):
    store = MessageStore(tmp_path, small(segment_size=1 << 20, dispatch_workers=workers))
    for i in range(50):
        store.put(Message(topic="t", body=b"%d" % i))
    store.dispatcher.start_workers()
    worker_pids = store.dispatcher.worker_pids()
    assert len(worker_pids) == workers

    def failing_flush():
        raise OSError(5, "Input/output error")

    store.commit_log.flush = failing_flush  # the environment: the disk refuses every flush
    with pytest.raises(StoreIOError, match="closing the store: Input/output error"):
        store.close()
    assert not store._dispatch_thread.is_alive()
    for pid in worker_pids:
        assert exited(pid)  # the dispatch workers exited
    assert (tmp_path / "abort").exists()  # the next open recovers as after a crash
    store.close()  # a second close does nothing
    # the lock is released: the store opens again in this process, with what was written
    with MessageStore(tmp_path, small(segment_size=1 << 20, dispatch_workers=workers)) as again:
        assert again.recovery.abnormal
        assert again.max_offset("t", 0) == 50
        assert again.get("t", 0, 49, 1).messages[0].body == b"49"
    assert check(tmp_path).sound


MANY_QUEUES_CHILD = textwrap.dedent(
    """
    import resource, sys
    # a hard limit of 300 open files, which no process below can raise
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))
    from tidemq.store import *
    directory, workers = sys.argv[1], int(sys.argv[2])
    config = StoreConfig(segment_size=1 << 20, consume_queue_units=64, dispatch_workers=workers)
    with MessageStore(directory, config) as store:
        for i in range(1200):  # 600 queues, two messages each
            store.put(Message(topic=f"t{i % 3}", body=b"m%d" % i, queue_id=i % 600 // 3))
        print("dispatched", store.wait_dispatched(60), flush=True)
        print("offsets", sorted({store.max_offset(f"t{t}", q) for t in range(3) for q in range(200)}), flush=True)
        print("bodies", all(store.get("t1", 199, 0).messages[k].body == b"m%d" % (598 + 600 * k) for k in (0, 1)), flush=True)
    """
)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_more_queues_than_open_files_allowed(tmp_path, workers):
    """Every mapped queue file holds an open file; a store with more queues than the open-file
    limit keeps only a budget of them mapped (workers too) and dispatches every one."""
    child = subprocess.run([sys.executable, "-c", MANY_QUEUES_CHILD, str(tmp_path), str(workers)],
                           capture_output=True, text=True, timeout=120)
    assert child.stdout.splitlines() == ["dispatched True", "offsets [2]", "bodies True"], child.stderr[-2000:]
    with MessageStore(tmp_path, small(segment_size=1 << 20, consume_queue_units=64)) as store:
        assert all(store.max_offset(f"t{t}", q) == 2 for t in range(3) for q in range(200))
    assert check(tmp_path).sound


def test_queue_file_mappings_past_the_budget_are_dropped_and_made_again(tmp_path):
    """Past the budget the oldest mapping is dropped; the queue maps its file again when used,
    and nothing written through the dropped mapping is lost."""
    from tidemq.store.queues import consume_queue

    mappings = consume_queue.MAPPINGS
    saved = mappings.budget
    mappings.budget = len(mappings) + 8
    try:
        with MessageStore(tmp_path, small(segment_size=1 << 20, consume_queue_units=64, dispatch_workers=0)) as store:
            for round_ in range(3):
                for q in range(40):
                    store.put(Message(topic="many", body=b"%d-%d" % (q, round_), queue_id=q, tags="r%d" % round_))
                assert store.wait_dispatched()
                assert len(mappings) <= mappings.budget
            for q in range(40):
                got = store.get("many", q, 0)
                assert [m.body for m in got.messages] == [b"%d-%d" % (q, r) for r in range(3)]
        with MessageStore(tmp_path, small(segment_size=1 << 20, consume_queue_units=64, dispatch_workers=0)) as store:
            assert all(store.max_offset("many", q) == 3 for q in range(40))
    finally:
        mappings.budget = saved
    assert check(tmp_path).sound
