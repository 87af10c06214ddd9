"""SIGKILL while messages are multi-dispatched to light queues, then reopen: every light queue is
exactly the units the log's records name (their INNER_MULTI_QUEUE_OFFSET), contiguous from 0,
nothing lost and nothing twice, and every acknowledged put is in each of its light queues."""

import random
import textwrap

import killed_child

from tidemq.store import Message, MessageStore, StoreConfig

LIGHT_QUEUES = 40

CHILD = textwrap.dedent(
    """
    import random, sys, threading
    from tidemq.store import Message, MessageStore, StoreConfig

    store = MessageStore(sys.argv[1], StoreConfig(segment_size=1 << 20, flush=sys.argv[3], dispatch_workers=1))
    lock = threading.Lock()

    def putter(seed):
        rng = random.Random(seed)
        while True:
            names = sorted({"%%LMQ%%q%d" % rng.randrange(LIGHT_QUEUES) for _ in range(rng.randint(1, 12))})
            r = store.put(Message(topic="parent", body=b"x" * rng.randint(1, 300), queue_id=seed % 4,
                                  properties={"INNER_MULTI_DISPATCH": ",".join(names)}))
            with lock:
                sys.stdout.write("ok %d %s\\n" % (r.commit_log_offset, ",".join(names)))
                sys.stdout.flush()

    print("ready", flush=True)
    for seed in range(3):
        threading.Thread(target=putter, args=(int(sys.argv[2]) * 10 + seed,), daemon=True).start()
    threading.Event().wait()
    """
).replace("LIGHT_QUEUES", str(LIGHT_QUEUES))


def parse_ack(line):
    """"ok offset name,name..." -> (offset, names)"""
    parts = line.split()
    if len(parts) != 3 or parts[0] != "ok":
        return None
    return int(parts[1]), parts[2].split(",")


def run_and_kill(path, seed, flush, acks_before_kill):
    errors = path.parent / f"child-{seed}.err"
    return killed_child.run_and_kill(CHILD, [str(path), str(seed), flush], acks_before_kill, parse_ack, errors)


def expected_light_queues(store):
    """name -> {offset: commit-log offset}, from the records of the log."""
    expected = {}
    for queue_id in range(4):
        for rec in store.get("parent", queue_id, 0, 1_000_000).messages:
            names = rec.properties["INNER_MULTI_DISPATCH"].split(",")
            offsets = rec.properties["INNER_MULTI_QUEUE_OFFSET"].split(",")
            for name, offset in zip(names, offsets):
                slots = expected.setdefault(name, {})
                assert int(offset) not in slots, f"{name} offset {offset} given twice"
                slots[int(offset)] = rec.commit_log_offset
    return expected


def test_sigkill_during_multi_dispatch_then_reopen_rebuilds_light_queues_exactly(tmp_path):
    rng = random.Random(20261128)
    store_dir = tmp_path / "store"
    acked_all = {}
    for round_, flush in enumerate(["sync", "async"]):
        acked_all.update(run_and_kill(store_dir, round_, flush, rng.randint(50, 400)))
        with MessageStore(store_dir, StoreConfig(segment_size=1 << 20, flush="sync", dispatch_workers=0)) as store:
            assert store.recovery.abnormal
            assert store.wait_dispatched()
            expected = expected_light_queues(store)
            for index in range(LIGHT_QUEUES):
                name = f"%LMQ%q{index}"
                slots = expected.get(name, {})
                units = store.read_units(name, 0, 0, 1_000_000)
                assert {u.queue_offset: u.commit_log_offset for u in units} == slots
                assert [u.queue_offset for u in units] == list(range(len(slots)))
                assert store.max_offset(name, 0) == store.assigned_offset(name, 0) == len(slots)
            for offset, names in acked_all.items():
                for name in names:
                    assert offset in expected[name].values()
            # appends go on from where each light queue ends
            result = store.put(Message(topic="parent", body=b"after", properties={"INNER_MULTI_DISPATCH": "%LMQ%q0"}))
            store.wait_dispatched()
            assert store.read_units("%LMQ%q0", 0, len(expected.get("%LMQ%q0", {})), 1)[0].commit_log_offset == result.commit_log_offset
