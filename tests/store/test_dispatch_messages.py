"""Parallel dispatch's messages and pipes: what the coordinator and its workers send each other
(pickled cheaply, framed, read through a buffer)."""

from __future__ import annotations

import os
import pickle

import numpy as np

from tidemq.store.batch_builder import (
    BatchResult,
    BatchTask,
    IndexAppend,
    IndexAppended,
    QueueRuns,
    UnitsHandover,
    UnitsWritten,
    _Channel,
)
from tidemq.store.consume_queue import UNIT_DTYPE


def _same(a, b) -> bool:
    """Equal field by field, arrays by dtype and values."""
    if type(a) is not type(b):
        return False
    if type(a) is np.ndarray:
        return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    if hasattr(type(a), "__slots__") and hasattr(a, "__dataclass_fields__"):
        return all(_same(getattr(a, name), getattr(b, name)) for name in a.__slots__)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_every_message_comes_back_equal_through_pickle():
    runs = QueueRuns(["a", "b"], np.array([0, 1, 1], np.int32), np.array([3, 0, -1], np.int32), np.array([7, 0, 2**40], np.int64),
                     np.array([2, 1, 5], np.int64), {1: [9, 12]})
    handover = UnitsHandover(4, ["a"], np.array([0], np.int32), np.array([3], np.int32), np.array([7], np.int64),
                             np.array([2], np.int64), np.array([7, 9], np.int64),
                             np.array([(10, 20, 30), (40, 50, -60)], dtype=UNIT_DTYPE).tobytes())
    messages = [
        BatchTask(4, "/x/00000000000000000000", 0, 1 << 20, 100, 4000),
        BatchResult(4, 100, 4000, None, 12, 1_700_000_000_123, runs, np.array([5, -6], np.int32), np.array([100, 300], np.int64),
                    np.array([1, 2], np.int64), 0, [(1, pickle.dumps(handover, protocol=pickle.HIGHEST_PROTOCOL))]),
        BatchResult(5, 4000, 4000, "damaged", 0, 0, QueueRuns.empty(), np.zeros(0, np.int32), np.zeros(0, np.int64),
                    np.zeros(0, np.int64)),
        handover,
        UnitsHandover(4, ["a"], np.array([0], np.int32), np.array([3], np.int32), np.array([7], np.int64), np.array([2], np.int64),
                      None, b""),
        UnitsWritten(4),
        UnitsWritten(4, "worker failed"),
        IndexAppend(4, "/x/index", 100),
        IndexAppend(4, None, 0),
        IndexAppended(4, 10, 2, 1_700_000_000_124, 1_700_000_000_120, None),
    ]
    for message in messages:
        back = pickle.loads(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        assert _same(back, message), message
    result = pickle.loads(pickle.dumps(messages[1], protocol=pickle.HIGHEST_PROTOCOL))
    assert _same(pickle.loads(result.handovers[0][1]), handover)
    assert result.queues.extras == {1: [9, 12]}


def test_a_channel_reads_every_whole_message_at_once_and_keeps_a_partial_one():
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    sender, receiver = _Channel(b_r, a_w), _Channel(a_r, b_w)
    try:
        assert not receiver.poll()
        for n in range(3):
            sender.send(("message", n))
        assert receiver.poll()
        assert receiver.take() == [("message", 0), ("message", 1), ("message", 2)]
        assert not receiver.poll()
        # half a message: nothing whole to take yet, the rest completes it
        data = pickle.dumps(("big", b"z" * 5000), protocol=pickle.HIGHEST_PROTOCOL)
        framed = len(data).to_bytes(4, "big") + data
        os.write(a_w, framed[:3000])
        assert receiver.take() == []
        os.write(a_w, framed[3000:])
        sender.send("after")
        assert receiver.take() == [("big", b"z" * 5000), "after"]
        # a message larger than the buffer, sent in pieces while the receiver reads
        big = b"q" * (3 << 20)
        data = pickle.dumps(big, protocol=pickle.HIGHEST_PROTOCOL)
        framed = len(data).to_bytes(4, "big") + data
        got = []
        for at in range(0, len(framed), 60_000):
            os.write(a_w, framed[at : at + 60_000])
            got += receiver.take()
        assert got == [big]
        # the end of the pipe: the whole messages before it, then EOFError
        sender.send("last")
        os.close(a_w)
        sender.write_fd = -1
        assert receiver.take() == ["last"]
        try:
            receiver.take()
        except EOFError:
            pass
        else:
            raise AssertionError("no EOFError at the end of the pipe")
    finally:
        sender.close()
        receiver.close()
