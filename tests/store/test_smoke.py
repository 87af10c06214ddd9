from tidemq.store import Message, MessageStore, StoreConfig


def test_put_get_reopen(tmp_path):
    cfg = StoreConfig(segment_size=64 * 1024, consume_queue_units=100)
    with MessageStore(tmp_path, cfg) as store:
        results = [store.put(Message(topic="t", body=b"m%d" % i, queue_id=i % 2)) for i in range(500)]
        assert [r.queue_offset for r in results[:4]] == [0, 0, 1, 1]
        assert store.wait_dispatched()
        got = store.get("t", 1, 10, 5)
        assert [bytes(m.body) for m in got.messages] == [b"m%d" % (2 * q + 1) for q in range(10, 15)]
    with MessageStore(tmp_path, cfg) as store:
        assert store.max_offset("t", 0) == 250
        assert store.put(Message(topic="t", body=b"x", queue_id=0)).queue_offset == 250
