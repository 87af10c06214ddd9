"""The append path compiled (`_append.c`: the encoder's common case and the append loop) and in
Python: the same bytes, results and failures."""

import itertools
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.store import Message, MessageStore, StoreConfig, message_encoder, message_store, record
from tidemq.store.check import check


def test_the_compiled_append_loop_is_built():
    # `optional` in pyproject.toml: an install without a C compiler runs the Python loop alone
    assert message_store._write_records is not None, "tidemq/store/_append.c was not compiled at install"
    assert message_encoder._prepare_messages is not None


def python_only(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(message_store, "_write_records", None)
    patch.setattr(message_encoder, "_prepare_messages", None)


def _append(directory: Path, batches, store_host, compiled: bool, segment_size: int):
    clock = iter(range(1_700_000_000_000, 1_800_000_000_000, 7)).__next__
    config = StoreConfig(segment_size=segment_size, consume_queue_units=64, dispatch_workers=1, store_host=store_host, clock=clock)
    with pytest.MonkeyPatch.context() as patch:
        if not compiled:
            python_only(patch)
        with MessageStore(directory, config) as store:
            keys = store._encoder._unique_keys  # generated UNIQ_KEYs: the same in both stores
            keys.prefix, keys.counter = "7F0000010001ABCDEF01", itertools.count((1 << 48) - 5)  # the mask wraps
            results = [store.put_batch(batch) if len(batch) > 1 else [store.put(batch[0])] for batch in batches]
            assert store.wait_dispatched()
            end = store.commit_log.write_position
    segments = {p.name: p.read_bytes() for p in sorted((directory / "commitlog").iterdir())}
    return results, end, segments


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
@given(batches=st.lists(st.lists(messages, min_size=1, max_size=12), min_size=1, max_size=8), store_host=hosts)
def test_both_loops_write_the_same_log(batches, store_host):
    # messages without properties or keys, once their topic, tag and born host were seen, take
    # the compiled encoder's common case; the others go through the Python encoder either way
    with tempfile.TemporaryDirectory() as tmp:
        compiled = _append(Path(tmp) / "compiled", batches, store_host, True, 4096)  # 4 KiB: segments roll mid-batch
        python = _append(Path(tmp) / "python", batches, store_host, False, 4096)
        assert compiled[0] == python[0]
        assert compiled[1] == python[1]
        assert compiled[2] == python[2]
        assert check(Path(tmp) / "compiled").sound


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_field_the_record_cannot_hold_stops_the_loop_after_the_records_before_it(tmp_path, compiled, monkeypatch):
    # The encoder refuses such messages first; this is the loop's own guard, for callers that skip it.
    if not compiled:
        python_only(monkeypatch)
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 20, dispatch_workers=1)) as store:
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
    with MessageStore(tmp_path, StoreConfig(segment_size=1 << 20, dispatch_workers=1)) as store:
        store.put(Message(topic="n", body=b"first"))  # the topic is known: the encoder's fast path
        fields = dict(flag=np.int32(7), reconsume_times=np.int64(2), born_timestamp=np.int64(1234), prepared_transaction_offset=np.uint8(9))
        results = store.put_batch([Message(topic="n", body=b"np", **fields), Message(topic="fresh", body=b"np", **fields)])
        for result in results:
            got = store.read_record(result.commit_log_offset)
            assert (got.flag, got.reconsume_times, got.born_timestamp, got.prepared_transaction_offset) == (7, 2, 1234, 9)
