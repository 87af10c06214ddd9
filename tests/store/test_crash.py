"""Crash tests: a child appends under sync flush and is killed with SIGKILL at random points.

After reopening: every put that returned success is there with its queue offset and body, the
ConsumeQueues match the CommitLog exactly, and nothing past the last valid record is visible.
"""

import random
import textwrap

import killed_child

from tidemq.store import MessageStore, StoreConfig
from tidemq.store.recovery.check import check

CHILD = textwrap.dedent(
    """
    import sys, threading
    from tidemq.store import *

    store = MessageStore(sys.argv[1], StoreConfig(segment_size=32768, consume_queue_units=64, flush="sync"))
    seed = int(sys.argv[2])
    lock = threading.Lock()

    def body(qid, qoff):
        return (b"%d:%d:" % (qid, qoff)) * (1 + (qid * 7 + qoff) % 40)

    def putter(qid):
        qoff = store.assigned_offset("crash", qid)
        while True:
            # each queue has one putter, so its offsets are known before the put
            r = store.put(Message(topic="crash", body=body(qid, qoff), queue_id=qid))
            assert r.queue_offset == qoff
            with lock:
                sys.stdout.write("ok %d %d %d\\n" % (qid, qoff, r.commit_log_offset))
                sys.stdout.flush()
            qoff += 1

    print("ready", flush=True)
    for qid in range(4):
        threading.Thread(target=putter, args=(qid,), daemon=True).start()
    threading.Event().wait()
    """
)


def body(qid, qoff):
    return (b"%d:%d:" % (qid, qoff)) * (1 + (qid * 7 + qoff) % 40)


def parse_ack(line):
    """"ok qid qoff offset" -> ((qid, qoff), offset)"""
    parts = line.split()
    if len(parts) != 4 or parts[0] != "ok":
        return None
    return (int(parts[1]), int(parts[2])), int(parts[3])


def run_and_kill(path, seed, acks_before_kill):
    return killed_child.run_and_kill(CHILD, [str(path), str(seed)], acks_before_kill, parse_ack, path.parent / f"child-{seed}.err")


def test_sigkill_during_sync_appends_loses_nothing_acknowledged(tmp_path):
    rng = random.Random(20261122)
    all_acked = {}
    store_dir = tmp_path / "store"
    for round_ in range(5):
        acked = run_and_kill(store_dir, round_, rng.randint(20, 400))
        all_acked.update(acked)
        with MessageStore(store_dir, StoreConfig(flush="sync")) as store:
            assert store.recovery.abnormal
            assert store.wait_dispatched()
            for (qid, qoff), offset in all_acked.items():
                rec = store.read_record(offset)
                assert rec is not None and (rec.queue_id, rec.queue_offset) == (qid, qoff)
                assert bytes(rec.body) == body(qid, qoff)
            for qid in range(4):
                got = store.get("crash", qid, 0, 100_000).messages
                # the queue is exactly the contiguous run of records in the log, nothing more
                assert [m.queue_offset for m in got] == list(range(len(got)))
                assert all(bytes(m.body) == body(qid, m.queue_offset) for m in got)
                acked_here = [o for (q, o) in all_acked if q == qid]
                assert len(got) >= (max(acked_here) + 1 if acked_here else 0)
                assert store.assigned_offset("crash", qid) == len(got)
            # nothing past the last valid record: the log ends where the scan ended
            assert store.commit_log.write_position == store.recovery.end
        report = check(store_dir)
        assert report.sound, report.problems
        assert report.units == report.records
