"""The append path compiled (`_append.c`: the encoder's common case, the append loop and the
single put) and in Python: the same bytes, results and failures."""

import itertools
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.store import Message, MessageStore, StoreConfig, message_store, record
from tidemq.store.errors import StoreClosedError
from tidemq.store.log import message_encoder
from tidemq.store.recovery.check import check


def test_the_compiled_append_loop_is_built():
    # `optional` in pyproject.toml: an install without a C compiler runs the Python loop alone
    assert message_store._write_records is not None, "tidemq/store/log/_append.c was not compiled at install"
    assert message_store._put_common is not None
    assert message_encoder._prepare_messages is not None


def python_only(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(message_store, "_write_records", None)
    patch.setattr(message_store, "_put_common", None)
    patch.setattr(message_encoder, "_prepare_messages", None)


def _append(directory: Path, batches, store_host, compiled: bool, segment_size: int, singly: bool = False, clock=None):
    clock = clock or iter(range(1_700_000_000_000, 1_800_000_000_000, 7)).__next__
    config = StoreConfig(segment_size=segment_size, consume_queue_units=64, dispatch_workers=0, store_host=store_host, clock=clock)
    with pytest.MonkeyPatch.context() as patch:
        if not compiled:
            python_only(patch)
        with MessageStore(directory, config) as store:
            keys = store._encoder._unique_keys  # generated UNIQ_KEYs: the same in both stores
            keys.prefix, keys.counter = "7F0000010001ABCDEF01", itertools.count((1 << 48) - 5)  # the mask wraps
            if singly:  # every message its own put (put_unflushed every third one), batches or not
                puts = itertools.cycle((store.put, store.put, lambda m: store.put_unflushed(m)[0]))
                results = [[next(puts)(m) for m in batch] for batch in batches]
            else:
                results = [store.put_batch(batch) if len(batch) > 1 else [store.put(batch[0])] for batch in batches]
            assert store.wait_dispatched()
            end = store.commit_log.write_position
            last_written = store._last_written
            queue_offsets = dict(store._queue_offsets)
    segments = {p.name: p.read_bytes() for p in sorted((directory / "commitlog").iterdir())}
    return results, end, segments, last_written, queue_offsets


hosts = st.sampled_from([("127.0.0.1", 0), ("10.1.2.3", 65535), ("::1", 4242), ("fe80::1:2", 1)])
messages = st.builds(
    Message,
    topic=st.sampled_from(["t", "orders", "T" * 200]),  # 200 characters: a v2 record
    body=st.binary(max_size=700),
    queue_id=st.integers(0, 3),
    tags=st.none() | st.text(alphabet="abcXYZ é", max_size=8),
    keys=st.none() | st.lists(st.text(alphabet="k0123", min_size=1, max_size=5), max_size=3),
    properties=st.dictionaries(st.sampled_from(["color", "a", "trace"]), st.text(alphabet="xyz09", max_size=6), max_size=2),
    flag=st.integers(-(1 << 31), (1 << 31) - 1),
    sysflag=st.sampled_from([0, record.FLAG_COMPRESSED, record.TRANSACTION_PREPARED, record.TRANSACTION_COMMIT, record.TRANSACTION_ROLLBACK]),
    born_timestamp=st.none() | st.integers(-(1 << 63), (1 << 63) - 1),
    born_host=hosts,
    reconsume_times=st.integers(0, 16),
    prepared_transaction_offset=st.integers(-(1 << 63), (1 << 63) - 1),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(messages, min_size=1, max_size=12), min_size=1, max_size=8), store_host=hosts, singly=st.booleans())
def test_both_loops_write_the_same_log(batches, store_host, singly):
    # messages without properties or keys, once their topic, tag and born host were seen, take
    # the compiled encoder's common case (or, put singly, the compiled single put); the others go
    # through the Python encoder either way
    with tempfile.TemporaryDirectory() as tmp:
        compiled = _append(Path(tmp) / "compiled", batches, store_host, True, 4096, singly)  # 4 KiB: segments roll mid-batch
        python = _append(Path(tmp) / "python", batches, store_host, False, 4096, singly)
        assert compiled[0] == python[0]
        assert compiled[1] == python[1]
        assert compiled[2] == python[2]
        assert compiled[3:] == python[3:]
        assert check(Path(tmp) / "compiled").sound


common_messages = st.builds(
    Message,
    topic=st.sampled_from(["t", "T" * 200]),
    body=st.binary(max_size=300),
    queue_id=st.integers(0, 2),
    tags=st.sampled_from([None, "a", "é"]),
    flag=st.integers(-(1 << 31), (1 << 31) - 1),
    sysflag=st.sampled_from([0, record.TRANSACTION_PREPARED, record.TRANSACTION_COMMIT, record.TRANSACTION_ROLLBACK]),
    born_timestamp=st.none() | st.integers(-(1 << 63), (1 << 63) - 1),
    born_host=st.sampled_from([("127.0.0.1", 0), ("::1", 4242)]),
    reconsume_times=st.integers(0, 16),
    prepared_transaction_offset=st.integers(-(1 << 63), (1 << 63) - 1),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(puts=st.lists(common_messages, min_size=20, max_size=80), store_host=hosts, segment_size=st.sampled_from([4096, 1 << 20]))
def test_the_compiled_single_put_writes_what_the_python_loop_does(puts, store_host, segment_size):
    # mostly messages the compiled single put takes: all but the first of each topic, tag and
    # born host, and those that would roll the segment or pass its warm pages
    with tempfile.TemporaryDirectory() as tmp:
        compiled = _append(Path(tmp) / "compiled", [puts], store_host, True, segment_size, singly=True)
        python = _append(Path(tmp) / "python", [puts], store_host, False, segment_size, singly=True)
        assert compiled == python
        assert check(Path(tmp) / "compiled").sound


def _counting_single_puts(patch: pytest.MonkeyPatch) -> list:
    taken = []

    def put_common(state, message, region):
        result = compiled(state, message, region)
        taken.append(result is not None)
        return result

    compiled = message_store._put_common
    patch.setattr(message_store, "_put_common", put_common)
    return taken


def test_common_single_puts_take_the_compiled_path(tmp_path, monkeypatch):
    taken = _counting_single_puts(monkeypatch)
    ticks = itertools.count(1_700_000_000_000)
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 20, dispatch_workers=0, clock=lambda: next(ticks))) as store:
        results = [store.put(Message(topic="c", body=b"%d" % i, queue_id=i % 2, tags="x")) for i in range(100)]
        assert taken[0] is False and all(taken[1:])  # the first one validates the topic and fills the caches
        assert [r.queue_offset for r in results] == [i // 2 for i in range(100)]
        assert [r.store_timestamp for r in results] == list(range(1_700_000_000_000, 1_700_000_000_100))  # one clock read each
        assert store._last_written == (store.commit_log.write_position, results[-1].store_timestamp)
        assert store.wait_dispatched()
        got = store.get("c", 1, 0, 100).messages
        assert [bytes(m.body) for m in got] == [b"%d" % i for i in range(1, 100, 2)]
        assert [m.properties[record.PROPERTY_TAGS] for m in got] == ["x"] * 50
        assert [m.properties[record.PROPERTY_UNIQ_KEY] for m in got] == [r.unique_key for r in results[1::2]]
        assert len({r.unique_key for r in results}) == 100


class TracedMessage(Message):
    pass


@pytest.mark.parametrize(
    "unusual",
    [
        Message(topic="unknown", body=b"x"),
        Message(topic="c", body=b"x", properties={"a": "b"}),
        Message(topic="c", body=b"x", keys=["k"]),
        Message(topic="c", body=b"x", tags="new tag"),
        Message(topic="c", body=b"x", born_host=("10.0.0.1", 1)),
        Message(topic="c", body=bytearray(b"x")),
        Message(topic="c", body=b"x", flag=True),
        TracedMessage(topic="c", body=b"x"),
        Message(topic="c", body=b"x" * (3 << 20)),  # past the 2 MiB of warm pages ahead
    ],
    ids=["topic", "properties", "keys", "tag", "born-host", "bytearray", "bool", "subclass", "big"],
)
def test_unusual_single_puts_go_the_ordinary_way(tmp_path, monkeypatch, unusual):
    taken = _counting_single_puts(monkeypatch)
    with MessageStore(tmp_path, StoreConfig(segment_size=16 << 20, dispatch_workers=0)) as store:
        store.put(Message(topic="c", body=b"first"))
        store.put(Message(topic="c", body=b"second"))
        before = store.commit_log.write_position
        result = store.put(unusual)
        assert taken[1:] == [True, unusual.flag is True]  # a bool is an int: the compiled put takes it
        assert result.commit_log_offset == before
        assert result.queue_offset == (0 if unusual.topic == "unknown" else 2)
        assert store.read_record(result.commit_log_offset).body == bytes(unusual.body)
    assert check(tmp_path).sound


def test_a_put_on_a_closed_store_is_refused(tmp_path):
    store = MessageStore(tmp_path, StoreConfig(segment_size=1 << 20, dispatch_workers=0))
    store.put(Message(topic="c", body=b"first"))
    store.close()
    with pytest.raises(StoreClosedError):
        store.put(Message(topic="c", body=b"second"))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_field_the_record_cannot_hold_stops_the_loop_after_the_records_before_it(tmp_path, compiled, monkeypatch):
    # The encoder refuses such messages first; this is the loop's own guard, for callers that skip it.
    if not compiled:
        python_only(monkeypatch)
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 20, dispatch_workers=0)) as store:
        good = Message(topic="t", body=b"good")
        bad = Message(topic="t", body=b"bad", flag=1 << 40)
        prepared = [store._encoder.prepare(good), store._encoder.prepare(Message(topic="t", body=b"bad"))]
        results = []
        start = store.commit_log.write_position
        with store._append_lock, pytest.raises(struct.error):
            store._append_locked([good, bad], prepared, 5, results)
        assert len(results) == 1 and results[0].commit_log_offset == start
        assert store.commit_log.write_position == start + results[0].size
        store._last_written = (store.commit_log.write_position, 5)
        assert store.put(Message(topic="t", body=b"next")).queue_offset == 1
        assert store.wait_dispatched()
        assert [bytes(m.body) for m in store.get("t", 0, 0, 10).messages] == [b"good", b"next"]
    assert check(tmp_path).sound


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_integer_like_fields_are_taken_as_integers(tmp_path, compiled, monkeypatch):
    import numpy as np

    if not compiled:
        python_only(monkeypatch)
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 20, dispatch_workers=0)) as store:
        store.put(Message(topic="n", body=b"first"))  # the topic is known: the encoder's fast path
        fields = dict(flag=np.int32(7), reconsume_times=np.int64(2), born_timestamp=np.int64(1234), prepared_transaction_offset=np.uint8(9))
        results = store.put_batch([Message(topic="n", body=b"np", **fields), Message(topic="fresh", body=b"np", **fields)])
        for result in results:
            got = store.read_record(result.commit_log_offset)
            assert (got.flag, got.reconsume_times, got.born_timestamp, got.prepared_transaction_offset) == (7, 2, 1234, 9)
